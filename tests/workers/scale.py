"""Allreduce at scale (TFRING_ALLREDUCE_ALGO set by the test, core-only
ranks). Modes:

  full    every dtype x op at sizes 0, 1, odd, a few KiB and 1 MiB against a
          numpy float64 reference; reports failures, a digest of every
          result (ranks must agree bitwise) and the stats of each call.
  stats   a few float32 sum allreduces of `count` elements; reports each
          call's _core.last_collective_stats().
  kill    a rank (TEST_VICTIM, default the last) dies inside a stream of
          allreduces; reports what the survivors raised. Survivors exit right after their error, as a
          script does.

"stats" and "full" run once per pass of TEST_PASSES (common.run_passes):
one launch checks several algorithms or host layouts; the counters they
report are the pass's own.
"""

import os
import signal
import sys
import threading
import time

import numpy as np

from common import (DTYPES, OPS, compare, delta, digest, make_input, reference, report,
                    run_passes, to_f64, tolerance)

import tfring.basics as basics
from tfring import _core

mode = sys.argv[1] if len(sys.argv) > 1 else "full"

if mode == "kill":
    basics.init()
    rank, n = basics.rank(), basics.size()
    victim = int(os.environ.get("TEST_VICTIM", n - 1))
    seen = {"error": None, "message": "", "elapsed": None}
    x = np.ones(64, np.float32)
    _core.allreduce(x, name="warmup")
    t0 = time.time()
    if rank == victim:
        threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGKILL)).start()
    try:
        for i in range(10_000_000):
            _core.allreduce(x, name=f"step.{i}", out=x)
            x[:] = 1
    except Exception as e:  # noqa: BLE001 - the test inspects what was raised
        seen.update(error=type(e).__name__, message=str(e), elapsed=time.time() - t0)
    report(seen)
    os._exit(0)  # right after the error, without a clean shutdown


def stats_pass():
    rank, n = basics.rank(), basics.size()
    before = _core.allreduce_algorithm_stats()
    stats = []
    for count in [int(c) for c in os.environ["TEST_COUNTS"].split(",")]:
        x = np.full(count, rank + 1, np.float32)
        y = _core.allreduce(x, op="sum", name=f"stats.{count}")
        ok = bool(np.array_equal(y, np.full(count, n * (n + 1) / 2, np.float32)))
        stats.append(dict(_core.last_collective_stats(), count=count, ok=ok))
    return {"stats": stats, "totals": delta(_core.allreduce_algorithm_stats(), before)}


def full_pass():
    rank, n = basics.rank(), basics.size()
    before = _core.allreduce_algorithm_counts()
    failures, outs, stats = [], [], []
    dtypes = DTYPES if os.environ.get("TEST_ALL_DTYPES") else ["float32", "float64", "int32",
                                                                 "bfloat16"]
    counts = [0, 1, 3, 2 * n + 1, 1001]
    salt = 0
    for dtype in dtypes:
        for op in OPS:
            for count in counts:
                salt += 1
                x, dt = make_input(dtype, count, rank, salt, op)
                y = _core.allreduce(x, op=op, name=f"ar.{dtype}.{op}.{count}", dtype=dt)
                want = reference([make_input(dtype, count, r, salt, op)[0] for r in range(n)],
                                 dtype, op, n)
                compare(failures, f"allreduce {dtype} {op} n={count}", to_f64(y, dtype), want,
                        tolerance(dtype, n))
                outs.append(y)
                if count:
                    stats.append(_core.last_collective_stats())

    # Larger buffers: a few KiB and 1 MiB of float32, with scales.
    for count, pre, post in ((1500, 1.0, 1.0), (262_144, 0.5, 3.0), (262_147, 1.0, 1.0)):
        salt += 1
        x, dt = make_input("float32", count, rank, salt, "sum")
        y = _core.allreduce(x, op="sum", name=f"big.{count}", dtype=dt, prescale=pre,
                            postscale=post)
        want = reference([make_input("float32", count, r, salt, "sum")[0] for r in range(n)],
                         "float32", "sum", n) * pre * post
        compare(failures, f"allreduce float32 sum n={count}", to_f64(y, "float32"), want,
                tolerance("float32", n) * 4)
        outs.append(y)
        stats.append(_core.last_collective_stats())

    return {"failures": failures, "digest": digest(outs), "stats": stats,
            "counts": delta(_core.allreduce_algorithm_counts(), before)}


# Imported by collective_scale.py, which runs these passes among others.
if __name__ == "__main__":
    run_passes(stats_pass if mode == "stats" else full_pass)
