"""The agreement round's vote (TFRING_VOTE_ALGO set by the test), core-only
ranks. Modes:

  steady  named allreduces submitted in a different order on every rank,
          step after step (the first pass negotiated, then the cached
          fast path), plus names used once (agreed in the vote); every
          result against a float64 reference; reports the last round's
          _core.last_vote_stats().
  late    rank LATE submits its tensors a second after every other rank:
          the others' rounds must wake it while it is idle.
  rider   one small allreduce at a time, steady, for each dtype and op
          (prescale and postscale too), against float64; reports how each
          one ran (_core.last_collective_stats) and the vote's stats.
  grow    more cached names than the host vote's shared-memory slots hold:
          reports the vote's algorithm after each batch.
  switch_idle  the host vote outgrows its slots through the rider's room
          (TFRING_VOTE_DATA of 64 KiB), and the first recdbl round is
          started by rank STARTER alone while every other rank idles with
          its tensor at the coordinator: only that round's bytes can wake
          them.

steady runs once per pass of TEST_PASSES (common.run_passes): one launch
checks several vote algorithms.
"""

import os
import sys
import time

import numpy as np

from common import report, run_passes

import tfring.basics as basics
from tfring import _core

mode = sys.argv[1]
if mode != "steady":
    basics.init()
    rank, n = basics.rank(), basics.size()
failures = []


def check(what, got, want):
    if not np.array_equal(np.asarray(got, np.float64), want):
        failures.append(f"{what}: got {np.asarray(got)[:4]} want {want[:4]}")


def value(r, i, step, count):
    return np.arange(count, dtype=np.float64) + (r + 1) * (i + 1) + step


def want(i, step, count):
    return sum(value(r, i, step, count) for r in range(n))


if mode == "rider":
    runs = []
    cases = [("float32", "sum", 1.0, 1.0), ("float64", "average", 1.0, 1.0),
             ("int32", "max", 1.0, 1.0), ("float32", "min", 1.0, 1.0),
             ("float16", "sum", 1.0, 1.0), ("float64", "product", 1.0, 1.0),
             ("float32", "sum", 0.5, 3.0)]
    count = int(os.environ.get("COUNT", "256"))
    for dt, op, pre, post in cases:
        algos = []
        for step in range(8):
            x = (np.arange(count) % 7 + rank + step).astype(np.float64)
            xs = [(np.arange(count) % 7 + r + step).astype(np.float64) for r in range(n)]
            ref = {"sum": sum(xs), "average": sum(xs) / n, "max": np.max(xs, 0),
                   "min": np.min(xs, 0), "product": np.prod(xs, 0)}[op]
            if op in ("sum", "average"):
                ref = sum(v * pre for v in xs) * post / (n if op == "average" else 1)
            got = _core.allreduce(x.astype(dt), op=op, name=f"rider.{dt}.{op}.{pre}",
                                  prescale=pre, postscale=post)
            tol = 1e-2 if dt == "float16" else 1e-6
            if not np.allclose(np.asarray(got, np.float64), ref, rtol=tol):
                failures.append(f"{dt} {op} step {step}: got {got[:4]} want {ref[:4]}")
            algos.append(_core.last_collective_stats())
        runs.append({"case": [dt, op, pre, post], "stats": algos,
                     "vote": _core.last_vote_stats()})
    report({"failures": failures, "runs": runs})
    basics.shutdown()
    sys.exit(0)

if mode == "grow":
    # More cached names than the host vote's slots hold (16 KiB words):
    # the vote turns to recdbl on every rank at the same round, and rounds
    # go on (an idle rank is still woken: LATE).
    total = int(os.environ.get("GROW", "17000"))
    seen = []
    for start in range(0, total, 2000):
        hs = [(i, _core.allreduce_async(np.full(1, rank + i, np.float32), op="sum",
                                        name=f"grow/{i}"))
              for i in range(start, min(total, start + 2000))]
        for i, h in hs:
            check(f"grow/{i}", h.wait(120), np.full(1, sum(r + i for r in range(n)), np.float64))
        seen.append(_core.last_vote_stats()["algo"])
    late = int(os.environ.get("LATE", "-1"))
    for step in range(3):
        if rank == late and step == 2:
            time.sleep(1.0)
        x = np.full(3, rank + step, np.float32)
        check(f"after.{step}", _core.allreduce(x, op="sum", name="grow/0b"),
              np.full(3, sum(r + step for r in range(n)), np.float64))
    report({"failures": failures, "algos": seen, "after": _core.last_vote_stats()})
    basics.shutdown()
    sys.exit(0)

if mode == "switch_idle":
    # 1. Every rank but STARTER submits "x" (64 KiB: the rider's room each
    #    of them proposes from now on); STARTER proposes none, so the room
    #    stays 0. "x" ages and goes to the coordinator, which waits for
    #    STARTER: those ranks idle with nothing of their own to vote on.
    # 2. STARTER submits "y" (64 KiB): its round (the host vote, which
    #    wakes every rank) agrees a 64 KiB room, too large for the host
    #    segment's slots, so the vote turns to recdbl at its end; "y" goes
    #    to the coordinator (the others need it), which waits for the rest.
    # 3. STARTER submits "x": the first recdbl round, started by STARTER
    #    alone. Its fresh name goes into its vote, not to the coordinator,
    #    so no response wakes the others: the round's own bytes must.
    starter = int(os.environ.get("STARTER", "1"))
    big = 16384  # float32: 64 KiB
    t0 = time.monotonic()
    if rank == starter:
        time.sleep(1.5)  # past the others' aging limit (1 s)
        hy = _core.allreduce_async(np.full(big, rank, np.float32), op="sum", name="y")
        time.sleep(0.5)  # that round ends before the next submission
        hx = _core.allreduce_async(np.full(big, rank, np.float32), op="sum", name="x")
        gx = hx.wait(60)
    else:
        hx = _core.allreduce_async(np.full(big, rank, np.float32), op="sum", name="x")
        gx = hx.wait(60)
        hy = _core.allreduce_async(np.full(big, rank, np.float32), op="sum", name="y")
    gy = hy.wait(60)
    total = np.full(big, sum(range(n)), np.float64)
    check("x", gx, total)
    check("y", gy, total)
    report({"failures": failures, "after": _core.last_vote_stats(),
            "elapsed": time.monotonic() - t0})
    basics.shutdown()
    sys.exit(0)


def steady():
    global rank, n, failures
    rank, n = basics.rank(), basics.size()
    failures = []
    names = [f"grad/{i}" for i in range(12)]
    counts = [1 + 7 * i for i in range(len(names))]
    steps = int(os.environ.get("STEPS", "6"))
    late = int(os.environ.get("LATE", "-1"))

    for step in range(steps):
        if rank == late and step == steps - 1:
            time.sleep(1.0)
        # Another order on every rank and every step.
        order = list(range(len(names)))
        k = (rank * 5 + step) % len(order)
        order = order[k:] + order[:k]
        if (rank + step) % 2:
            order.reverse()
        handles = {}
        for i in order:
            x = value(rank, i, step, counts[i]).astype(np.float32)
            handles[i] = _core.allreduce_async(x, op="sum", name=names[i])
        for i in range(len(names)):
            check(f"step {step} {names[i]}", handles[i].wait(60), want(i, step, counts[i]))
    vote = _core.last_vote_stats()

    # Names used once: agreed in the round's vote itself.
    for j in range(3):
        x = np.full(5, rank + j, np.float32)
        check(f"once.{j}", _core.allreduce(x, op="sum", name=f"once.{j}"),
              np.full(5, sum(r + j for r in range(n)), np.float64))

    return {"failures": failures, "vote": vote, "after": _core.last_vote_stats()}


run_passes(steady)
