"""Two builds of tfring, one benchmark, one run: A and B alternate, and
the table gives each number's median on both and B/A.

    python benchmarks/before_after.py --a /path/to/old/checkout --b . --rounds 3 \\
        -- allreduce_bench.py --np 2,4 --sizes 4K,64K,1M,16M --no-tf
    python benchmarks/before_after.py --a ../old --b . -- keras_scaling.py --models mlp

Each checkout must be built in place (tfring/_core*.so beside its Python
files, as ./dev.sh build leaves it). The benchmark script is this
checkout's (the same measuring code for both); only the tfring it imports
differs (PYTHONPATH). Rounds run A, B, B, A, A, B ... so that a drift of
the machine during the run falls on both alike. Every numeric leaf of the
benchmark's --json output whose key matches --keys is compared.
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_KEYS = (r"busbw|algbw|time_s|_us$|images_per_sec|exposed_comm_s|step_time_s"
                r"|ratio|over_mpi|speedup")


def leaves(doc, prefix=""):
    """{path: number} for every numeric leaf; a list of dicts is keyed by
    the first of its identifying fields it has (size, np, name, label)."""
    out = {}
    if isinstance(doc, dict):
        for k, v in doc.items():
            out.update(leaves(v, f"{prefix}/{k}" if prefix else str(k)))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            tag = str(i)
            if isinstance(v, dict):
                for key in ("size", "name", "label", "role", "np", "count"):
                    if key in v and not isinstance(v[key], (dict, list)):
                        tag = f"{key}={v[key]}"
                        break
            out.update(leaves(v, f"{prefix}[{tag}]"))
    elif isinstance(doc, (int, float)) and not isinstance(doc, bool):
        out[prefix] = float(doc)
    return out


def run_once(tree, script, args, timeout):
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "out.json")
        env = dict(os.environ, PYTHONPATH=os.path.abspath(tree))
        cmd = [sys.executable, os.path.join(HERE, script)] + args + ["--json", path]
        r = subprocess.run(cmd, env=env, timeout=timeout, capture_output=True, text=True)
        if r.returncode != 0 or not os.path.exists(path):
            sys.exit(f"{' '.join(cmd)} (PYTHONPATH={tree}) failed with code {r.returncode}:\n"
                     f"{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
        with open(path) as f:
            return json.load(f)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--a", required=True, help="checkout A (before)")
    p.add_argument("--b", default=os.path.dirname(HERE), help="checkout B (after)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--keys", default=DEFAULT_KEYS, help="regex on a leaf's last key")
    p.add_argument("--timeout", type=int, default=1800)
    p.add_argument("--json", default="", help="write every run's leaves here")
    p.add_argument("bench", nargs=argparse.REMAINDER,
                   help="-- SCRIPT.py [its arguments] (a script in benchmarks/)")
    a = p.parse_args()
    bench = a.bench[1:] if a.bench[:1] == ["--"] else a.bench
    if not bench:
        p.error("name a benchmark after --")
    keys = re.compile(a.keys)
    runs = {"A": [], "B": []}
    order = [("A", "B") if r % 2 == 0 else ("B", "A") for r in range(a.rounds)]
    for r, pair in enumerate(order):
        for side in pair:
            tree = a.a if side == "A" else a.b
            print(f"round {r + 1}/{a.rounds}: {side} ({tree})", file=sys.stderr, flush=True)
            runs[side].append(leaves(run_once(tree, bench[0], bench[1:], a.timeout)))
    paths = [k for k in runs["A"][0] if keys.search(k.rsplit("/", 1)[-1])
             and all(k in run for run in runs["A"] + runs["B"])]
    print(f"A = {a.a}\nB = {a.b}\n{' '.join(bench)}; medians of {a.rounds} alternated runs\n")
    print(f"| {'value':<60} | {'A':>12} | {'B':>12} | {'B/A':>6} |")
    print(f"|{'-' * 62}|{'-' * 14}|{'-' * 14}|{'-' * 8}|")
    for k in paths:
        ma = statistics.median(run[k] for run in runs["A"])
        mb = statistics.median(run[k] for run in runs["B"])
        ratio = f"{mb / ma:6.2f}" if ma else "   n/a"
        print(f"| {k[-60:]:<60} | {ma:12.4g} | {mb:12.4g} | {ratio} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"a": a.a, "b": a.b, "bench": bench, "runs": runs}, f, indent=1)


if __name__ == "__main__":
    main()
