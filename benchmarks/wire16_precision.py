"""Precision of 16-bit wire schemes over many draws, emulated in numpy.

For each rank count and wire, draws standard normal float32 inputs (one
array a rank) and prints the error of each scheme against the float64 sum,
max |err| / max |ref| in units of u (float16 2^-11, bfloat16 2^-8): one
rounding of the exact result reads <= 1. Median, 90th percentile, largest,
and the share of draws above 1 u.

Schemes: the two tfring runs (the ring and Rabenseifner's tree on the
wire, emulated bit for bit by tests/core/wire16_ref.py, which
tests/core/test_wire16.py checks against the core), Horovod's
cast-then-sum, and two ring-shaped designs not in the product, for
comparing designs before building one:

  ring, 24-bit last k hops   the ring with its last k reduce-scatter hops
                             sending 24-bit words (k/(4(N-1)) more bytes)
  two-branch ring            each segment's partial reaches its owner
                             along two chains, from the left (ceil((N-1)/2)
                             ranks) and from the right (the rest), so no
                             partial holds more than about N/2 ranks; the
                             ring's bytes, with every rank sending to both
                             neighbours
  two-branch, 24-bit last    the same with each chain's last hop in 24-bit
                             words (2/(4(N-1)) more bytes)

Only rounding is emulated (no timing): speed is benchmarks/
compression_bench.py's. Usage:

    python benchmarks/wire16_precision.py                       # 2 and 8 ranks, both wires
    python benchmarks/wire16_precision.py --ranks 8,16 --draws 100
"""

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                "core"))
from wire16_ref import U, narrow, narrow24, ring_cast_sum, ring_wire_sum, tree_wire_sum  # noqa: E402


def chain(xs, order, wire, wide_last=0):
    """Partial sum along `order`: each hop narrows what it sends (24-bit
    on the last `wide_last` hops) and the next rank adds its float32
    input. Returns the float32 partial the last rank holds."""
    p = xs[order[0]]
    hops = len(order) - 1
    for h, r in enumerate(order[1:]):
        sent = narrow24(p) if h >= hops - wide_last else narrow(p, wire)
        p = (sent + xs[r]).astype(np.float32)
    return p


def ring_wide_last(xs, wire, k):
    """The ring's arithmetic for one segment (owner N-1; every segment
    rounds alike), its last k hops in 24-bit words."""
    return narrow(chain(xs, list(range(len(xs))), wire, k), wire)


def two_branch(xs, wire, wide_last=False):
    """Owner 0; left chain N-L .. N-1 -> 0, right chain R .. 1 -> 0."""
    n = len(xs)
    left = n // 2
    right = n - 1 - left
    send = narrow24 if wide_last else (lambda v: narrow(v, wire))
    total = xs[0].copy()
    if left:
        total = (total + send(chain(xs, list(range(n - left, n)), wire))).astype(np.float32)
    if right:
        total = (total + send(chain(xs, list(range(right, 0, -1)), wire))).astype(np.float32)
    return narrow(total, wire)


def schemes(n):
    s = {
        "one rounding of the result": lambda xs, w, ref: narrow(ref.astype(np.float32), w),
        "cast-then-sum (Horovod)": lambda xs, w, ref: ring_cast_sum(xs, w),
        "ring (tfring, auto < 16 ranks)": lambda xs, w, ref: ring_wire_sum(xs, w),
        "tree (tfring Rabenseifner)": lambda xs, w, ref: tree_wire_sum(xs, w),
    }
    if n > 2:
        s["ring, 24-bit last 1 hop"] = lambda xs, w, ref: ring_wide_last(xs, w, 1)
        s["ring, 24-bit last 2 hops"] = lambda xs, w, ref: ring_wide_last(xs, w, 2)
        s["two-branch ring"] = lambda xs, w, ref: two_branch(xs, w)
        s["two-branch, 24-bit last"] = lambda xs, w, ref: two_branch(xs, w, True)
    return s


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", default="2,8", help="comma-separated rank counts")
    p.add_argument("--wires", default="float16,bfloat16")
    p.add_argument("--draws", type=int, default=40)
    p.add_argument("--count", type=int, default=4099, help="elements a rank")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    print("| ranks | wire | scheme | median | 90th pct | largest | draws > 1 u |")
    print("|---:|---|---|---:|---:|---:|---:|")
    for n in (int(t) for t in a.ranks.split(",")):
        for wire in a.wires.split(","):
            u = U[wire]
            sch = schemes(n)
            errs = {k: [] for k in sch}
            rng = np.random.default_rng(a.seed)
            for _ in range(a.draws):
                xs = rng.standard_normal((n, a.count)).astype(np.float32)
                ref = xs.astype(np.float64).sum(axis=0)
                scale = np.max(np.abs(ref)) * u
                for k, f in sch.items():
                    errs[k].append(np.max(np.abs(f(xs, wire, ref) - ref)) / scale)
            for k, e in errs.items():
                e = np.asarray(e)
                print(f"| {n} | {wire} | {k} | {np.median(e):.2f} | {np.percentile(e, 90):.2f} "
                      f"| {e.max():.2f} | {np.mean(e > 1) * 100:.0f}% |")


if __name__ == "__main__":
    main()
