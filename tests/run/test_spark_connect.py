"""tfring.spark.run through Spark Connect: a client session with no
SparkContext, whose barrier stage is a DataFrame's mapInArrow(barrier=True).

The test starts a Spark Connect server (pyspark ships its jar and
SparkConnectServer class) with a local[2] master, and runs client scripts
in processes of their own (a process that holds a classic SparkContext, as
this pytest process may (tests/spark_util.py), runs jobs through that
instead): tfring.spark.run's jobs, a failing one included, and the
estimator's fit, whose training runs through them. Spark Connect's Python
client needs grpcio-status, googleapis-common-protos and zstandard
(pyspark[connect]); where the environment lacks them, the test installs
them from PyPI into a folder of its own for the clients, or skips saying
why. Slow: about two minutes.
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

# The estimator's fit over Connect: the DataFrame goes to the store through
# the server, and training runs through tfring.spark.run's Connect stage.
FIT_CLIENT = r'''
import json, sys
import keras
import numpy as np
from pyspark.sql import SparkSession

from tfring.spark.common.backend import SparkBackend
from tfring.spark.common.store import Store
from tfring.spark.keras import KerasEstimator

spark = SparkSession.builder.remote(sys.argv[1]).getOrCreate()
rng = np.random.default_rng(0)
rows = [(float(a), float(b), float(2 * a - b)) for a, b in rng.standard_normal((64, 2))]
df = spark.createDataFrame(rows, "x0 double, x1 double, y double")
inputs = [keras.Input((1,), name="x0"), keras.Input((1,), name="x1")]
model = keras.Model(inputs, keras.layers.Dense(1)(keras.layers.Concatenate()(inputs)))
est = KerasEstimator(backend=SparkBackend(num_proc=2), store=Store.create(sys.argv[2]),
                     model=model, optimizer=keras.optimizers.SGD(0.1), loss="mse",
                     feature_cols=["x0", "x1"], label_cols=["y"], batch_size=8, epochs=2,
                     verbose=0)
fitted = est.fit(df)
weights = [np.asarray(w).tolist() for w in fitted.getModel().get_weights()]
print("REPORT " + json.dumps({"history": fitted.getHistory(), "weights": weights}))
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


def _client(text, args, client_path, tmp_path, timeout=420):
    """Runs a client script; returns its REPORT."""
    script = tmp_path / "client.py"
    script.write_text(text)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        client_path + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    r = subprocess.run([sys.executable, "-W", "ignore", str(script)] + args,
                       capture_output=True, text=True, timeout=timeout, env=env)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("REPORT ")]
    assert r.returncode == 0 and lines, (r.stdout + r.stderr)[-4000:]
    return json.loads(lines[0][len("REPORT "):])


def test_run_through_spark_connect(connect_url, client_path, tmp_path):
    rep = _client(CLIENT, [connect_url], client_path, tmp_path)
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


def test_estimator_fit_through_spark_connect(connect_url, client_path, tmp_path):
    import numpy as np

    rep = _client(FIT_CLIENT, [connect_url, str(tmp_path / "store")], client_path, tmp_path)
    loss = rep["history"]["loss"]
    assert len(loss) == 2 and np.isfinite(loss).all(), rep["history"]
    weights = np.concatenate([np.ravel(w) for w in rep["weights"]])
    assert weights.size == 3 and np.isfinite(weights).all(), weights  # Dense(1) on 2 inputs
