"""PowerSGD state in an elastic job (tfring.elastic.TensorFlowState and
TensorFlowKerasState with a Compression.powersgd compressor).

What the compressor holds, and where it may differ between ranks:

  * the step counters (warm-up is counted in steps): equal on every rank;
    committed with the state, rolled back by restore(), taken from rank 0
    by sync();
  * the warm-start Q's: equal on every rank (each is an allreduced mean);
  * the error buffers: each rank's own residual, never communicated.

sync() runs after every re-formation (and before the first training
call). When every rank holds state for the same gradients and the world
has the size it had at the last sync, rank 0's Q's are broadcast and each
rank keeps its error. Otherwise (a rank joined without state, or the world
changed size, so residuals belong to a different set of ranks) every rank
drops its errors and Q's: the next compressed step starts from zero error
and fresh Q's drawn alike on every rank from the shared step counter.
"""

import numpy as np

from tfring import _core, basics
from tfring.compression.powersgd import attached, is_powersgd


def find(compression=None, optimizer=None):
    """The PowerSGD compressor given, or the one a tfring optimizer uses."""
    if is_powersgd(compression):
        return compression
    if compression is not None:
        return None
    return attached(optimizer)


def _manifest(c):
    return len(c.groups), [(s.key[-1], tuple(s.shape)) for s in c.slots]


class ElasticPowerSGD:
    """Commit, rollback and sync of one compressor's state. The compressor
    is looked up when used, since RingAllreduceCallback gives a compiled
    model's optimizer its compression only when fit starts."""

    def __init__(self, compression=None, optimizer=None):
        self._compression = compression
        self._optimizer = optimizer
        self.committed = None
        self.synced_size = basics.size() if basics.is_initialized() else None

    @property
    def compressor(self):
        return find(self._compression, self._optimizer)

    def save(self):
        c = self.compressor
        if c is not None:
            self.committed = c.step_counts()

    def restore(self):
        c = self.compressor
        if c is not None and self.committed is not None:
            c.set_step_counts(self.committed)

    def sync(self, broadcast_object, broadcast_arrays):
        c = self.compressor
        if c is None:
            return
        mine = _manifest(c)
        theirs, counts = broadcast_object((mine, c.step_counts()))
        keep = int(mine == theirs and basics.size() == self.synced_size)
        if basics.size() > 1:
            keep = int(_core.allreduce(np.array([keep], np.int32), op="min",
                                       name="elastic.powersgd.keep")[0])
        c.set_step_counts(counts)
        if keep and c.slots:
            arrays = [np.asarray(g.q_ready.numpy()) for g in c.groups]
            arrays += [s.q.numpy() for s in c.slots]
            names = [f"powersgd.group{i}.q_ready" for i in range(len(c.groups))]
            names += [f"powersgd.{s.key[-1]}.q" for s in c.slots]
            values = broadcast_arrays(arrays, names)
            for g, v in zip(c.groups, values):
                g.q_ready.assign(bool(v))
            for s, v in zip(c.slots, values[len(c.groups):]):
                s.q.assign(v)
        elif not keep:
            c.reset()
        self.committed = list(counts)
        self.synced_size = basics.size()
