"""Ranks submit the same tensors in different orders (async), then wait:
the coordinator must agree on an order and nobody may deadlock."""

import random

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
report({"failures": failures, "digest": digest(outs)})
basics.shutdown()
