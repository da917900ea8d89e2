"""Ranks submit the same tensors in different orders (async), then wait:
the coordinator must agree on an order and nobody may deadlock. Then the
same names again for several steps (the steady-state fast path), each rank
submitting a different subset first and the rest after a pause."""

import random
import time

import numpy as np

from common import digest, report

import tfring.basics as basics
from tfring import _core

basics.init()
rank, n = basics.rank(), basics.size()
names = [f"t{i}" for i in range(40)]
order = list(range(len(names)))
random.Random(rank).shuffle(order)
handles = {}
for i in order:
    x = np.full(i * 7 + 1, float(rank + i), np.float32)
    handles[i] = (_core.allreduce_async(x, op="sum", name=names[i]), x)
failures = []
outs = []
for i in range(len(names)):
    y = handles[i][0].wait(60)
    want = np.full(i * 7 + 1, float(sum(r + i for r in range(n))), np.float32)
    if not np.array_equal(y, want):
        failures.append(f"{names[i]}: {y[:3]} != {want[:3]}")
    outs.append(y)

# Mixed collectives in flight together, in per-rank orders.
jobs = [("ag", lambda: _core.allgather_async(np.full((rank + 1,), rank, np.int64), name="mixed.ag")),
        ("bc", lambda: _core.broadcast_async(np.full(5, rank, np.int32), root=n - 1, name="mixed.bc")),
        ("rs", lambda: _core.reducescatter_async(np.ones((n * 2,), np.float64), name="mixed.rs"))]
random.Random(100 + rank).shuffle(jobs)
hs = {k: f() for k, f in jobs}
ag, bc, rs = hs["ag"].wait(60), hs["bc"].wait(60), hs["rs"].wait(60)
if not np.array_equal(ag, np.concatenate([np.full(r + 1, r) for r in range(n)])):
    failures.append(f"mixed allgather {ag}")
if not (bc == n - 1).all():
    failures.append(f"mixed broadcast {bc}")
if not (rs == n).all() or rs.shape != (2,):
    failures.append(f"mixed reducescatter {rs}")

# Steady state: the names are cached now. In each step every rank submits
# its own random subset first, pauses, then the rest, so rounds see
# different sets ready on different ranks.
rng = random.Random(7 + rank)
for step in range(6):
    order = list(range(len(names)))
    rng.shuffle(order)
    cut = rng.randrange(len(order) + 1)
    hs = {}
    for k, i in enumerate(order):
        if k == cut:
            time.sleep(rng.uniform(0, 0.02))
        x = np.full(i * 7 + 1, float(rank * step + i), np.float32)
        hs[i] = _core.allreduce_async(x, op="sum", name=names[i])
    # Allgather with a first dimension that differs per rank, and changes on
    # one rank at step 3 (a changed shape leaves the fast path).
    rows = rank + 1 + (step >= 3 and rank == 0)
    g = _core.allgather(np.full((rows, 2), step + rank, np.int64), name="steady.ag")
    want_g = np.concatenate([np.full((r + 1 + (step >= 3 and r == 0), 2), step + r)
                             for r in range(n)])
    if not np.array_equal(g, want_g):
        failures.append(f"step {step} allgather {g.tolist()}")
    for i in range(len(names)):
        y = hs[i].wait(60)
        want = np.full(i * 7 + 1, float(sum(r * step + i for r in range(n))), np.float32)
        if not np.array_equal(y, want):
            failures.append(f"step {step} {names[i]}: {y[:3]} != {want[:3]}")
        outs.append(y)
report({"failures": failures, "digest": digest(outs)})
basics.shutdown()
