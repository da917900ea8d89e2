#!/usr/bin/env python3
"""Compressed collectives across rate-limited hosts: what fp16, bf16 and
PowerSGD gain over the float32 ring where the link is the bound.

    sudo python benchmarks/compression_bench.py                 # 2,4,8 hosts, 300 Mbit/s
    sudo python benchmarks/compression_bench.py --hosts 4 --sizes 64M --parts collectives
    sudo python benchmarks/compression_bench.py --rates 300,1000 --json compression.json
    sudo python benchmarks/compression_bench.py --parts train --train-compressions none,powersgd
    sudo python benchmarks/compression_bench.py --parts collectives --algo ring   # the wire on the ring

The hosts are network namespaces on a bridge (tests/cluster.py), one rank
per host, each host's link capped at --rate Mbit/s in both directions with
tc tbf (benchmarks/_compression_net.py); no delay is added. Jobs start with
``tfring-run -H host1:1,host2:1,...`` from host1, the other ranks over ssh
(sshd runs on every host), so every byte between ranks crosses two capped
links.

For each rate, first the link: plain TCP (one Python socket stream) from
host1 to host2 and back, 3 s each; the lower goodput is "link" below.

Then, per host count, one job times the paths of
benchmarks/_compression_collectives.py at each size: the core's float32
``_core.allreduce``, the TF op in a tf.function, the TF op with
Compression.fp16 and .bf16, Horovod's fp16 cast-then-sum, and the
reduction of a DistributedGradientTape step with Compression.powersgd over a
gradient set of that size (and, asked for with --paths, the same tape step
uncompressed). busbw = S/t * 2(N-1)/N (nccl-tests' definition) with S the
float32 size for every path, compressed or not, so busbw / link shows the
effective gain: the float32 ring can reach about 1, a path sending half the
bytes about 2.

Then, at --train-rate on --train-hosts hosts, one model.fit job per
compression (benchmarks/_compression_train.py: a 21M-parameter dense model
on scaled-up digits, tfring's RingAllreduceCallback with compression=):
median step time, its ratio to the uncompressed run's, and test accuracy.

Needs root (namespaces, tc) and sshd (tests/cluster_setup.sh installs it);
says why and exits 0 otherwise. Every namespace and process it made is
removed on the way out, on failure or interrupt (Ctrl-C, SIGTERM) too, and
namespaces a killed earlier run left are removed at the start.
"""

import argparse
import json
import os
import signal
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(1, os.path.join(os.path.dirname(HERE), "tests"))
import _compression_net as net  # noqa: E402
from _common import human_size, parse_ints, parse_sizes  # noqa: E402

PATHS = ("core", "op", "fp16", "bf16", "fp16cast", "powersgd")
ALL_PATHS = PATHS + ("tape",)
LABELS = {"core": "core f32", "op": "TF op f32", "fp16": "fp16", "bf16": "bf16",
          "fp16cast": "fp16 cast-sum", "tape": "tape f32", "powersgd": "PowerSGD"}
COMPRESSIONS = ("none", "fp16", "bf16", "powersgd")
COLLECTIVES_WORKER = os.path.join(HERE, "_compression_collectives.py")
TRAIN_WORKER = os.path.join(HERE, "_compression_train.py")


def parse_list(choices):
    def parse(text):
        items = [x.strip() for x in text.split(",") if x.strip()]
        bad = [x for x in items if x not in choices]
        if bad:
            raise argparse.ArgumentTypeError(f"unknown {bad}; choose from {','.join(choices)}")
        return items
    return parse


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--parts", type=parse_list(("collectives", "train")),
                   default=["collectives", "train"], help="what to run (default both)")
    p.add_argument("--hosts", type=parse_ints, default=[2, 4, 8],
                   help="host counts of the collective sweep (default 2,4,8)")
    p.add_argument("--rates", "--rate", type=lambda t: [float(x) for x in t.split(",")],
                   default=[300.0], help="link rates in Mbit/s (default 300; e.g. 300,1000)")
    p.add_argument("--sizes", type=parse_sizes, default=parse_sizes("1M,16M,64M"),
                   help="float32 sizes of the collective sweep (default 1M,16M,64M)")
    p.add_argument("--paths", type=parse_list(ALL_PATHS), default=list(PATHS),
                   help="collective paths (default " + ",".join(PATHS) + "; also: tape)")
    p.add_argument("--reps", type=int, default=3, help="timed loops per path and size")
    p.add_argument("--loop-s", type=float, default=0.3,
                   help="seconds one timed loop lasts at least (one call when longer)")
    p.add_argument("--powersgd-rank", type=int, default=4)
    p.add_argument("--train-hosts", type=int, default=4)
    p.add_argument("--train-rate", type=float, default=300.0)
    p.add_argument("--train-compressions", type=parse_list(COMPRESSIONS),
                   default=list(COMPRESSIONS))
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--batch", type=int, default=16, help="training batch per rank")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--start-iter", type=int, default=10,
                   help="PowerSGD's uncompressed warm-up steps in training")
    p.add_argument("--probe-s", type=float, default=3.0, help="seconds per link-probe stream")
    p.add_argument("--timeout", type=float, default=1800, help="seconds per job")
    p.add_argument("--algo", default=None,
                   help="TFRING_ALLREDUCE_ALGO of the collective jobs (default: unset, auto; "
                        "ring runs the 16-bit wire on the ring instead of Rabenseifner)")
    p.add_argument("--json", help="also write every result to this file")
    return p.parse_args(argv)


# ---------------------------------------------------------------- report ----

def busbw_mbit(size, t, n):
    """nccl-tests' bus bandwidth in Mbit/s: S/t * 2(N-1)/N."""
    return size / t * 2 * (n - 1) / n * 8 / 1e6


def collective_tables(runs, paths):
    """Markdown: busbw / link per path, then time and busbw per path; one
    row per (rate, hosts, size)."""
    head = "| rate | link | hosts | size | " + " | ".join(LABELS[p] for p in paths) + " |"
    rule = "|---:|---:|---:|---:|" + "---:|" * len(paths)
    ratio, detail = [head, rule], [head, rule]
    for run in runs:
        if "rows" not in run:
            continue
        link, n = run["link"]["mbit"], run["np"]
        for row in run["rows"]:
            lead = f"| {run['rate']:g} | {link:.0f} | {n} | {human_size(row['size'])} | "
            cells_r, cells_d = [], []
            for p in paths:
                m = row["paths"].get(p)
                if m is None or "time_s" not in m:
                    cells_r.append("n/a")
                    cells_d.append("n/a")
                    continue
                bw = busbw_mbit(row["size"], m["time_s"], n)
                cells_r.append(f"{bw / link:.2f}")
                cells_d.append(f"{m['time_s'] * 1e3:.0f} ms, {bw:.0f}")
            ratio.append(lead + " | ".join(cells_r) + " |")
            detail.append(lead + " | ".join(cells_d) + " |")
    return "\n".join(ratio), "\n".join(detail)


def train_table(train):
    """Markdown: one row per compression, against the uncompressed run."""
    base = train.get("none", {})
    out = ["| compression | step time | / uncompressed | test accuracy | vs uncompressed "
           "| steps | fit time |",
           "|:---|---:|---:|---:|---:|---:|---:|"]
    for name, r in train.items():
        if "step_s" not in r:
            out.append(f"| {name} | failed (below) | | | | | |")
            continue
        rel = (f"{r['step_s'] / base['step_s']:.2f}x" if "step_s" in base else "n/a")
        dacc = (f"{(r['test_accuracy'] - base['test_accuracy']) * 100:+.1f} points"
                if "test_accuracy" in base else "n/a")
        out.append(f"| {name} | {r['step_s'] * 1e3:.0f} ms | {rel} | "
                   f"{r['test_accuracy'] * 100:.1f}% | {dacc} | {r['steps']} | "
                   f"{r['fit_s']:.0f} s |")
    return "\n".join(out)


def train_verdicts(train):
    """Lines saying whether PowerSGD met its targets: step time <= 0.25x the
    uncompressed step, accuracy within 1 point of it."""
    base, psgd = train.get("none", {}), train.get("powersgd", {})
    if "step_s" not in base or "step_s" not in psgd:
        return []
    rel = psgd["step_s"] / base["step_s"]
    dacc = (psgd["test_accuracy"] - base["test_accuracy"]) * 100
    return [f"PowerSGD step / uncompressed step: {rel:.2f}x (target <= 0.25x: "
            f"{'met' if rel <= 0.25 else 'missed'})",
            f"PowerSGD accuracy vs uncompressed: {dacc:+.1f} points (target within 1 point: "
            f"{'met' if abs(dacc) <= 1 or dacc > 0 else 'missed'})"]


# ------------------------------------------------------------------ jobs ----

def collectives_job(cluster, c, nhosts, rate, link, args, tmp):
    result = os.path.join(tmp, f"coll-{nhosts}-{rate:g}.json")
    argv = [cluster.PYTHON, COLLECTIVES_WORKER, "--result", result,
            "--sizes", ",".join(map(str, args.sizes)), "--paths", ",".join(args.paths),
            "--reps", str(args.reps), "--loop-s", str(args.loop_s),
            "--powersgd-rank", str(args.powersgd_rank)]
    run = {"rate": rate, "link": link, "np": nhosts, "algo": args.algo or "auto"}
    env = {"TFRING_ALLREDUCE_ALGO": args.algo} if args.algo else None
    return recorded_job(cluster, c, nhosts, argv, args.timeout,
                        f"collectives, {nhosts} hosts at {rate:g} Mbit/s", result, run, env)


def train_job(cluster, c, compression, args, tmp):
    result = os.path.join(tmp, f"train-{compression}.json")
    argv = [cluster.PYTHON, TRAIN_WORKER, "--result", result, "--compression", compression,
            "--epochs", str(args.epochs), "--batch", str(args.batch), "--lr", str(args.lr),
            "--powersgd-rank", str(args.powersgd_rank), "--start-iter", str(args.start_iter)]
    return recorded_job(cluster, c, args.train_hosts, argv, args.timeout,
                        f"model.fit with compression {compression}", result, {})


def recorded_job(cluster, c, nhosts, argv, timeout, what, result, record, env=None):
    """Runs one job (`env`: variables for every rank) and returns `record`
    with the job's JSON result (or its error) and the load average before
    and after it."""
    record["load_before"] = net.load()
    try:
        net.run_job(cluster, c, nhosts, argv, timeout, what, env)
        with open(result) as f:
            record.update(json.load(f))
    except (RuntimeError, AssertionError, OSError, ValueError) as e:
        record["error"] = str(e)
        print(f"compression_bench: {e}", file=sys.stderr, flush=True)
    record["load_after"] = net.load()
    return record


def why_not(cluster, args):
    why = cluster.why_unavailable() or cluster.ssh_unavailable()
    if why:
        return why
    if max(args.hosts + [args.train_hosts]) < 2:
        return "every host count is below 2: nothing crosses a link"
    return None


def _terminate(signum, _frame):
    raise SystemExit(128 + signum)  # unwinds through the cleanup in main()


def run_all(cluster, args):
    """Builds the cluster once (the most hosts any part needs; smaller jobs
    use its first hosts), reshapes it per rate and runs the parts."""
    want = []
    if "collectives" in args.parts:
        want += [h for h in args.hosts if h >= 2]
    if "train" in args.parts:
        want.append(args.train_hosts)
    rates = list(args.rates if "collectives" in args.parts else [])
    if "train" in args.parts and args.train_rate not in rates:
        rates.append(args.train_rate)
    doc = {"benchmark": "compression_bench", "cpus": os.cpu_count(), "links": {},
           "collectives": [], "train": {}, "argv": sys.argv[1:],
           "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}
    with tempfile.TemporaryDirectory(prefix="tfring-compression-") as tmp:
        c = cluster.Cluster(max(max(want), 2))
        try:
            cluster.start_sshd(c)
            for rate in rates:
                net.shape(cluster, c, rate)
                link = net.measure_link(cluster, c, args.probe_s)
                doc["links"][f"{rate:g}"] = link
                print(f"compression_bench: link at {rate:g} Mbit/s (tbf): {link}",
                      file=sys.stderr, flush=True)
                if "collectives" in args.parts:
                    for nhosts in args.hosts:
                        if nhosts >= 2:
                            doc["collectives"].append(
                                collectives_job(cluster, c, nhosts, rate, link, args, tmp))
                if "train" in args.parts and rate == args.train_rate:
                    doc["train_link"] = link
                    for comp in args.train_compressions:
                        doc["train"][comp] = train_job(cluster, c, comp, args, tmp)
        finally:
            c.close()
    return doc


def _error_tail(text, lines=12):
    """The last lines of a failed job's output that are not TensorFlow's
    start-up noise (its C++ log lines)."""
    keep = [x for x in text.splitlines() if x.strip() and not any(
        m in x for m in ("E0000 ", "W0000 ", "I0000 ", "oneDNN", "cpu_feature_guard",
                         "TF_ENABLE_ONEDNN_OPTS", "rebuild TensorFlow"))]
    return "\n".join(keep[-lines:])


def report(doc, args):
    lines = []
    if doc["collectives"]:
        ratio, detail = collective_tables(doc["collectives"], args.paths)
        lines += ["One rank per host, links capped both ways (tc tbf); link = plain TCP "
                  "goodput (Mbit/s, lower direction).",
                  "busbw = S/t * 2(N-1)/N with S the float32 size for every path; "
                  f"TFRING_ALLREDUCE_ALGO={args.algo or 'auto'}.", "",
                  "busbw / link:", "", ratio, "", "time per call, busbw (Mbit/s):", "", detail]
        for run in doc["collectives"]:
            errors = {p: m["error"] for row in run.get("rows", [])
                      for p, m in row["paths"].items() if "error" in m}
            if "error" in run:
                lines.append(f"\n{run['np']} hosts at {run['rate']:g} Mbit/s failed: "
                             f"{_error_tail(run['error'])}")
            for p, e in errors.items():
                lines.append(f"\n{run['np']} hosts, {LABELS[p]}: {e}")
        other = [f"{run['np']} hosts at {run['rate']:g} Mbit/s, {human_size(row['size'])}: "
                 + ", ".join(f"{LABELS[p]} {'+'.join(m['ran'])}"
                             for p, m in row["paths"].items() if m.get("ran"))
                 for run in doc["collectives"] for row in run.get("rows", [])
                 if any(m.get("ran", ["ring"]) != ["ring"] for m in row["paths"].values())]
        if other:
            lines += ["\nallreduce algorithms that ran, where not the ring alone:", *other]
        loads = [(r["load_before"]["load1"], r["load_after"]["load1"])
                 for r in doc["collectives"]]
        lines.append(f"\nload average (1 min) before/after each job: {loads} "
                     f"on {doc['cpus']} cores")
    if doc["train"]:
        link = doc.get("train_link", {}).get("mbit", float("nan"))
        first = next(iter(doc["train"].values()))
        lines += ["", f"model.fit, {args.train_hosts} hosts at {args.train_rate:g} Mbit/s "
                  f"(link {link:.0f}), {first.get('params', 0) / 1e6:.1f}M parameters, "
                  f"{args.epochs} epochs, batch {args.batch} per rank, "
                  f"PowerSGD rank {args.powersgd_rank}:", "", train_table(doc["train"]), ""]
        lines += train_verdicts(doc["train"])
        for name, r in doc["train"].items():
            if "error" in r:
                lines.append(f"\n{name} failed: {_error_tail(r['error'])}")
        loads = {k: (r["load_before"]["load1"], r["load_after"]["load1"])
                 for k, r in doc["train"].items()}
        lines.append(f"load average (1 min) before/after each fit: {loads}")
    return "\n".join(lines)


def main(argv=None):
    args = parse_args(argv)
    import cluster

    why = why_not(cluster, args)
    if why:
        print(f"compression_bench: skipped: {why}", file=sys.stderr)
        return 0
    # Ctrl-C raises KeyboardInterrupt; SIGTERM and a closed terminal unwind
    # the same way, through Cluster.close() in run_all().
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _terminate)
    cluster.cleanup_leftovers()
    doc = run_all(cluster, args)
    print(report(doc, args))
    if args.json:
        doc["definitions"] = {
            "time_s": "median over reps of a barrier-started loop's seconds per call, "
                      "slowest rank",
            "busbw": "S/t * 2(N-1)/N, S the float32 size",
            "link": "plain TCP goodput between two hosts, lower direction (Mbit/s)",
            "step_s": "median model.fit step wall time on rank 0 after the first 3 steps"}
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
