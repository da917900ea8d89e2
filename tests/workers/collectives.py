"""Runs every collective over many dtypes, ops and sizes on this rank and
checks each result against a numpy float64 reference computed from all
ranks' inputs (which every rank can regenerate). Reports a digest of all
results so the test can check ranks agree bitwise. Modes full and quick run
once per pass of TEST_PASSES (common.run_passes): one launch checks several
transports or settings."""

import sys

import numpy as np

from common import (DTYPES, OPS, averaged_batch, digest, make_input, reference, report, run_passes,
                    to_f64, tolerance)

import tfring.basics as basics
from tfring import _core

mode = sys.argv[1] if len(sys.argv) > 1 else "full"
rank = n = salt = None
outs = []
exact = []  # results that do not depend on summation order
failures = []


def begin_pass():
    """Fresh results for a pass (or the one run) of a joined job."""
    global rank, n, salt, outs, exact, failures
    rank, n = basics.rank(), basics.size()
    salt = 0
    outs, exact, failures = [], [], []


def check(what, got, want, tol):
    if got.shape != want.shape:
        failures.append(f"{what}: shape {got.shape} != {want.shape}")
        return
    if tol == 0:
        ok = np.array_equal(got, want)
    else:
        ok = np.allclose(got, want, rtol=tol, atol=tol)
    if not ok:
        bad = np.argwhere(~np.isclose(got, want, rtol=tol, atol=tol)).ravel()[:5]
        failures.append(f"{what}: mismatch at {bad.tolist()}: got {got[bad]} want {want[bad]}")


# Above 8 MiB on one host the ring runs in rounds of N segments and reduces
# each arriving chunk straight into the next link, writing the output with
# streaming stores (collectives/allreduce_ring.cc, ring_pipeline.cc). Odd
# counts end rounds and elements mid-way; average scales the forwarded
# bytes; out=x reduces in place; the batch fuses tensors whose spans cross
# round boundaries.
def big_allreduces():
    global salt
    big = [("float32", "sum", 2_500_003), ("float16", "average", 4_200_001),
           ("int32", "max", 2_100_007)]
    for dtype, op, count in big:
        salt += 1
        x, dt = make_input(dtype, count, rank, salt, op)
        want = reference([make_input(dtype, count, r, salt, op)[0] for r in range(n)],
                         dtype, op, n)
        y = _core.allreduce(x, op=op, name=f"ar.big.{dtype}", dtype=dt)
        check(f"allreduce big {dtype} {op} n={count}", to_f64(y, dtype), want,
              tolerance(dtype, n))
        outs.append(y)
        if dtype == "float32":
            _core.allreduce(x, op=op, name="ar.big.inplace", out=x)
            check("allreduce big in place", to_f64(x, dtype), want, tolerance(dtype, n))
            outs.append(x)
    counts = (700_001, 1_300_003, 5, 900_017)
    for i, y, want in averaged_batch(_core, counts, rank, n, salt, "ar.big.batch", 120):
        check(f"allreduce big batch tensor {i}", y, want, tolerance("float32", n))
        outs.append(y)
    salt += len(counts)


# The other ring collectives above 8 MiB: their copies forward into the
# next link and stream into the output the same way.
def big_others():
    rows = [1_200_000 + 7 * k for k in range(n)]
    x = np.arange(rows[rank] * 3, dtype=np.float32).reshape(rows[rank], 3) + 1000 * rank
    y = _core.allgather(x, name="ag.big")
    want = np.concatenate([np.arange(rows[k] * 3, dtype=np.float32).reshape(rows[k], 3)
                           + 1000 * k for k in range(n)])
    check("allgather big", y, want, 0)
    outs.append(y)
    x = np.arange(2_400_000 * n, dtype=np.float64).reshape(-1, 2) * (rank + 1)
    y = _core.reducescatter(x, op="sum", name="rs.big")
    full = np.arange(2_400_000 * n, dtype=np.float64).reshape(-1, 2) * (n * (n + 1) // 2)
    per = full.shape[0] // n
    check("reducescatter big", y, full[rank * per:(rank + 1) * per], 0)  # (own slice)


report_extra = {}


def results():
    return {**report_extra, "failures": failures, "digest": digest(outs),
            "exact_digest": digest(exact), "transport": _core.transport(),
            "local_rank": basics.local_rank(), "local_size": basics.local_size(),
            "cross_rank": basics.cross_rank(), "cross_size": basics.cross_size()}


if mode == "big":
    basics.init()
    begin_pass()
    modes_before = _core.ring_store_modes()
    x = np.ones(1000, np.float32)  # below 8 MiB: not tuned
    _core.allreduce(x, name="ar.small")
    modes_small = _core.ring_store_modes()
    big_allreduces()
    report_extra = {"modes_before": modes_before, "modes_small": modes_small,
                    "modes": _core.ring_store_modes()}
    big_others()
    report(results())
    basics.shutdown()
    sys.exit(0)


def one_pass():
    global salt
    begin_pass()
    counts = [0, 1, max(n - 1, 1), 2 * n + 1, 1000] if mode == "full" else [0, 1, 2 * n + 1, 1000]
    dtypes = DTYPES if mode == "full" else ["float32", "int32", "bfloat16"]
    ops = OPS

    # Allreduce: every dtype x op x count.
    for dtype in dtypes:
        for op in ops:
            for count in counts:
                salt += 1
                x, dt = make_input(dtype, count, rank, salt, op)
                y = _core.allreduce(x, op=op, name=f"ar.{dtype}.{op}.{count}", dtype=dt)
                want = reference([make_input(dtype, count, r, salt, op)[0] for r in range(n)],
                                 dtype, op, n)
                check(f"allreduce {dtype} {op} n={count}", to_f64(y, dtype), want,
                      tolerance(dtype, n))
                outs.append(y)
                if op in ("min", "max") or dtype.startswith(("int", "uint")):
                    exact.append(y)

    # Large: crosses many chunks and wraps the shared-memory ring many times.
    x = np.arange(100_003, dtype=np.float64) * (rank + 1)
    y = _core.allreduce(x, op="sum", name="ar.large", prescale=0.5, postscale=3.0)
    check("allreduce large with scales", y, np.arange(100_003) * sum(range(1, n + 1)) * 1.5, 1e-12)
    outs.append(y)

    if mode == "full" and n <= 4:  # (seven oversubscribed ranks: CI time)
        big_allreduces()

    # Allgather: a different first dimension per rank (rank r has r+1 rows, or 0).
    for dtype in dtypes + ["bool"]:
        for rows_of in (lambda r: r + 1, lambda r: 0 if r % 2 else 3):
            rows = rows_of(rank)
            x = (np.arange(rows * 3).reshape(rows, 3) + 100 * rank).astype(
                "uint16" if dtype == "bfloat16" else dtype)
            y = _core.allgather(x, name=f"ag.{dtype}.{rows_of(0)}",
                                dtype="bfloat16" if dtype == "bfloat16" else None)
            want = np.concatenate([
                (np.arange(rows_of(r) * 3).reshape(rows_of(r), 3) + 100 * r).astype(
                    "uint16" if dtype == "bfloat16" else dtype) for r in range(n)])
            check(f"allgather {dtype}", y, want, 0)
            outs.append(y)

    # Broadcast from every root.
    for root in range(n):
        for count in counts:
            x = np.full(count, rank + 0.25, np.float32)
            y = _core.broadcast(x, root=root, name=f"bc.{root}.{count}")
            check(f"broadcast root={root} n={count}", y, np.full(count, root + 0.25, np.float32), 0)
            outs.append(y)

    # Reducescatter: rows split as evenly as possible, first ranks get extras.
    for dtype in dtypes:
        for op in ("sum", "average", "max"):
            for rows in (1, n, 2 * n + 1, 37):
                salt += 1
                x, dt = make_input(dtype, rows * 2, rank, salt, op)
                x = x.reshape(rows, 2)
                y = _core.reducescatter(x, op=op, name=f"rs.{dtype}.{op}.{rows}", dtype=dt)
                full = reference([make_input(dtype, rows * 2, r, salt, op)[0] for r in range(n)],
                                 dtype, op, n).reshape(rows, 2)
                start = sum(rows // n + (r < rows % n) for r in range(rank))
                mine = rows // n + (rank < rows % n)
                check(f"reducescatter {dtype} {op} rows={rows}", to_f64(y, dtype),
                      full[start:start + mine], tolerance(dtype, n))

    return results()


run_passes(one_pass)
