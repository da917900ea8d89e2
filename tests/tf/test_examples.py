"""Each TensorFlow example runs to completion under `tfring-run -np 2` with
short settings, and reports weights identical on every rank where it
checks them."""

import os
import subprocess
import sys

import pytest

from tf_util import have_modules, have_ops

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
EXAMPLES = os.path.join(ROOT, "examples")
JOB_TIMEOUT = 240
ENV = {"TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": "",
       "TFRING_TIMEOUT": "180", "KERAS_BACKEND": "tensorflow",
       "PYTHONUNBUFFERED": "1"}


pytestmark = pytest.mark.skipif(
    not (have_modules("tensorflow", "keras") and have_ops()),
    reason="TensorFlow, Keras or tfring's op library (_tfring_ops.so) missing")

CASES = {
    "keras_digits": (["--epochs", "2", "--batch-size", "32"],
                     "weights identical: True"),
    "graph_rewrite": (["--steps", "20", "--log-every", "10"],
                      "weights identical on every rank: True"),
    "custom_loop": (["--steps", "20", "--log-every", "10"],
                    "weights identical on all 2 ranks: True"),
    "synthetic_benchmark": (["--model", "small", "--image-size", "32",
                             "--batch-size", "8", "--num-warmup-batches", "1",
                             "--num-batches-per-iter", "2", "--num-iters", "2"],
                            "total img/s on 2 ranks"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_example_runs_on_two_ranks(name, tmp_path):
    args, expected = CASES[name]
    if name == "keras_digits" and not have_modules("sklearn"):
        pytest.skip("scikit-learn is not installed")
    # Run outside the checkout: `python -m` puts the working directory first
    # on sys.path, where the source tfring (without its built libraries)
    # would shadow the installed one.
    env = dict(os.environ)
    env.update(ENV)
    cmd = [sys.executable, "-m", "tfring.run", "-np", "2",
           "--timeout", str(JOB_TIMEOUT - 20),
           sys.executable, os.path.join(EXAMPLES, f"{name}.py"), *args]
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True,
                              check=False,
                              timeout=JOB_TIMEOUT, cwd=tmp_path)
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"{name} hung past {JOB_TIMEOUT} s:\n"
                             f"{(e.stdout or '')[-3000:]}") from e
    assert proc.returncode == 0, (
        f"{name} exited {proc.returncode}\nstdout:\n{proc.stdout[-3000:]}\n"
        f"stderr:\n{proc.stderr[-3000:]}")
    assert expected in proc.stdout, proc.stdout[-3000:]
