"""Process-level API: init, shutdown and the job's topology."""

import atexit

from tfring import _bootstrap, _core


_joins = 0  # init attempts in this process


def init(comm=None):
    """Joins the job. Reads the launcher's environment (tfring-run, mpirun,
    srun); a process started without a launcher is a job of size 1. `comm`
    may be an mpi4py communicator to run on instead of MPI_COMM_WORLD."""
    global _joins
    if _core.is_initialized():
        return
    rank, size, store, secret = _bootstrap.discover(comm)
    if store is not None and _joins:
        # After a shutdown the store still holds the last join's keys (job
        # id, addresses, barriers): every rank's n-th join uses keys of its
        # own.
        store = _core.PrefixStore(f"join{_joins}/", store)
    _joins += 1
    _core.init(rank, size, store, secret)
    _load_tf_ops()


def _load_tf_ops():
    """Loads the TensorFlow op library now when TensorFlow is in use: XLA
    takes the ops' XLA kernels only if they are loaded before its first
    compilation, which tracing a jit_compile function starts."""
    import sys

    if "tensorflow" in sys.modules:
        try:
            import tfring.ops  # noqa: F401
        except ImportError:
            pass  # reported with its cause when the ops are first used


def shutdown():
    """Leaves the job. Outstanding collectives fail; init() may be called again."""
    _core.shutdown()


def is_initialized():
    return _core.is_initialized()


def _require():
    if not _core.is_initialized():
        raise ValueError("tfring has not been initialized; call tfring.init() first")


def size():
    _require()
    return _core.size()


def rank():
    _require()
    return _core.rank()


def local_rank():
    _require()
    return _core.local_rank()


def local_size():
    _require()
    return _core.local_size()


def cross_rank():
    _require()
    return _core.cross_rank()


def cross_size():
    _require()
    return _core.cross_size()


atexit.register(_core.shutdown)
