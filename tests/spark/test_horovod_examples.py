"""Horovod's own Spark Keras estimator examples, run against tfring.

examples/spark/keras/keras_spark_mnist.py and
keras_spark_rossmann_estimator.py from Horovod's repository run unchanged
but for their imports (SUBSTITUTIONS below; in Rossmann also Keras 3's
``learning_rate=`` for the ``lr=`` Keras 3 removed), each as a script of
its own with a local Spark (``--master local[2]``), two training
processes, one epoch and small batches, on synthetic data of the real
format (horovod_data.py), since the machine may be offline. Each must
train, ``transform`` its test DataFrame and write what the script writes.

The scripts are not part of tfring's tree; the test reads them, in order,
from a Horovod source tree named by TFRING_HOROVOD_SRC, from a bare git
clone of Horovod named by TFRING_HOROVOD_GIT (default: the mirror at
/work/.mirror/horovod+horovod/repo, where present), or from Horovod's
sdist on PyPI if it ships them (0.28.1's does not); without any, it skips
saying so. Slow: a few minutes.
"""

import math
import os
import re
import subprocess
import sys
import tarfile

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # whatever pytest's import mode
import horovod_data  # noqa: E402

pytestmark = pytest.mark.slow

EXAMPLES = "examples/spark/keras"
DEFAULT_GIT = "/work/.mirror/horovod+horovod/repo"
SDIST = "horovod==0.28.1"

# Horovod import -> tfring import, a whole line each; every line listed for
# a script must occur in it (the test fails if Horovod's script changed).
SUBSTITUTIONS = {
    "keras_spark_mnist.py": [
        ("import horovod.spark.keras as hvd", "import tfring.spark.keras as hvd"),
        ("from horovod.spark.common.backend import SparkBackend",
         "from tfring.spark.common.backend import SparkBackend"),
        ("from horovod.spark.common.store import Store",
         "from tfring.spark.common.store import Store"),
    ],
    "keras_spark_rossmann_estimator.py": [
        ("import horovod.spark.keras as hvd", "import tfring.spark.keras as hvd"),
        ("from horovod.spark.common.backend import SparkBackend",
         "from tfring.spark.common.backend import SparkBackend"),
        ("from horovod.spark.common.store import Store",
         "from tfring.spark.common.store import Store"),
        ("from horovod.tensorflow.keras.callbacks import BestModelCheckpoint",
         "from tfring.keras.callbacks import BestModelCheckpoint"),
        # Keras 3 has no `lr` alias for an optimizer's learning rate.
        ("    opt = tf.keras.optimizers.Adam(lr=args.learning_rate, epsilon=1e-3)",
         "    opt = tf.keras.optimizers.Adam(learning_rate=args.learning_rate, epsilon=1e-3)"),
    ],
}

# Asctime, then the rank: how SparkBackend(prefix_output_with_timestamp=True)
# relays a training process's output (tfring.spark.run, as Horovod).
RELAYED = re.compile(r"^[A-Z][a-z]{2} [A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \d{4}"
                     r"\[[01]\]<stdout>:", re.MULTILINE)


def _from_tree(name):
    root = os.environ.get("TFRING_HOROVOD_SRC")
    path = os.path.join(root, EXAMPLES, name) if root else None
    if path and os.path.isfile(path):
        with open(path) as f:
            return f.read()
    return None


def _from_git(name):
    git_dir = os.environ.get("TFRING_HOROVOD_GIT", DEFAULT_GIT)
    if not os.path.isdir(git_dir):
        return None
    r = subprocess.run(["git", "--git-dir", git_dir, "show", f"HEAD:{EXAMPLES}/{name}"],
                       capture_output=True, text=True, timeout=60)
    return r.stdout if r.returncode == 0 else None


def _from_sdist(name, tmp):
    sdists = tmp / "sdist"
    if not sdists.exists():
        subprocess.run([sys.executable, "-m", "pip", "download", SDIST, "--no-deps",
                        "--no-binary", ":all:", "-q", "-d", str(sdists)],
                       capture_output=True, text=True, timeout=600)
    for tar in sdists.glob("*.tar.gz") if sdists.exists() else ():
        with tarfile.open(tar) as t:
            for member in t.getmembers():
                if member.name.endswith(f"/{EXAMPLES}/{name}"):
                    return t.extractfile(member).read().decode()
    return None


@pytest.fixture(scope="module")
def horovod_source(tmp_path_factory):
    """name -> the script's text, from the first place that has it."""
    tmp = tmp_path_factory.mktemp("horovod-src")

    def get(name):
        text = _from_tree(name) or _from_git(name) or _from_sdist(name, tmp)
        if text is None:
            pytest.skip(f"Horovod's {EXAMPLES}/{name} is not available: set "
                        "TFRING_HOROVOD_SRC to a Horovod source tree or TFRING_HOROVOD_GIT to "
                        f"a clone of its repository ({SDIST}'s sdist on PyPI lacks examples/)")
        return text
    return get


def _ported(text, name, tmp_path):
    lines = text.split("\n")
    for old, new in SUBSTITUTIONS[name]:
        hits = [i for i, line in enumerate(lines) if line == old]
        assert hits, f"Horovod's {name} no longer has the line {old!r}"
        for i in hits:
            lines[i] = new
    left = [ln for ln in lines if re.match(r"\s*(from|import) horovod\b", ln)]
    assert not left, f"imports of Horovod left in {name}: {left}"
    path = tmp_path / name
    path.write_text("\n".join(lines))
    return path


@pytest.fixture(scope="module")
def tensorboard_path(tmp_path_factory):
    """PYTHONPATH entries that give the MNIST example's TensorBoard callback
    its package (TensorFlow no longer requires it): none where it is
    installed, else a folder it is installed into from PyPI, or skips."""
    check = [sys.executable, "-c", "import tensorboard.summary"]
    if subprocess.run(check, capture_output=True).returncode == 0:
        return []
    target = tmp_path_factory.mktemp("tensorboard")
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target",
                        str(target), "tensorboard"], capture_output=True, text=True,
                       timeout=300)
    if r.returncode != 0 or subprocess.run(check, capture_output=True, env=dict(
            os.environ, PYTHONPATH=str(target))).returncode != 0:
        pytest.skip("keras_spark_mnist.py's TensorBoard callback needs the tensorboard "
                    "package, which could not be installed: "
                    + ((r.stderr or "").strip().splitlines() or ["import failed"])[-1])
    return [str(target)]


def _run(script, args, cwd, timeout, path=()):
    """Runs a ported example (``path``: PYTHONPATH entries to add, which
    Spark's Python workers inherit); returns its output, failing with its
    tail."""
    import pyspark
    from spark_util import _java_home

    home, why = _java_home(pyspark)
    if home is None:
        pytest.skip(f"Spark needs Java 17+: {why}")
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable,
               TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(
        list(path) + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    if home:
        env["JAVA_HOME"] = home
    log = cwd / "output.log"
    with open(log, "w") as out:
        try:
            r = subprocess.run([sys.executable, str(script), "--master", "local[2]",
                                "--num-proc", "2"] + args, cwd=cwd, env=env, stdout=out,
                               stderr=subprocess.STDOUT, timeout=timeout)
            code = r.returncode
        except subprocess.TimeoutExpired:
            code = f"no exit within {timeout}s"
    text = log.read_text(errors="replace")
    assert code == 0, f"{script.name}: {code}\n...\n" + "\n".join(text.splitlines()[-80:])
    return text


def test_keras_spark_mnist(horovod_source, tensorboard_path, tmp_path):
    script = _ported(horovod_source("keras_spark_mnist.py"), "keras_spark_mnist.py", tmp_path)
    data, work = tmp_path / "data", tmp_path / "work"
    data.mkdir()
    work.mkdir()
    horovod_data.write_mnist_libsvm(str(data / "mnist.bz2"))
    # Batches of 64 on 2 ranks: fewer steps than the TensorBoard callback's
    # profile_batch=5, so the example profiles nothing.
    out = _run(script, ["--batch-size", "64", "--epochs", "1", "--work-dir", str(work),
                        "--data-dir", str(data)], tmp_path, timeout=900, path=tensorboard_path)
    # Trained on two ranks (their output relayed with timestamps), then
    # transform()ed the held-out rows and scored them.
    assert RELAYED.search(out), out[-3000:]
    acc = [float(m) for m in re.findall(r"^Test accuracy: ([\d.eE+-]+)$", out, re.MULTILINE)]
    assert len(acc) == 1 and 0.0 <= acc[0] <= 1.0, out[-3000:]
    assert any(work.iterdir()), "the Store under --work-dir holds nothing"


def test_keras_spark_rossmann_estimator(horovod_source, tmp_path):
    name = "keras_spark_rossmann_estimator.py"
    script = _ported(horovod_source(name), name, tmp_path)
    data, work, results = tmp_path / "data", tmp_path / "work", tmp_path / "results"
    for d in (data, work, results):
        d.mkdir()
    ids = horovod_data.write_rossmann(str(data))
    submission, checkpoint = results / "submission.csv", results / "checkpoint"
    out = _run(script, ["--epochs", "1", "--batch-size", "32", "--data-dir", f"file://{data}",
                        "--work-dir", str(work), "--local-submission-csv", str(submission),
                        "--local-checkpoint-file", str(checkpoint)], tmp_path, timeout=1500)
    assert RELAYED.search(out), out[-3000:]
    best = re.findall(r"^Best RMSPE: ([\d.eE+-]+|nan|inf)$", out, re.MULTILINE)
    assert len(best) == 1, out[-3000:]
    assert checkpoint.exists(), "keras_model.save wrote nothing"
    # One prediction per test row, by Id, positive sales.
    rows = submission.read_text().strip().splitlines()
    assert rows[0] == "Id,Sales_pred", rows[:2]
    got = [line.split(",") for line in rows[1:]]
    assert [int(i) for i, _ in got] == ids
    sales = [float(v) for _, v in got]
    assert all(math.isfinite(v) and v > 0 for v in sales), sales[:10]
