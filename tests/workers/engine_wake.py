"""Who serves a collective when no caller drives it.

Blocking calls leave the engine thread asleep when they end. Then:
- an async collective this rank submits and never waits on must still
  finish (the engine thread serves it) while the rank sleeps;
- a collective the other ranks start while this rank sleeps completes once
  this rank joins it with a blocking call.
Results are checked against numpy float64."""

import time

import numpy as np

from common import report

import tfring.basics as basics
from tfring import _core

basics.init()
rank, n = basics.rank(), basics.size()
x = np.arange(1000, dtype=np.float32) + rank
want = np.sum([np.arange(1000, dtype=np.float64) + r for r in range(n)], axis=0)
out = {}

# Back-to-back blocking calls: the engine thread parks while they drive.
for i in range(200):
    y = _core.allreduce(x, op="sum", name="warm")
out["warm_ok"] = bool(np.array_equal(y.astype(np.float64), want))

# 1. Rank 0 submits and sleeps without waiting; the others block on it.
if rank == 0:
    h = _core.allreduce_async(x, op="sum", name="bg")
    t0 = time.monotonic()
    while not h.poll() and time.monotonic() - t0 < 20:
        time.sleep(0.01)
    out["bg_done_without_wait_s"] = time.monotonic() - t0 if h.poll() else None
    y = h.wait(5)
else:
    y = _core.allreduce(x, op="sum", name="bg")
out["bg_ok"] = bool(np.array_equal(y.astype(np.float64), want))

# 2. The last rank sleeps after a blocking call while the others start the
# next collective; it joins late.
_core.allreduce(x, op="sum", name="sync")
if rank == n - 1:
    time.sleep(0.5)
y = _core.allreduce(x, op="sum", name="late")
out["late_ok"] = bool(np.array_equal(y.astype(np.float64), want))

# 3. The same in the other order, many times: every rank's engine thread
# goes back to sleep between calls, whoever arrives last.
ok = True
for i in range(20):
    if rank == i % n:
        time.sleep(0.01)
    y = _core.allreduce(x, op="sum", name="turns")
    ok = ok and bool(np.array_equal(y.astype(np.float64), want))
out["turns_ok"] = ok
basics.shutdown()
report(out)
