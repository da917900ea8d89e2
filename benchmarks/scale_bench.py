#!/usr/bin/env python3
"""Small-collective latency and critical-path hops by algorithm as ranks grow.

    python benchmarks/scale_bench.py --np 8,16,32 --size 4K
    python benchmarks/scale_bench.py --np 8,16,32 --size 4K --transport tcp
    python benchmarks/scale_bench.py --np 16 --hosts 4 --algos ring,recdbl,rabenseifner,oneshot
    python benchmarks/scale_bench.py --np 8,16,32 --size 4K --collective allgather
    python benchmarks/scale_bench.py --np 8,16,32 --size 4K --collective broadcast
    python benchmarks/scale_bench.py --vote --np 8,16,32 --size 4K

Starts N core-only ranks on this machine (no MPI, no TensorFlow; a file
store in a temporary directory) and times ``_core_testing.DirectAllreduce`` (the
algorithm alone, no engine) for each algorithm in turn: allreduce as a
float32 sum in place; ``--collective allgather`` (algorithms ring, recdbl)
with ``--size`` the whole output, each rank sending size/N bytes;
``--collective broadcast`` (ring, tree) of ``--size`` bytes from rank 0, each
call timed alone after a barrier (back-to-back broadcasts would overlap);
back to back, ``--iters`` calls after a warm-up, ``--reps`` times with
the algorithms taking turns; a repetition's time is the slowest rank's mean
per call, and the table shows the median repetition. Beside it: the hops on
the collective's critical path and the most bytes one rank sent
(``DirectAllreduce.last_collective_stats()``), and each algorithm's time as a ratio of
the ring's.

With more ranks than cores every sequential hop costs a context switch, so
on a small machine the time tracks the hop count: compare trends, not
absolute values. ``--hosts K`` makes consecutive ranks pretend to share K
hosts (TFRING_HOSTNAME), which ``oneshot`` needs to run the small
cross-host scheme; ``--transport tcp`` puts every link on TCP, as when each
rank sits on a host of its own (the recursive algorithms always use TCP;
the ring uses shared memory between ranks of one host).

``--vote`` measures the agreement round instead: each vote algorithm
(TFRING_VOTE_ALGO, ``--algos ring,recdbl``, plus ``host`` with ``--hosts``)
runs as a job of its own,
engine and coordinator included, and times the steady state of one named
``_core.allreduce`` of ``--size`` called back to back (its allreduce
algorithm is the same in every job: TFRING_ALLREDUCE_ALGO=auto). The jobs
take turns ``--reps`` times; the table shows the median job's slowest rank,
with the vote's hops (``_core.last_vote_stats()``).
"""

import argparse
import json
import os
import secrets
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import child_env, human_size, parse_ints, parse_size  # noqa: E402


def worker(args):
    import numpy as np

    from tfring import _core, _core_testing

    rank, n = args.rank, args.nranks
    direct = _core_testing.DirectAllreduce(_core.FileStore(args.store), rank, n, args.secret)
    count = args.size // 4
    what = args.collective
    nbytes = args.size // n if what == "allgather" else args.size
    row = {}
    algos = args.algos.split(",")
    for algo in algos:
        if what == "allgather":
            out = direct.allgather(np.full(nbytes, rank % 251, np.uint8), algo)
            want = np.repeat(np.arange(n) % 251, nbytes).astype(np.uint8)
            assert np.array_equal(out, want), algo
        elif what == "broadcast":
            buf = np.full(nbytes, rank % 251, np.uint8)
            direct.broadcast(buf, 0, algo)
            assert np.all(buf == 0), (algo, buf[:4])
        else:
            buf = np.full(count, rank + 1, np.float32)
            direct.allreduce(buf, algo)
            assert np.all(buf == n * (n + 1) / 2), (algo, buf[:4])
        st = direct.last_collective_stats()
        row[algo] = {"times": [], "hops": st["hops"], "bytes_sent": st["bytes_sent"],
                     "ran": st["algo"]}
    # Algorithms take turns, rep by rep, so a change in the machine's load
    # falls on all of them.
    for _ in range(args.reps):
        for algo in algos:
            row[algo]["times"].append(direct.time(nbytes, algo, args.iters, what))
    direct.close()
    with open(args.out, "w") as f:
        json.dump(row, f)
    return 0


def vote_worker(args):
    import time

    import numpy as np

    import tfring.basics as basics
    from tfring import _core

    basics.init()
    n = basics.size()
    x = np.ones(args.size // 4, np.float32)
    for _ in range(20):  # negotiated once, then the cached fast path
        y = _core.allreduce(x, op="sum", name="bench")
    assert np.all(y == n), y[:4]
    _core.allreduce(x, op="sum", name="bench", out=x)  # a barrier before the clock
    x[:] = 1
    t0 = time.perf_counter()
    for _ in range(args.iters):
        _core.allreduce(x, op="sum", name="bench", out=y)
    dt = (time.perf_counter() - t0) / args.iters
    st = _core.last_vote_stats()
    basics.shutdown()
    with open(args.out, "w") as f:
        json.dump({"time_s": dt, "hops": st["hops"], "bytes_sent": st["bytes_sent"],
                   "ran": st["algo"]}, f)
    return 0


def _launch(n, args, tmp, extra_env, argv_of, what="", rank_env=False):
    """Runs n ranks of this script (argv_of(rank) after the script's path),
    each on one thread, with extra_env, --transport and --hosts applied;
    waits at most --timeout and returns each rank's JSON from --out."""
    procs = []
    try:
        for r in range(n):
            env = child_env()
            env["OMP_NUM_THREADS"] = "1"
            env.update(extra_env)
            if rank_env:
                env["TFRING_RANK"] = str(r)
            if args.transport:
                env["TFRING_TRANSPORT"] = args.transport
            if args.hosts > 1:
                env["TFRING_HOSTNAME"] = f"host{r * args.hosts // n}"
            cmd = [sys.executable, os.path.abspath(__file__), *argv_of(r),
                   "--out", os.path.join(tmp, f"{r}.json")]
            procs.append(subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL))
        for p in procs:
            p.wait(timeout=args.timeout)
    except subprocess.TimeoutExpired:
        raise SystemExit(f"scale_bench: {n} ranks ran past --timeout {args.timeout:g} s")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    if any(p.returncode for p in procs):
        raise SystemExit(f"scale_bench: a rank of {n} failed{what}")
    rows = []
    for r in range(n):
        with open(os.path.join(tmp, f"{r}.json")) as f:
            rows.append(json.load(f))
    return rows


def run_vote(n, args):
    """One job per vote algorithm and repetition; the slowest rank's mean."""
    from tfring import _core

    algos = args.algos.split(",")
    times = {a: [] for a in algos}
    info = {}
    for _ in range(args.reps):
        for algo in algos:
            with tempfile.TemporaryDirectory(prefix="tfring-vote-") as tmp:
                secret = secrets.token_hex(16)
                server = _core.TcpStoreServer("127.0.0.1", 0, secret)
                env = {"TFRING_SIZE": str(n), "TFRING_SECRET": secret,
                       "TFRING_STORE_ADDR": f"127.0.0.1:{server.port}",
                       "TFRING_VOTE_ALGO": algo, "TFRING_TIMEOUT": "300"}
                rows = _launch(n, args, tmp, env, lambda r: [
                    "--vote-worker", "--size", str(args.size), "--iters", str(args.iters)],
                    f" (vote {algo})", rank_env=True)
                del server
            times[algo].append(max(row["time_s"] for row in rows))
            info[algo] = rows[0]
    out = {"np": n}
    for algo in algos:
        t = sorted(times[algo])
        out[algo] = {"time_s": t[len(t) // 2], "min_s": t[0], "hops": info[algo]["hops"],
                     "bytes_sent": info[algo]["bytes_sent"], "ran": info[algo]["ran"]}
    return out


def run(n, args):
    with tempfile.TemporaryDirectory(prefix="tfring-scale-") as tmp:
        store = os.path.join(tmp, "store")
        os.makedirs(store)
        secret = secrets.token_hex(16)
        # TFRING_ALLREDUCE_ALGO=recdbl opens the point-to-point links on any
        # topology; each call names its algorithm.
        rows = _launch(n, args, tmp, {"TFRING_ALLREDUCE_ALGO": "recdbl"}, lambda r: [
            "--worker", "--rank", str(r), "--nranks", str(n), "--store", store,
            "--secret", secret, "--size", str(args.size), "--algos", args.algos,
            "--iters", str(args.iters), "--collective", args.collective,
            "--reps", str(args.reps)])
    out = {"np": n}
    for algo in args.algos.split(","):
        reps = len(rows[0][algo]["times"])
        per_rep = [max(row[algo]["times"][i] for row in rows) for i in range(reps)]
        out[algo] = {
            "time_s": sorted(per_rep)[reps // 2],
            "min_s": min(per_rep),
            "hops": rows[0][algo]["hops"],
            "bytes_sent": max(row[algo]["bytes_sent"] for row in rows),
            "ran": rows[0][algo]["ran"],
        }
    return out


def table(results, algos, size, what="allreduce"):
    head = (["np"] + [f"{a} (us)" for a in algos] + [f"{a} hops" for a in algos]
            + [f"{a}/ring" for a in algos if a != "ring"])
    kind = {"allreduce": "allreduce, float32 sum", "allgather": "allgather (whole output)",
            "broadcast": "broadcast from rank 0",
            "vote": "steady-state engine allreduce by vote algorithm, float32 sum"}[what]
    lines = [f"{human_size(size)} {kind} (median over repetitions of the "
             "slowest rank's mean per call)",
             "| " + " | ".join(head) + " |", "|" + "---:|" * len(head)]
    for res in results:
        cells = [str(res["np"])]
        cells += [f"{res[a]['time_s'] * 1e6:.0f}" for a in algos]
        cells += [str(res[a]["hops"]) for a in algos]
        if "ring" in algos:
            cells += [f"{res[a]['time_s'] / res['ring']['time_s']:.2f}" for a in algos
                      if a != "ring"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--np", type=parse_ints, default=[8, 16, 32])
    p.add_argument("--size", type=parse_size, default=4096)
    p.add_argument("--collective", default="allreduce",
                   choices=["allreduce", "allgather", "broadcast"])
    p.add_argument("--algos", default=None, help="default: ring,recdbl,rabenseifner "
                   "(allreduce), ring,recdbl (allgather), ring,tree (broadcast)")
    p.add_argument("--hosts", type=int, default=1)
    p.add_argument("--transport", default="", help="TFRING_TRANSPORT for the ranks (tcp: "
                   "every link over TCP, as with one rank per host)")
    p.add_argument("--iters", type=int, default=100)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--json")
    p.add_argument("--vote", action="store_true", help="time the engine's steady state by "
                   "vote algorithm (--algos ring,recdbl, and host with --hosts) instead of the "
                   "allreduce algorithms")
    p.add_argument("--worker", action="store_true")
    p.add_argument("--vote-worker", action="store_true")
    p.add_argument("--rank", type=int)
    p.add_argument("--nranks", type=int)
    p.add_argument("--store")
    p.add_argument("--secret")
    p.add_argument("--out")
    args = p.parse_args()
    if args.vote and args.algos is None:
        args.algos = "ring,recdbl,host" if args.hosts > 1 else "ring,recdbl"
    if args.algos is None:
        args.algos = {"allreduce": "ring,recdbl,rabenseifner", "allgather": "ring,recdbl",
                      "broadcast": "ring,tree"}[args.collective]
    if args.worker:
        return worker(args)
    if args.vote_worker:
        return vote_worker(args)
    algos = args.algos.split(",")
    results = [(run_vote if args.vote else run)(n, args) for n in args.np]
    print(table(results, algos, args.size, "vote" if args.vote else args.collective))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
