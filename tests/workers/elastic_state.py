"""Elastic states outside the driver: sync from rank 0, restore to the last
commit, and the error for a state that differs between ranks."""

import numpy as np

from common import report

import tfring
from tfring.elastic.state import broadcast_arrays

tfring.init()
rank = tfring.rank()
out = {}

# sync(): rank 0's attributes reach every rank; restore() rolls back.
state = tfring.elastic.ObjectState(epoch=rank * 10, w=np.full(3, float(rank)))
state.sync()
out["synced"] = [state.epoch, state.w.tolist()]
state.epoch += 1
state.commit()
state.epoch += 5
state.restore()
out["restored"] = state.epoch

# A state whose tensors differ between ranks is refused, naming the tensor.
arrays = [np.zeros((4, 2), np.float32), np.zeros(8 if rank == 1 else 7, np.float32)]
try:
    broadcast_arrays(arrays, ["dense/kernel", "dense/bias"])
    out["mismatch"] = None
except ValueError as e:
    out["mismatch"] = str(e)
report(out)
tfring.shutdown()
