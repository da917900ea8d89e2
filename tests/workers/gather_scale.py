"""Allgather and broadcast under each algorithm (TFRING_ALLGATHER_ALGO and
TFRING_BROADCAST_ALGO set by the test; core-only ranks). Modes:

  full    ragged allgathers (empty blocks and all-empty outputs included)
          and broadcasts from several roots, over several dtypes, each
          against its numpy reference (exact: both only copy); reports
          failures, a digest of every output (ranks and algorithms must
          agree bitwise), the stats of each call and the calls per
          algorithm.
  stats   allgathers with TEST_ROWS rows per rank (one comma list per call,
          ';' between calls) of float32 pairs, then broadcasts of
          TEST_BCAST_BYTES from each root of TEST_ROOTS; reports each call's
          _core.last_collective_stats() and whether its output was right.
  kill    the last rank dies inside a stream of allgathers and broadcasts;
          reports what each survivor raised.
  timeline  one allgather and one broadcast with TFRING_TIMELINE set;
          reports the timeline's events.

"stats" and "full" run once per pass of TEST_PASSES (common.run_passes):
one launch checks several algorithms or host layouts; the counters they
report are the pass's own.
"""

import os
import sys

import numpy as np

from common import delta, digest, f32_to_bf16_bits, report, run_passes

import tfring.basics as basics
from tfring import _core

mode = sys.argv[1] if len(sys.argv) > 1 else "full"


def block(r, rows, dtype, salt):
    """Rank r's input: rows x 3 values every rank can regenerate."""
    rng = np.random.default_rng(7919 * salt + r)
    vals = rng.uniform(-100, 100, (rows, 3))
    if dtype == "bfloat16":
        return f32_to_bf16_bits(vals)
    if dtype == "bool":
        return vals > 0
    return vals.astype(dtype)


def roots(n):
    # Rank 0 and 2 are the extra ranks of the non-power-of-two fold when
    # there are any (the tree's costliest roots); 1, the last rank and one
    # in the middle take the other paths.
    return sorted({0, 1 % n, 2 % n, n // 2, n - 1})


if mode == "kill":  # the last rank dies inside a stream of allgathers and broadcasts
    basics.init()
    rank, n = basics.rank(), basics.size()
    import signal
    import threading
    import time

    seen = {"error": None, "message": "", "elapsed": None}
    x = np.ones((2, 2), np.float32)
    _core.allgather(x, name="warmup")
    t0 = time.time()
    if rank == n - 1:
        threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGKILL)).start()
    try:
        for i in range(10_000_000):
            _core.allgather(x, name=f"ag.{i}")
            _core.broadcast(x, root=i % n, name=f"bc.{i}")
    except Exception as e:  # noqa: BLE001 - the test inspects what was raised
        seen.update(error=type(e).__name__, message=str(e), elapsed=time.time() - t0)
    report(seen)
    os._exit(0)  # right after the error, as a script does

if mode == "timeline":  # one ragged allgather and one broadcast, then the timeline's events
    basics.init()
    rank, n = basics.rank(), basics.size()
    import json

    _core.allgather(np.ones((rank + 1, 2), np.float32), name="gathered")
    _core.broadcast(np.ones(100, np.uint8), root=n - 1, name="sent")
    basics.shutdown()
    with open(os.environ["TFRING_TIMELINE"].replace("{rank}", str(rank))) as f:
        report({"timeline": json.load(f)})
    sys.exit(0)


def stats_pass():
    rank, n = basics.rank(), basics.size()
    before = _core.collective_algorithm_stats()
    stats = []
    for i, spec in enumerate(os.environ.get("TEST_ROWS", "").split(";")):
        if not spec:
            continue
        rows = [int(v) for v in spec.split(",")]
        rows = (rows * n)[:n]
        x = np.full((rows[rank], 2), rank, np.float32)
        y = _core.allgather(x, name=f"ag.stats.{i}")
        want = np.concatenate([np.full((rows[r], 2), r, np.float32) for r in range(n)])
        stats.append(dict(_core.last_collective_stats(), rows=rows,
                          ok=bool(np.array_equal(y, want))))
    nbytes = int(os.environ.get("TEST_BCAST_BYTES", "0") or 0)
    for root in [int(v) for v in os.environ.get("TEST_ROOTS", "").split(",") if v]:
        x = np.full(nbytes, rank, np.uint8)
        y = _core.broadcast(x, root=root, name=f"bc.stats.{root}")
        stats.append(dict(_core.last_collective_stats(), root=root,
                          ok=bool(np.array_equal(y, np.full(nbytes, root, np.uint8)))))
    return {"stats": stats, "totals": delta(_core.collective_algorithm_stats(), before)}


def full_pass():
    rank, n = basics.rank(), basics.size()
    before = _core.collective_algorithm_stats()
    failures, outs, stats = [], [], []
    salt = 0
    row_rules = [
        lambda r: r % 4,             # ragged, rank 0 (and every 4th) empty
        lambda r: 0 if r % 2 else 3,  # every other rank empty
        lambda r: 1,
        lambda r: 0,                  # all empty: an empty output
        lambda r: 40 + r,             # a few KiB
    ]
    for dtype in ["float32", "float64", "int32", "bfloat16", "uint8", "float16", "bool"]:
        for k, rows_of in enumerate(row_rules):
            salt += 1
            x = block(rank, rows_of(rank), dtype, salt)
            y = _core.allgather(x, name=f"ag.{dtype}.{k}",
                                dtype="bfloat16" if dtype == "bfloat16" else None)
            want = np.concatenate([block(r, rows_of(r), dtype, salt) for r in range(n)])
            if y.shape != want.shape or not np.array_equal(y, want):
                failures.append(f"allgather {dtype} rows rule {k}: got shape {y.shape}, "
                                f"want {want.shape}")
            outs.append(y)
            stats.append(_core.last_collective_stats())

    for dtype in ["float32", "float64", "int64", "bfloat16", "int8"]:
        for root in roots(n):
            for rows in (0, 1, 333):
                salt += 1
                x = block(rank, rows, dtype, salt)
                y = _core.broadcast(x, root=root, name=f"bc.{dtype}.{root}.{rows}",
                                    dtype="bfloat16" if dtype == "bfloat16" else None)
                want = block(root, rows, dtype, salt)
                if y.shape != want.shape or not np.array_equal(y, want):
                    failures.append(f"broadcast {dtype} root={root} rows={rows}: differs")
                outs.append(y)
                stats.append(_core.last_collective_stats())

    return {"failures": failures, "digest": digest(outs), "stats": stats,
            "totals": delta(_core.collective_algorithm_stats(), before)}


# Imported by collective_scale.py, which runs these passes among others.
if __name__ == "__main__":
    run_passes(stats_pass if mode == "stats" else full_pass)
