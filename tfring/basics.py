"""Process-level API: init, shutdown and the job's topology."""

import atexit
import os

from tfring import _bootstrap, _core, _horovod_env


_joins = 0  # init attempts in this process


def init(comm=None):
    """Joins the job. Reads the launcher's environment (tfring-run, mpirun,
    srun, else TF_CONFIG); a process started without a launcher is a job of
    size 1. `comm` may be an mpi4py communicator to run on instead of
    MPI_COMM_WORLD. HOROVOD_* tunables are read as their TFRING_* ones."""
    global _joins
    if _core.is_initialized():
        return
    # Before anything reads TFRING_*: the bootstrap (TFRING_TIMEOUT,
    # TFRING_IFACE) and the core's configuration at _core.init.
    notices = _horovod_env.apply()
    if os.environ.get("TFRING_ELASTIC_ID"):
        # Started by the elastic driver (tfring-run --min-np...): the driver
        # assigns rank and size per membership epoch (tfring/elastic/_worker.py).
        from tfring.elastic import _worker

        _worker.join()
        return
    try:
        rank, size, store, secret = _bootstrap.discover(comm)
    except Exception:
        _horovod_env.emit(notices)
        raise
    if rank == 0:
        _horovod_env.emit(notices)
    if store is not None and _joins:
        # After a shutdown the store still holds the last join's keys (job
        # id, addresses, barriers): every rank's n-th join uses keys of its
        # own.
        store = _core.PrefixStore(f"join{_joins}/", store)
    _joins += 1
    _core.init(rank, size, store, secret)


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
