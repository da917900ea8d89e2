"""Process-level API: init, shutdown, the job's topology, barrier, the
timeline, and what this build can do (Horovod's *_built / *_enabled)."""

import atexit
import os
import warnings

import numpy as np

from tfring import _bootstrap, _core, _horovod_env, _tunables
from tfring.process_sets import _process_set_arg


_joins = 0  # init attempts in this process


def init(comm=None, process_sets=None):
    """Joins the job. Reads the launcher's environment (tfring-run, mpirun,
    srun, else TF_CONFIG); a process started without a launcher is a job of
    size 1. `comm` may be an mpi4py communicator to run on instead of
    MPI_COMM_WORLD. HOROVOD_* tunables are read as their TFRING_* ones.
    `process_sets`: tfring.ProcessSet objects to create now, on every rank
    (see tfring.process_sets); "dynamic" is accepted, as in Horovod (sets
    can always be added later here)."""
    global _joins
    if _core.is_initialized():
        return
    # This init's configuration, before anything reads TFRING_*: the
    # bootstrap (TFRING_TIMEOUT, TFRING_IFACE) reads it through _tunables,
    # and the core gets it as init's config argument.
    config, notices = _horovod_env.read()
    _tunables.configure(config)
    if _tunables.is_set("TFRING_ELASTIC_ID"):
        # Started by the elastic driver (tfring-run --min-np...): the driver
        # assigns rank and size per membership epoch (tfring/elastic/_worker.py).
        from tfring.elastic import _worker

        _worker.join()
        _joined(process_sets)
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
    _core.init(rank, size, store, secret, config=_tunables.core_config())
    _joined(process_sets)


def _joined(process_sets):
    """What follows the core's init, however the job was joined."""
    _load_tf_ops()
    # ---- process sets (tfring/process_sets.py) ----
    from tfring import process_sets as _ps

    _ps._setup()
    if process_sets is not None and process_sets != "dynamic":
        for ps in process_sets:
            _ps.add_process_set(ps)


def _load_tf_ops():
    """Loads the TensorFlow op library now when TensorFlow is in use: XLA
    takes the ops' XLA kernels only if they are loaded before its first
    compilation, which tracing a jit_compile function starts."""
    import sys

    if "tensorflow" in sys.modules:
        try:
            from tfring import _op_lib  # noqa: F401
        except ImportError:
            pass  # reported with its cause when the ops are first used


def shutdown():
    """Leaves the job. Outstanding collectives fail; init() may be called again."""
    _core.shutdown()
    from tfring import process_sets as _ps

    _ps._reset()


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


def is_homogeneous():
    """True when every host runs the same number of ranks."""
    _require()
    return bool(_core.is_homogeneous())


def barrier(process_set=None):
    """Blocks until every rank (of `process_set`) has called barrier()."""
    _require()
    ps_id = _process_set_arg(process_set)
    # An allreduce finishes on a rank only after every rank has submitted it.
    _core.allreduce(np.zeros(1, np.int32), "sum", name="tfring.barrier",
                    process_set=ps_id)


def start_timeline(file_path, mark_cycles=False):
    """Starts writing the timeline (a Chrome trace: chrome://tracing or
    ui.perfetto.dev) to `file_path`, replacing one being written. Rank 0
    writes it, or, when the path contains "{rank}", every rank that calls
    this its own file; no other rank needs to take part. `mark_cycles` is
    accepted; engine cycles are not marked."""
    _require()
    if mark_cycles:
        warnings.warn("tfring: start_timeline(mark_cycles=True): engine "
                      "cycles are not marked in tfring's timeline",
                      stacklevel=2)
    _core.start_timeline(str(file_path))


def stop_timeline():
    """Stops the timeline and closes its file."""
    _require()
    _core.stop_timeline()


# What this build can do, in Horovod's words. tfring has its own transport
# (shared memory, TCP) and needs neither MPI nor Gloo; mpirun and srun only
# start its ranks.

def mpi_built():
    """False: tfring has no MPI code (it runs under mpirun; mpi4py may hand
    it a communicator at init, used only to exchange its store address)."""
    return False


def mpi_enabled():
    """False: no collective or control message goes through MPI."""
    return False


def mpi_threads_supported():
    """True: tfring never calls MPI from its own threads, so a script may use
    mpi4py alongside it whatever MPI's thread level is."""
    _require()
    return True


def gloo_built():
    """False: tfring's TCP and shared-memory links are its own, not Gloo."""
    return False


def gloo_enabled():
    """False (see gloo_built)."""
    return False


def cuda_built():
    """True when this build runs collectives on CUDA tensors."""
    return bool(_core.cuda_built()) and not _core.cuda_emulated()


def nccl_built():
    """The NCCL version code (e.g. 22703 for 2.27.3) when this build has CUDA
    support and NCCL loads (tfring loads libnccl at run time), else 0."""
    if not cuda_built():
        return 0
    info = _core.nccl_info()
    return int(info["version"]) if info["loaded"] else 0


def rocm_built():
    """False: no ROCm support."""
    return False


def ddl_built():
    """False: no IBM DDL support."""
    return False


def ccl_built():
    """False: no oneCCL support."""
    return False


atexit.register(_core.shutdown)
