"""tfring-run --check-build: horovodrun's table of what this tfring was
built with and can load here (frameworks, controllers, tensor operations)."""

import os


def check_build(out, mpirun):
    """Writes horovodrun --check-build's table for this tfring; mpirun is
    the mpirun that --mpi would use (tfring.run.mpi.find_mpirun()), or None."""
    def mark(ok):
        return "X" if ok else " "

    rows = {}
    try:
        from importlib import metadata
        version = metadata.version("tfring")
    except Exception:  # noqa: BLE001 - a source tree without metadata
        version = "(source tree)"
    try:
        from tfring import _core
        core, core_why = True, ""
    except ImportError as e:
        _core, core, core_why = None, False, str(e)
    rows["core"] = (core, f"tfring._core{'' if core else ': ' + core_why}")
    tf_ok, tf_why = _tf_ops()
    rows["tf"] = (tf_ok, tf_why)
    mpi_ok, mpi_why = _mpi4py()
    cuda_ok = bool(core and _core.cuda_built())
    if core and cuda_ok:
        why = _core.cuda_unavailable_reason().split(";")[0]
        cuda_why = ("CUDA, GPU usable" if _core.cuda_available()
                    else f"CUDA built; no GPU here ({why})")
    else:
        cuda_why = "CUDA: not built"
    nccl_ok, nccl_why = False, "NCCL: core not loaded"
    if core:
        info = _core.nccl_info()
        nccl_ok = bool(info.get("loaded"))
        nccl_why = (f"NCCL {info.get('version')} from {info.get('path')}" if nccl_ok
                    else f"NCCL: not loadable ({info.get('error', '').split(' (')[0]}; "
                    "TFRING_NCCL_LIB names it)")
    isa = _core.kernels.isa() if core else "?"
    out.write(f"tfring v{version}:\n\n"
              "Available Frameworks:\n"
              f"    [{mark(tf_ok)}] TensorFlow     {tf_why}\n\n"
              "Available Controllers:\n"
              f"    [{mark(core)}] tfring-run     the built-in store and ring "
              f"(no MPI needed)\n"
              f"    [{mark(mpi_ok)}] MPI            {mpi_why}"
              f"{'; mpirun ' + mpirun if mpirun else '; no mpirun found'}\n\n"
              "Available Tensor Operations:\n"
              f"    [{mark(core)}] CPU            shared memory and TCP rings, "
              f"{isa} kernels\n"
              f"    [{mark(cuda_ok)}] CUDA           {cuda_why}\n"
              f"    [{mark(nccl_ok)}] NCCL           {nccl_why}\n")
    out.flush()


def _tf_ops():
    """Whether TensorFlow imports and loads tfring's op library."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    gpu_note = ""
    try:
        with open(os.path.join(here, "_tfring_ops.so.gpu")) as f:
            gpu_note = f.read().strip()
    except OSError:
        pass
    try:
        from tfring import _op_lib  # noqa: F401  (loads the library)
        import tensorflow as tf
    except Exception as e:  # noqa: BLE001 - reported in the table
        return False, f"op library not loadable: {str(e).splitlines()[0][:200]}"
    gpu = f"; GPU kernels: {gpu_note.split(':')[0]}" if gpu_note else ""
    return True, f"TensorFlow {tf.__version__}, op library _tfring_ops.so loads{gpu}"


def _mpi4py():
    try:
        import mpi4py
        mpi4py.rc.initialize = False  # only asks for the library's version
        mpi4py.rc.finalize = False
        from mpi4py import MPI
        library = MPI.Get_library_version().split("\n")[0].split(",")[0].strip(" \0")
        return True, f"mpi4py {mpi4py.__version__} ({library})"
    except Exception as e:  # noqa: BLE001 - reported in the table
        return False, f"mpi4py not importable ({e})"
