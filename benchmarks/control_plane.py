#!/usr/bin/env python3
"""Start-up and the control plane as ranks grow: init time after the last
arrival, each rank's open fds, threads and memory, the store's and the
coordinator's connections, and a small allreduce.

    python benchmarks/control_plane.py --np 8,16,32,64
    sudo python benchmarks/control_plane.py --np 128 --per-host 4   # namespace hosts

N core-only ranks (no TensorFlow) join with the env-var bootstrap
(TFRING_RANK/SIZE/STORE_ADDR) against a TCP store served by this process.
With --per-host L the ranks run on N/L network-namespace hosts
(tests/cluster.py; needs root), L per host, the store on the first host;
without it, on this machine's loopback (--sim-per-host L: every L
consecutive ranks take one host name, so they link as hosts do). Each rank records:

- ``arrive``: the wall clock right before ``tfring.basics.init()``,
  ``done``: right after it returns, ``first_done``: after the first
  allreduce (which opens the links it needs: they open on first use).
  "init after the last arrival" is max(done) - max(arrive): the
  rendezvous itself, without the seconds N Python processes take to start
  on a small machine;
- /proc/self: open fds (sockets among them), threads and VmRSS, before
  init and after it (the difference is what the job costs a rank);
- ``--iters`` float32 sum allreduces of ``--size`` bytes (TFRING_ALLREDUCE_ALGO
  auto unless --algo), the slowest rank's mean per call after a warm-up,
  and the algorithm that ran (``_core.last_collective_stats()``).

The store server's connections and threads are this process's sockets and
threads while the ranks run (sampled every 20 ms; its baseline subtracted).
With more ranks than cores every step is a context switch: compare trends,
not absolute values.
"""

import argparse
import json
import os
import resource
import secrets
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from _common import child_env, parse_ints, parse_size  # noqa: E402


def proc_self():
    """(fds, sockets, threads, rss bytes) of this process."""
    fds = os.listdir("/proc/self/fd")
    socks = 0
    for fd in fds:
        try:
            socks += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
        except OSError:
            pass
    threads = rss = 0
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("Threads:"):
                threads = int(line.split()[1])
            elif line.startswith("VmRSS:"):
                rss = int(line.split()[1]) * 1024
    return {"fds": len(fds), "sockets": socks, "threads": threads, "rss": rss}


def worker(args):
    import numpy as np

    import tfring.basics as basics
    from tfring import _core

    before = proc_self()
    arrive = time.time()
    basics.init()
    done = time.time()
    after = proc_self()
    rank, n = basics.rank(), basics.size()
    x = np.full(args.size // 4, rank + 1, np.float32)
    for i in range(3):  # warm-up (and the fast path's cache)
        y = _core.allreduce(x, op="sum", name="cp.small")
        if i == 0:
            # Links open when first used: the first call pays for those it
            # needs, so start-up ends here for a user.
            first_done = time.time()
    ok = bool(np.all(y == n * (n + 1) / 2))
    st = _core.last_collective_stats()
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    for i in range(args.iters):
        _core.allreduce(x, op="sum", name="cp.small", out=x)
        x[:] = rank + 1
    per_call = (time.perf_counter() - t0) / args.iters
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    # What a call costs this rank (every thread): CPU time and context
    # switches, the currency of an oversubscribed host.
    cpu_call = (r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime) / args.iters
    switches_call = (r1.ru_nvcsw + r1.ru_nivcsw - r0.ru_nvcsw - r0.ru_nivcsw) / args.iters
    rep = {"rank": rank, "size": n, "arrive": arrive, "done": done,
           "first_done": first_done, "before": before,
           "after": after, "allreduce_s": per_call, "ok": ok, "algo": st["algo"],
           "cpu_per_call_s": cpu_call, "switches_per_call": switches_call,
           "voluntary_per_call": (r1.ru_nvcsw - r0.ru_nvcsw) / args.iters,
           "local_rank": basics.local_rank(),
           "hops": st["hops"], "local_size": basics.local_size(),
           "cross_size": basics.cross_size()}
    with open(os.path.join(args.out, f"{rank}.json"), "w") as f:
        json.dump(rep, f)
    basics.shutdown()
    return 0


class Sampler(threading.Thread):
    """The most sockets and threads this process held while the ranks ran."""

    def __init__(self):
        super().__init__(daemon=True)
        now = proc_self()
        self.base, self.base_threads = now["sockets"], now["threads"] + 1  # + this sampler
        self.peak, self.peak_threads = self.base, self.base_threads
        self.stop = threading.Event()

    def run(self):
        while not self.stop.wait(0.02):
            now = proc_self()
            self.peak = max(self.peak, now["sockets"])
            self.peak_threads = max(self.peak_threads, now["threads"])


def rank_env(r, n, addr, secret, out, args):
    env = child_env()
    env = {k: v for k, v in env.items() if not k.startswith(("TFRING_", "OMPI_", "PMI"))}
    env.update(PYTHONPATH=args.tree + os.pathsep + env.get("PYTHONPATH", ""), OMP_NUM_THREADS="1",
               TFRING_RANK=str(r), TFRING_SIZE=str(n), TFRING_SECRET=secret,
               TFRING_STORE_ADDR=addr, TFRING_TIMEOUT=str(args.rank_timeout))
    if args.algo:
        env["TFRING_ALLREDUCE_ALGO"] = args.algo
    if args.sim_per_host:
        env["TFRING_HOSTNAME"] = f"host{r // args.sim_per_host}"
    env.update(kv.split("=", 1) for kv in args.env)
    return env


def cmd(out, args):
    return ["nice", "-n", str(args.nice), sys.executable, os.path.abspath(__file__), "--worker",
            "--out", out, "--size", str(args.size), "--iters", str(args.iters)]


def run(n, args):
    from tfring import _core

    secret = secrets.token_hex(16)
    with tempfile.TemporaryDirectory(prefix="tfring-cp-") as out:
        cluster = None
        if args.per_host:
            sys.path.insert(0, os.path.join(REPO, "tests"))
            import cluster as clu

            why = clu.why_unavailable()
            if why:
                raise SystemExit(f"control_plane: --per-host needs namespace hosts: {why}")
            clu.cleanup_leftovers()
            if n % args.per_host:
                raise SystemExit(f"--per-host {args.per_host} does not divide {n} ranks")
            cluster = clu.Cluster(n // args.per_host)
        try:
            if cluster:
                store = clu.start_store(cluster.hosts[0], secret)
                addr = f"{cluster.hosts[0].addr}:{clu.STORE_PORT}"
                sampler = None
            else:
                server = _core.TcpStoreServer("127.0.0.1", 0, secret)
                addr = f"127.0.0.1:{server.port}"
                sampler = Sampler()
                sampler.start()
            procs = []
            for r in range(n):
                env = rank_env(r, n, addr, secret, out, args)
                if cluster:
                    h = cluster.hosts[r // args.per_host]
                    procs.append(h.popen(cmd(out, args), env=env, stdin=subprocess.DEVNULL))
                else:
                    procs.append(subprocess.Popen(cmd(out, args), env=env,
                                                  stdin=subprocess.DEVNULL,
                                                  start_new_session=True))
            deadline = time.monotonic() + args.timeout
            try:
                for p in procs:
                    p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                for p in procs:
                    if p.poll() is None:
                        os.killpg(p.pid, 9)
                raise SystemExit(f"control_plane: {n} ranks ran past --timeout {args.timeout:g} s")
            if sampler:
                sampler.stop.set()
            bad = [r for r, p in enumerate(procs) if p.returncode]
            if bad:
                raise SystemExit(f"control_plane: rank(s) {bad[:10]} of {n} failed")
            reps = []
            for r in range(n):
                with open(os.path.join(out, f"{r}.json")) as f:
                    reps.append(json.load(f))
        finally:
            if cluster:
                cluster.close()
    return summarize(n, reps, sampler, args)


def summarize(n, reps, sampler, args):
    last = max(r["arrive"] for r in reps)
    delta = {k: [r["after"][k] - r["before"][k] for r in reps]
             for k in ("fds", "sockets", "threads", "rss")}
    row = {
        "np": n, "hosts": reps[0]["cross_size"], "per_host": reps[0]["local_size"],
        "init_after_last_s": max(r["done"] for r in reps) - last,
        "init_slowest_s": max(r["done"] - r["arrive"] for r in reps),
        "first_call_after_last_s": max(r["first_done"] for r in reps) - last,
        "start_spread_s": last - min(r["arrive"] for r in reps),
        "allreduce_s": max(r["allreduce_s"] for r in reps),
        "allreduce_algo": sorted({r["algo"] for r in reps}),
        "allreduce_hops": reps[0]["hops"], "allreduce_ok": all(r["ok"] for r in reps),
        "rank0": {k: reps[0]["after"][k] - reps[0]["before"][k] for k in delta},
    }
    # Per call of the small allreduce, the mean over local ranks 0 (who
    # speak for their host in the host vote) and over the others.
    for role, pick in (("leader", lambda r: r["local_rank"] == 0),
                       ("other", lambda r: r["local_rank"] != 0)):
        sel = [r for r in reps if pick(r)] or reps
        row[f"cpu_per_call_us_{role}"] = 1e6 * sum(r["cpu_per_call_s"] for r in sel) / len(sel)
        row[f"switches_per_call_{role}"] = sum(r["switches_per_call"] for r in sel) / len(sel)
        row[f"voluntary_per_call_{role}"] = sum(r["voluntary_per_call"] for r in sel) / len(sel)
    others = reps[1:] or reps
    for k in delta:
        vals = [r["after"][k] - r["before"][k] for r in others]
        row[f"{k}_max"] = max(vals)
        row[f"{k}_mean"] = sum(vals) / len(vals)
    if sampler:
        row["store_sockets_peak"] = sampler.peak - sampler.base
        row["store_threads_peak"] = sampler.peak_threads - sampler.base_threads
    return row


def table(rows, size):
    lines = ["| ranks | hosts x per host | init after last arrival (s) "
             "| first allreduce done after last arrival (s) | slowest init (s) "
             "| fds / sockets / threads per rank (+init) | RSS per rank (+MiB) "
             "| rank 0 fds / sockets / threads | store server sockets / threads (peak) "
             f"| {size} B allreduce (ms, algo, hops) "
             "| per call: CPU us / switches, local rank 0 | the other ranks |",
             "|---:|---|---:|---:|---:|---|---:|---|---:|---|---:|---:|"]
    for r in rows:
        z = r["rank0"]
        lines.append(
            f"| {r['np']} | {r['hosts']} x {r['per_host']} | {r['init_after_last_s']:.3f} "
            f"| {r['first_call_after_last_s']:.3f} | {r['init_slowest_s']:.2f} "
            f"| {r['fds_max']} / {r['sockets_max']} / "
            f"{r['threads_max']} | {r['rss_max'] / 2**20:.1f} | {z['fds']} / {z['sockets']} / "
            f"{z['threads']} | {r.get('store_sockets_peak', '-')} / "
            f"{r.get('store_threads_peak', '-')} "
            f"| {r['allreduce_s'] * 1e3:.2f} ({','.join(r['allreduce_algo'])}, "
            f"{r['allreduce_hops']}) "
            f"| {r['cpu_per_call_us_leader']:.0f} / {r['switches_per_call_leader']:.1f} "
            f"| {r['cpu_per_call_us_other']:.0f} / {r['switches_per_call_other']:.1f} |")
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--np", type=parse_ints, default=[8, 16, 32, 64])
    p.add_argument("--per-host", type=int, default=0,
                   help="ranks per namespace host (0: all on this machine's loopback)")
    p.add_argument("--sim-per-host", type=int, default=0,
                   help="on loopback, name every L consecutive ranks one host "
                   "(TFRING_HOSTNAME): TCP and point-to-point links between them")
    p.add_argument("--size", type=parse_size, default=4096)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--algo", default="", help="TFRING_ALLREDUCE_ALGO for the ranks (auto)")
    p.add_argument("--env", action="append", default=[],
                   help="KEY=VALUE for every rank (repeatable), e.g. TFRING_LOG_LEVEL=0")
    p.add_argument("--tree", default=REPO, help="the tfring checkout the ranks import "
                   "(default this one): compare two builds")
    p.add_argument("--nice", type=int, default=5)
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--rank-timeout", type=float, default=120)
    p.add_argument("--json")
    p.add_argument("--worker", action="store_true")
    p.add_argument("--out")
    args = p.parse_args()
    if args.worker:
        return worker(args)
    rows = []
    for n in args.np:
        rows.append(run(n, args))
        print(json.dumps(rows[-1]), flush=True)
    print(table(rows, args.size))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
