"""The fast path's fusion hold (TFRING_CYCLE_TIME): tensors submitted one
at a time, while the engine runs rounds between them, still go as one
fused group; a rank that needs a result before it submits the rest still
gets it (the hold is bounded); a lone tensor is not held.

Modes:
  batch      each step, every rank submits 128 cached tensors one at a time
             (allreduce_async, tens of microseconds apart), then waits:
             reports the fused groups per step
  dependent  rank 1 waits for X before it submits Y, rank 0 submits both
             and goes on without waiting for a while; then a lone blocking
             allreduce
"""

import random
import sys
import time

import numpy as np

from common import digest, report

import tfring.basics as basics
from tfring import _core

mode = sys.argv[1]
basics.init()
rank, n = basics.rank(), basics.size()
failures, outs, groups = [], [], []


def groups_run():
    return sum(_core.allreduce_algorithm_counts().values())


def want(i, step):
    return np.full(100 + i, float(sum(r + i + step for r in range(n))), np.float32)


if mode == "batch":
    rng = random.Random(rank)
    for step in range(7):  # step 0 negotiates the names; then the fast path
        before = groups_run()
        hs = []
        for i in range(128):
            x = np.full(100 + i, float(rank + i + step), np.float32)
            hs.append(_core.allreduce_async(x, op="sum", name=f"hold.{i}"))
            pause = rng.uniform(10e-6, 40e-6)  # busy: sleep() overshoots by far more
            t = time.perf_counter()
            while time.perf_counter() - t < pause:
                pass
        for i, h in enumerate(hs):
            y = h.wait(60)
            if not np.array_equal(y, want(i, step)):
                failures.append(f"step {step} tensor {i}: {y[:3]}")
            outs.append(y)
        groups.append(groups_run() - before)
elif mode == "dependent":
    for step in range(3):
        x = np.full(100, float(rank + step), np.float32)
        y = np.full(101, float(rank + 1 + step), np.float32)
        if rank == 1:
            got_x = _core.allreduce(x, op="sum", name="dep.x")
            got_y = _core.allreduce(y, op="sum", name="dep.y")
        else:
            hx = _core.allreduce_async(x, op="sum", name="dep.x")
            hy = _core.allreduce_async(y, op="sum", name="dep.y")
            time.sleep(0.02)  # busy elsewhere, not waiting: its burst ends on its own
            got_x, got_y = hx.wait(60), hy.wait(60)
        for got, w in ((got_x, want(0, step)), (got_y, want(1, step))):
            if not np.array_equal(got, w):
                failures.append(f"step {step}: {got[:3]} != {w[:3]}")
            outs.append(got)
    t0 = time.perf_counter()
    lone = _core.allreduce(np.ones(10, np.float32), op="sum", name="lone")
    groups.append(time.perf_counter() - t0)
    if not (lone == n).all():
        failures.append(f"lone: {lone}")
report({"failures": failures, "digest": digest(outs), "groups": groups})
basics.shutdown()
