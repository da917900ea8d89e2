"""tfring.spark.run through Spark Connect: a client session with no
SparkContext, whose barrier stage is a DataFrame's mapInArrow(barrier=True).

The test starts a Spark Connect server (pyspark ships its jar and
SparkConnectServer class) with a local[2] master, and runs a client script
in a process of its own: a process that holds a classic SparkContext, as
this pytest process may (tests/spark_util.py), runs jobs through that
instead. Spark Connect's Python client needs grpcio-status,
googleapis-common-protos and zstandard (pyspark[connect]); where the
environment lacks them, the test installs them from PyPI into a folder of
its own for the client, or skips saying why. Slow: the server's start and
the client's jobs take a minute or so.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

pyspark = pytest.importorskip("pyspark", reason="pyspark is not installed (pip install pyspark)")

pytestmark = pytest.mark.slow

CONNECT_DEPS = ["grpcio-status", "googleapis-common-protos", "zstandard"]
CHECK = "import grpc, grpc_status, google.rpc.status_pb2, zstandard"

CLIENT = r'''
import io, json, os, sys, time
from pyspark.sql import SparkSession

import tfring.spark

spark = SparkSession.builder.remote(sys.argv[1]).getOrCreate()


def fn(n):
    import numpy as np
    from tfring import _core, basics

    basics.init()
    print(f"hello from {basics.rank()}")
    x = np.asarray(_core.allreduce(np.ones(n) * (basics.rank() + 1), name="connect"))
    return basics.rank(), basics.size(), x.tolist()


def bad():
    import numpy as np
    from tfring import _core, basics

    basics.init()
    if basics.rank() == 1:
        raise ValueError("planted in a Connect job")
    _core.allreduce(np.ones(2), name="never")


report = {"session": type(spark).__module__}
out = io.StringIO()
t0 = time.monotonic()
report["results"] = tfring.spark.run(fn, args=(3,), stdout=out, verbose=0)  # num_proc: local[2]
report["took"] = time.monotonic() - t0
report["stdout"] = out.getvalue()
t0 = time.monotonic()
try:
    tfring.spark.run(bad, num_proc=2, verbose=0)
except tfring.spark.SparkJobError as e:
    report["error"] = {"rank": e.rank, "partition": e.partition, "text": str(e),
                       "took": time.monotonic() - t0}
report["again"] = tfring.spark.run(fn, args=(2,), num_proc=2, verbose=0)
print("REPORT " + json.dumps(report))
'''


@pytest.fixture(scope="module")
def client_path(tmp_path_factory):
    """PYTHONPATH entries the client needs for Spark Connect, or skips."""
    if subprocess.run([sys.executable, "-c", CHECK], capture_output=True).returncode == 0:
        return []
    try:
        import grpc
    except ImportError:
        pytest.skip("Spark Connect's client needs grpcio (pip install pyspark[connect])")
    # grpcio-status must match the installed grpcio.
    deps = [f"grpcio-status=={grpc.__version__}"] + CONNECT_DEPS[1:]
    target = tmp_path_factory.mktemp("connect-deps")
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target",
                        str(target)] + deps, capture_output=True, text=True, timeout=300)
    env = dict(os.environ, PYTHONPATH=str(target))
    if r.returncode != 0 or subprocess.run([sys.executable, "-c", CHECK], env=env,
                                           capture_output=True).returncode != 0:
        pytest.skip("Spark Connect's client needs " + ", ".join(CONNECT_DEPS) + " (pip install "
                    "pyspark[connect]), which could not be installed: "
                    + ((r.stderr or "").strip().splitlines() or ["import failed"])[-1])
    return [str(target)]


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def connect_url(client_path, tmp_path_factory):
    from spark_util import _java_home

    home, why = _java_home(pyspark)
    if home is None:
        pytest.skip(f"Spark needs Java 17+: {why}")
    spark_home = os.path.dirname(pyspark.__file__)
    port = _free_port()
    env = dict(os.environ, SPARK_HOME=spark_home, PYSPARK_PYTHON=sys.executable,
               SPARK_CONNECT_MODE="0")
    if home:
        env["JAVA_HOME"] = home
    log = tmp_path_factory.mktemp("connect-server") / "server.log"
    with open(log, "w") as out:
        server = subprocess.Popen(
            [os.path.join(spark_home, "bin", "spark-submit"), "--class",
             "org.apache.spark.sql.connect.service.SparkConnectServer", "--master", "local[2]",
             "--driver-memory", "1g", "--conf", f"spark.connect.grpc.binding.port={port}",
             "--conf", "spark.ui.enabled=false", "--conf",
             "spark.driver.extraJavaOptions=-XX:TieredStopAtLevel=1"],
            stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while "Spark Connect server started" not in log.read_text(errors="replace"):
            assert server.poll() is None, "the Connect server exited:\n" + log.read_text()[-3000:]
            assert time.monotonic() < deadline, "no Connect server within 180 s:\n" + \
                log.read_text()[-3000:]
            time.sleep(0.5)
        yield f"sc://localhost:{port}"
    finally:
        os.killpg(server.pid, signal.SIGTERM)  # spark-submit's group: the server's JVM
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(30)


def test_run_through_spark_connect(connect_url, client_path, tmp_path):
    path = client_path
    script = tmp_path / "client.py"
    script.write_text(CLIENT)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        path + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    r = subprocess.run([sys.executable, "-W", "ignore", str(script), connect_url],
                       capture_output=True, text=True, timeout=420, env=env)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("REPORT ")]
    assert r.returncode == 0 and lines, (r.stdout + r.stderr)[-4000:]
    rep = json.loads(lines[0][len("REPORT "):])
    assert rep["session"].startswith("pyspark.sql.connect")  # no SparkContext
    # num_proc from the server's local[2] master; results in rank order.
    assert rep["results"] == [[0, 2, [3.0] * 3], [1, 2, [3.0] * 3]]
    assert sorted(rep["stdout"].splitlines()) == ["[0]<stdout>:hello from 0",
                                                  "[1]<stdout>:hello from 1"]
    assert rep["took"] < 120, rep["took"]
    err = rep["error"]
    assert err["rank"] == 1 and err["partition"] == 1, err
    assert "ValueError: planted in a Connect job" in err["text"]
    assert err["took"] < 60, err
    assert rep["again"] == [[0, 2, [3.0] * 2], [1, 2, [3.0] * 2]]
