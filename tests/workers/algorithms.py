"""Allreduce under each algorithm (TFRING_ALLREDUCE_ALGO, set by the test):
every dtype x op x count against a numpy float64 reference, prescale and
postscale, fused batches, buffers spanning many segment slots and many
back-to-back calls. Reports failures, a digest of every result (ranks must
agree bitwise) and how many calls took each algorithm. Runs once per pass
of TEST_PASSES (common.run_passes), counting each pass's calls.
"""

import os
import signal
import sys
import threading
import time

import numpy as np

from common import (DTYPES, OPS, averaged_batch, compare, delta, digest, make_input, reference,
                    report, run_passes, to_f64, tolerance)

import tfring.basics as basics
from tfring import _core

mode = sys.argv[1] if len(sys.argv) > 1 else "full"

if mode == "kill":
    basics.init()
    rank, n = basics.rank(), basics.size()
    # The victim dies while the others are inside one-shot allreduces.
    victim = int(os.environ["VICTIM"])
    seen = {"error": None, "message": "", "elapsed": None}
    _core.allreduce(np.ones(10, np.float32), name="warmup")
    t0 = time.time()
    if rank == victim:
        threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGKILL)).start()
    x = np.ones(256, np.float32)
    try:
        for i in range(10_000_000):
            _core.allreduce(x, name=f"small.{i}", out=x)
            x[:] = 1
    except Exception as e:  # noqa: BLE001 - the test inspects what was raised
        seen.update(error=type(e).__name__, message=str(e), elapsed=time.time() - t0)
    seen["counts"] = _core.allreduce_algorithm_counts()
    report(seen)
    sys.exit(0)


def one_pass():
    rank, n = basics.rank(), basics.size()
    before = _core.allreduce_algorithm_counts()
    # The job's threshold (rank 0's), the same on every rank even when a
    # rank sets TFRING_SMALL_THRESHOLD differently.
    threshold = int(os.environ.get("TEST_SMALL_THRESHOLD", "4096"))
    outs, failures = [], []

    def check(what, got, want, tol):
        compare(failures, what, got, want, tol)

    def reduced(dtype, op, count, salt, **kw):
        x, dt = make_input(dtype, count, rank, salt, op)
        y = _core.allreduce(x, op=op, name=f"ar.{dtype}.{op}.{count}.{salt}", dtype=dt, **kw)
        want = reference([make_input(dtype, count, r, salt, op)[0] for r in range(n)],
                         dtype, op, n)
        outs.append(y)
        return to_f64(y, dtype), want

    salt = 0
    es_f32 = 4
    counts = sorted({0, 1, 2 * n + 1, 1001, threshold // es_f32 - 1, threshold // es_f32,
                     threshold // es_f32 + 1})
    dtypes = DTYPES if mode == "full" else ["float32", "int32", "bfloat16"]
    for dtype in dtypes:
        for op in OPS:
            for count in counts:
                salt += 1
                got, want = reduced(dtype, op, count, salt)
                check(f"allreduce {dtype} {op} n={count}", got, want, tolerance(dtype, n))

    # Scales: prescale before, postscale after the reduction; average on top.
    for count in (7, threshold // 8 + 3, 3 * threshold // 8 + 5):
        for op, pre, post in (("sum", 0.5, 3.0), ("average", 2.0, 0.25), ("average", 1.0, 1.0)):
            salt += 1
            got, want = reduced("float64", op, count, salt, prescale=pre, postscale=post)
            check(f"scaled {op} pre={pre} post={post} n={count}", got, want * pre * post, 1e-12 * n)
        salt += 1
        got, want = reduced("int32", "average", count, salt, prescale=3.0)
        x_all = [make_input("int32", count, r, salt, "average")[0] for r in range(n)]
        want = np.trunc(np.sum([np.trunc(a * 3.0) for a in x_all], axis=0) / n)
        check(f"int32 average prescale=3 n={count}", got, want, 0)

    # Many segment slots in one call.
    x = np.arange(50_003, dtype=np.float64) * (rank + 1)
    y = _core.allreduce(x, op="sum", name="ar.large", prescale=0.5, postscale=3.0)
    check("large with scales", y, np.arange(50_003) * sum(range(1, n + 1)) * 1.5, 1e-12)
    outs.append(y)

    # Fused batches through the engine: several tensors in flight at once.
    for batch in range(3):
        counts = [1, 5, 64, 300, threshold // 4, 2 * threshold // 4 + 1]
        for i, y, want in averaged_batch(_core, counts, rank, n, salt, f"fused.{batch}", 60):
            check(f"fused batch {batch} tensor {i}", y, want, 1e-6 * n)
            outs.append(y)
        salt += len(counts)

    # Back-to-back calls: every call reuses a segment bank two steps later.
    acc = []
    for i in range(400):
        count = 1 + (i * 37) % 700
        x = np.full(count, rank + 1 + i % 5, np.int64)
        y = _core.allreduce(x, op="sum", name=f"loop.{i}")
        want = np.full(count, sum(r + 1 + i % 5 for r in range(n)), np.int64)
        if not np.array_equal(y, want):
            failures.append(f"back-to-back call {i}: got {y[:3]} want {want[:3]}")
        acc.append(y)
    outs.append(np.concatenate(acc))

    return {"failures": failures, "digest": digest(outs),
            "counts": delta(_core.allreduce_algorithm_counts(), before),
            "local_size": basics.local_size(), "cross_size": basics.cross_size()}


run_passes(one_pass)
