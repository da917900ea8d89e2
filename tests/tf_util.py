"""What the TensorFlow-level tests share: whether TF and tfring's op library
are there, and the environment that keeps each spawned TF rank quiet, on one
CPU device, with few threads and a deadline on every collective."""

import importlib.util
import os

RANK_ENV = {"TF_CPP_MIN_LOG_LEVEL": "2", "TF_NUM_INTRAOP_THREADS": "1",
            "TF_NUM_INTEROP_THREADS": "2", "CUDA_VISIBLE_DEVICES": "",
            "TFRING_TIMEOUT": "180", "KERAS_BACKEND": "tensorflow"}
JOB_TIMEOUT = 240


def have_modules(*modules):
    return all(importlib.util.find_spec(m) is not None for m in modules)


def have_ops():
    """True when tfring is importable and its TF op library was built."""
    spec = importlib.util.find_spec("tfring")
    return spec is not None and os.path.exists(
        os.path.join(os.path.dirname(spec.origin), "_tfring_ops.so"))


def tf_available(*extra_modules):
    return have_modules("tensorflow", *extra_modules) and have_ops()
