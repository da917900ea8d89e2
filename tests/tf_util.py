"""What the TensorFlow-level tests share: whether TF and tfring's op library
are there, the environment that keeps each spawned TF rank quiet, on one
CPU device, with few threads and a deadline on every collective, and how a
script of examples/ is run with a deadline."""

import importlib.util
import os
import subprocess
import sys

RANK_ENV = {"TF_CPP_MIN_LOG_LEVEL": "2", "TF_NUM_INTRAOP_THREADS": "1",
            "TF_NUM_INTEROP_THREADS": "2", "CUDA_VISIBLE_DEVICES": "",
            "TFRING_TIMEOUT": "180", "KERAS_BACKEND": "tensorflow"}
JOB_TIMEOUT = 240
EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")


def have_modules(*modules):
    return all(importlib.util.find_spec(m) is not None for m in modules)


def have_ops():
    """True when tfring is importable and its TF op library was built."""
    spec = importlib.util.find_spec("tfring")
    return spec is not None and os.path.exists(
        os.path.join(os.path.dirname(spec.origin), "_tfring_ops.so"))


def tf_available(*extra_modules):
    return have_modules("tensorflow", *extra_modules) and have_ops()


def run_example(script, args, cwd, env, timeout, np_=None):
    """Runs examples/SCRIPT with ARGS in CWD, under ``tfring-run -np NP``
    (whose own deadline is 20 s short of ``timeout``) when ``np_`` is given,
    and returns its stdout; fails the test naming the script if it runs past
    ``timeout`` or exits non-zero."""
    cmd = [sys.executable, os.path.join(EXAMPLES, script), *args]
    if np_ is not None:
        cmd = [sys.executable, "-m", "tfring.run", "-np", str(np_),
               "--timeout", str(timeout - 20), *cmd]
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True,
                              timeout=timeout, cwd=cwd, check=False)
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"{script} hung past {timeout} s:\n"
                             f"{(e.stdout or '')[-3000:]}") from e
    assert proc.returncode == 0, (
        f"{script} exited {proc.returncode}\nstdout:\n{proc.stdout[-4000:]}\n"
        f"stderr:\n{proc.stderr[-4000:]}")
    return proc.stdout
