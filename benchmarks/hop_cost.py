#!/usr/bin/env python3
"""The cost of one message hop and of one byte sent, measured: the scaling
model's alpha and beta.

    python benchmarks/hop_cost.py --np 2,4,8,16 --json hops.json
    python benchmarks/scaling_model.py --hops-json hops.json

Runs benchmarks/scale_bench.py's measurement (N core-only ranks, every link
over TCP, each algorithm by itself through ``_core_testing.DirectAllreduce``) for
every N and size, and reads, for each (algorithm, N, size), the time per
call, the hops on the critical path and the most bytes one rank sent, both
from ``DirectAllreduce.last_collective_stats()``. Then it fits, by least squares,

    t = c0 + alpha * hops + beta * bytes_sent

over the points with N <= --fit-max-np (by default this machine's cores:
more ranks than cores add context switches to every hop): c0 and alpha from
the smallest size, beta from the largest (see fit()); and, to show the
oversubscription trend, the same fit over the points of each N by itself. The ring,
recursive doubling and Rabenseifner take turns at each size, so hops and
bytes vary independently of each other: the ring has many hops and few
bytes per rank, recursive doubling few hops and many bytes.
"""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import parse_ints, parse_sizes  # noqa: E402

ALGOS = "ring,recdbl,rabenseifner"


def lstsq(rows, ys):
    """Least squares by the normal equations (no numpy needed): the
    coefficients x minimising |rows x - ys|^2."""
    k = len(rows[0])
    a = [[sum(r[i] * r[j] for r in rows) for j in range(k)] for i in range(k)]
    b = [sum(r[i] * y for r, y in zip(rows, ys)) for i in range(k)]
    for c in range(k):  # Gauss-Jordan with partial pivoting
        piv = max(range(c, k), key=lambda i: abs(a[i][c]))
        if abs(a[piv][c]) < 1e-300:
            raise ValueError("the points do not determine the fit (too few distinct hops/bytes)")
        a[c], a[piv], b[c], b[piv] = a[piv], a[c], b[piv], b[c]
        for i in range(k):
            if i != c:
                f = a[i][c] / a[c][c]
                a[i] = [x - f * y for x, y in zip(a[i], a[c])]
                b[i] -= f * b[c]
    return [b[i] / a[i][i] for i in range(k)]


def fit(points):
    """points: [{"size", "hops", "bytes_sent", "time_s"}] -> {"c0_s",
    "alpha_hop_s", "beta_s_per_byte", "points", "rms_rel_err"}, in two
    stages as latency and bandwidth are usually calibrated: c0 and alpha
    from the smallest size (t - beta bytes ~ c0 + alpha hops; least squares
    over the algorithms' different hop counts), then beta from the largest
    size (the mean of (t - c0 - alpha hops) / bytes_sent); iterated so each
    stage sees the other's term. A joint fit lets one noisy mid-size point
    move every coefficient; the error over all points is reported."""
    small = min(p["size"] for p in points)
    large = max(p["size"] for p in points)
    lo = [p for p in points if p["size"] == small]
    hi = [p for p in points if p["size"] == large and p["bytes_sent"] > 0]
    beta = 0.0
    for _ in range(50):
        c0, alpha = lstsq([[1.0, p["hops"]] for p in lo],
                          [p["time_s"] - beta * p["bytes_sent"] for p in lo])
        if large > small and hi:
            beta = sum((p["time_s"] - c0 - alpha * p["hops"]) / p["bytes_sent"]
                       for p in hi) / len(hi)
    pred = [c0 + alpha * p["hops"] + beta * p["bytes_sent"] for p in points]
    ys = [p["time_s"] for p in points]
    err = (sum(((q - y) / y) ** 2 for q, y in zip(pred, ys)) / len(ys)) ** 0.5
    return {"c0_s": c0, "alpha_hop_s": alpha, "beta_s_per_byte": beta, "points": len(points),
            "rms_rel_err": err}


def measure(args):
    import scale_bench

    points = []
    for n in args.np:
        for size in args.sizes:
            ns = argparse.Namespace(size=size, algos=args.algos, hosts=1, transport="tcp",
                                    iters=args.iters, reps=args.reps, timeout=args.timeout)
            res = scale_bench.run(n, ns)
            for algo in args.algos.split(","):
                r = res[algo]
                points.append({"np": n, "size": size, "algo": algo, "ran": r["ran"],
                               "hops": r["hops"], "bytes_sent": r["bytes_sent"],
                               "time_s": r["time_s"]})
                print(f"np {n:3d} size {size:9d} {algo:13s} hops {r['hops']:4d} "
                      f"sent {r['bytes_sent']:10d} B  {r['time_s'] * 1e6:10.1f} us", flush=True)
    return points


def report(points, fit_max_np):
    out = {"benchmark": "hop_cost", "points": points, "per_np": {}}
    for n in sorted({p["np"] for p in points}):
        pts = [p for p in points if p["np"] == n]
        try:
            out["per_np"][str(n)] = fit(pts)
        except ValueError as e:
            out["per_np"][str(n)] = {"error": str(e)}
    sel = [p for p in points if p["np"] <= fit_max_np]
    out["fit"] = dict(fit(sel), max_np=fit_max_np)
    return out


def format_report(doc):
    f = doc["fit"]
    lines = [f"fit over N <= {f['max_np']} ({f['points']} points, rms relative error "
             f"{100 * f['rms_rel_err']:.0f}%): c0 = {f['c0_s'] * 1e6:.1f} us, "
             f"alpha = {f['alpha_hop_s'] * 1e6:.2f} us per hop, "
             f"beta = {f['beta_s_per_byte'] * 1e9:.3f} ns per byte "
             f"({1 / max(f['beta_s_per_byte'], 1e-30) / 1e9:.2f} GB/s)",
             "", "| N | alpha us/hop | beta ns/byte | c0 us |", "|---:|---:|---:|---:|"]
    for n, r in doc["per_np"].items():
        if "error" in r:
            lines.append(f"| {n} | - | - | - |")
        else:
            lines.append(f"| {n} | {r['alpha_hop_s'] * 1e6:.2f} | "
                         f"{r['beta_s_per_byte'] * 1e9:.3f} | {r['c0_s'] * 1e6:.1f} |")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--np", type=parse_ints, default=[2, 4, 8, 16])
    p.add_argument("--sizes", type=parse_sizes, default=parse_sizes("4K,64K,1M"))
    p.add_argument("--algos", default=ALGOS)
    p.add_argument("--fit-max-np", type=int, default=os.cpu_count() or 2,
                   help="fit alpha and beta over N up to this (default: the cores)")
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--from-json", help="refit the points of an earlier --json")
    p.add_argument("--json")
    args = p.parse_args(argv)
    if args.from_json:
        with open(args.from_json) as fh:
            points = json.load(fh)["points"]
    else:
        points = measure(args)
    doc = report(points, args.fit_max_np)
    print(format_report(doc))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(doc, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
