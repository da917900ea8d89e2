"""Each TensorFlow example runs to completion under `tfring-run -np 2` with
short settings, and reports weights identical on every rank where it
checks them."""

import os

import pytest

from tf_util import have_modules, have_ops, run_example

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
    out = run_example(f"{name}.py", args, tmp_path, dict(os.environ, **ENV), JOB_TIMEOUT, np_=2)
    assert expected in out, out[-3000:]
