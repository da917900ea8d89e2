"""Loads tfring's TensorFlow op library (_tfring_ops.so) and reads what its
build recorded beside it (the TensorFlow version, XLA support). The
collectives built on it are in tfring/_collectives.py (raw ops) and
tfring/ops.py (the public API). This module imports nothing of tfring, so
init() can load the library (for XLA, see basics._load_tf_ops) without
pulling in the collectives."""

import os

import tensorflow as tf

LIB_FILE = "_tfring_ops.so"
_VERSION_FILE = LIB_FILE + ".tfversion"
_XLA_FILE = LIB_FILE + ".xla"


def _version_mismatch_message(built, installed):
    return (
        f"tfring's op library was built against TensorFlow {built} but "
        f"{installed} is installed; reinstall tfring: pip install "
        f"--no-build-isolation --force-reinstall --no-deps tfring "
        f"(or from a checkout: pip install --no-build-isolation "
        f"--force-reinstall --no-deps .)")


def check_version(built, installed):
    """Raises ImportError when the library's TensorFlow is not the one installed."""
    if built != installed:
        raise ImportError(_version_mismatch_message(built, installed))


def load_library():
    here = os.path.dirname(os.path.abspath(__file__))
    path = os.path.join(here, LIB_FILE)
    if not os.path.exists(path):
        raise ImportError(
            f"tfring was built without its TensorFlow op library ({path} is "
            f"missing): TensorFlow was not importable when tfring was built. "
            f"Install TensorFlow first, then reinstall tfring: pip install "
            f"--no-build-isolation --force-reinstall --no-deps tfring")
    try:
        with open(os.path.join(here, _VERSION_FILE)) as f:
            built = f.read().strip()
    except OSError:
        built = "an unknown version"
    # Checked before loading: a library built for another TensorFlow fails
    # with undefined symbols at best.
    check_version(built, tf.__version__)
    return tf.load_op_library(path)


def xla_build_state():
    """(built with XLA kernels?, why) from the build's _tfring_ops.so.xla."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), _XLA_FILE)
    try:
        with open(path) as f:
            state = f.read().strip()
    except OSError:
        return False, "this build predates tfring's XLA support"
    on, _, why = state.partition(": ")
    return on == "on", why


lib = load_library()
