"""Fault trials on the namespace cluster (2 hosts x 2 ranks), and the fault
table: run as a script for the full table, imported by
tests/run/test_cluster_faults.py for a CI-sized subset.

    python tests/cluster_faults.py --trials 10 --json faults.json

Each trial starts a fresh job with the env-var bootstrap, waits until every
rank loops over its collective, injects the fault at a random point (large
tensors in small chunks, so a random point is mostly mid-chunk), and then
waits, with a deadline, for every surviving rank to fail. A trial passes
when every survivor raised an error naming a failed rank or host within the
bound (TFRING_HEARTBEAT_TIMEOUT's 10 s for a dead process or a cut link,
TFRING_TIMEOUT for a stopped rank) and exited non-zero on its own; a
survivor still running after the bound plus a margin is a hang.
"""

import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import cluster  # noqa: E402

DEAD_BOUND_S = 10.0
STALL_TIMEOUT_S = 5.0
HANG_MARGIN_S = 20.0
RANKS_PER_HOST = 2
EXTRA_ENV = {}  # --env K=V: set in every rank of every trial

# name -> (worker op, fault kind, victim host index or None)
SCENARIOS = {
    "kill rank on host1, allreduce": ("allreduce", "kill", 0),
    "kill rank on host2, allreduce": ("allreduce", "kill", 1),
    "kill rank on host1, allgather": ("allgather", "kill", 0),
    "kill rank on host2, allgather": ("allgather", "kill", 1),
    "kill rank on host1, broadcast": ("broadcast", "kill", 0),
    "kill rank on host2, broadcast": ("broadcast", "kill", 1),
    "kill rank on host1, negotiation": ("allreduce", "kill-negotiation", 0),
    "kill rank on host2, negotiation": ("allreduce", "kill-negotiation", 1),
    "link cut mid-transfer": ("allreduce", "cut", 1),
    "stalled rank (SIGSTOP)": ("allreduce", "stop", None),
    "stalled coordinator, rank 0 (SIGSTOP)": ("allreduce", "stop", 0),
    "store host dies during start-up": ("allreduce", "store-host", 0),
    "kill a rank under tfring-run -H (ssh)": ("allreduce", "launcher", None),
}


def _wait_ready(result_dir, size, procs, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(os.path.exists(os.path.join(result_dir, f"{r}.ready")) for r in range(size)):
            return True
        if any(p.poll() is not None for p in procs):
            return False
        time.sleep(0.01)
    return False


def _named_ranks(message):
    """Ranks a message names: "rank 3", "ranks [2, 3]"."""
    named = {int(r) for r in re.findall(r"\brank (\d+)\b", message)}
    for group in re.findall(r"\branks \[([\d, ]+)\]", message):
        named |= {int(r) for r in group.replace(",", " ").split()}
    return named


def _names_failure(message, failed_ranks, failed_hosts):
    if _named_ranks(message) & set(failed_ranks):
        return True
    for h in failed_hosts:
        if h.addr in message or re.search(rf"\b{h.name}\b", message):
            return True
    return False


def launcher_trial(c, rng):
    """tfring-run -H host1:2,host2:2 over sshd; a random rank SIGKILLs itself
    at a random point. The launcher must name it and exit non-zero, and the
    ranks that reported must name it, all within the bound."""
    if not getattr(c, "sshd_started", False):
        cluster.start_sshd(c)
        c.sshd_started = True
    size = RANKS_PER_HOST * len(c.hosts)
    victim = rng.randrange(size)
    kill_after = rng.uniform(0.2, 1.2)
    result_dir = tempfile.mkdtemp(prefix="tfring-fault-")
    env = cluster.launch_env(TFRING_RESULT_DIR=result_dir, TFRING_TIMEOUT=60,
                             KILL_RANK=victim, KILL_AFTER=kill_after)
    argv = [cluster.PYTHON, "-m", "tfring.run", "-np", str(size), "-H",
            ",".join(f"{h.name}:{RANKS_PER_HOST}" for h in c.hosts),
            "-x", "PYTHONPATH", "-x", "TFRING_RESULT_DIR", "-x", "KILL_RANK", "-x", "KILL_AFTER",
            "--timeout", "120", cluster.PYTHON, cluster.WORKER, "fault", "allreduce"]
    p = c.hosts[0].popen(argv, env=env, cwd=cluster.ROOT, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    problems, hang = [], False
    try:
        _, err = p.communicate(timeout=60 + DEAD_BOUND_S + HANG_MARGIN_S)
    except subprocess.TimeoutExpired:
        c.kill(p)
        _, err = p.communicate()
        hang = True
        problems.append("hang: the launcher did not exit")
    t_exit = time.time()
    ready = os.path.join(result_dir, f"{victim}.ready")
    if not os.path.exists(ready):
        return {"ok": False, "hang": hang, "slowest": None,
                "problems": problems + [f"job did not start: {err[-800:]}"]}
    t_fault = os.path.getmtime(ready) + kill_after
    slowest = t_exit - t_fault
    if p.returncode in (0, 124):
        problems.append(f"launcher exit code {p.returncode}")
    if not re.search(rf"\brank {victim}\b", err):
        problems.append(f"launcher output does not name rank {victim}: {err[-500:]}")
    reps = cluster.read_reports(result_dir, size)
    messages = {}
    for r, rep in enumerate(reps):
        if r == victim or rep is None:
            continue  # the launcher may stop a survivor before it reports
        messages[r] = rep["message"]
        slowest = max(slowest, rep["t_error"] - t_fault)
        if not _names_failure(rep["message"], {victim}, []):
            problems.append(f"rank {r}: message names no failed rank/host: {rep['message']}")
    if slowest > DEAD_BOUND_S:
        problems.append(f"launcher exited {slowest:.1f} s after the kill")
    return {"ok": not problems, "hang": hang, "slowest": slowest,
            "problems": [f"(victim rank {victim}) {x}" for x in problems], "messages": messages}


def trial(c, scenario, rng):
    """Runs one trial; returns a dict (ok, hang, slowest, problems)."""
    op, kind, host_index = SCENARIOS[scenario]
    if kind == "launcher":
        return launcher_trial(c, rng)
    size = RANKS_PER_HOST * len(c.hosts)
    env = {"TFRING_TIMEOUT": "60", "TFRING_CHUNK_SIZE": str(rng.choice([4096, 65536])),
           "FAULT_ELEMS": str(1 << 20)}
    if kind == "stop":
        env["TFRING_TIMEOUT"] = str(STALL_TIMEOUT_S)
    env.update(EXTRA_ENV)
    victim = None
    if kind == "stop" and host_index == 0:
        victim = 0
    elif host_index is not None and kind.startswith("kill"):
        victim = host_index * RANKS_PER_HOST + rng.randrange(RANKS_PER_HOST)
    elif kind == "stop":
        victim = rng.randrange(1, size)
    if kind == "kill-negotiation":
        env.update(VICTIM=victim, STALL_BEFORE_SUBMIT=1)
    result_dir = tempfile.mkdtemp(prefix="tfring-fault-")
    store, procs = cluster.start_ranks(c, RANKS_PER_HOST, ["fault", op], result_dir, env=env)
    failed_ranks, failed_hosts = set(), []
    try:
        if kind == "store-host":
            time.sleep(rng.uniform(0.0, 1.5))  # somewhere in start-up
            t_fault = time.time()
            c.hosts[host_index].link_down()
            cluster._kill_netns_processes(c.hosts[host_index].ns)
            failed_hosts = [c.hosts[host_index]]
            failed_ranks = {r for r in range(size) if r // RANKS_PER_HOST == host_index}
        else:
            if not _wait_ready(result_dir, size, procs, 60):
                outs = cluster.wait_all(c, procs, 30)
                return {"ok": False, "hang": False, "slowest": None,
                        "problems": [f"job did not start: {[o[-800:] for o in outs]}"]}
            time.sleep(rng.uniform(0.0, 1.0))
            t_fault = time.time()
            if kind in ("kill", "kill-negotiation"):
                os.kill(procs[victim].pid, signal.SIGKILL)
                failed_ranks = {victim}
            elif kind == "stop":
                os.kill(procs[victim].pid, signal.SIGSTOP)
                failed_ranks = {victim}
            elif kind == "cut":
                c.hosts[host_index].link_down()
                # Either side may report the other: no rank failed, a link did.
                failed_hosts = list(c.hosts)
                failed_ranks = set(range(size))
        bound = STALL_TIMEOUT_S + 5.0 if kind == "stop" else DEAD_BOUND_S
        survivors = [r for r in range(size)
                     if r not in failed_ranks or kind == "cut"]
        if kind == "stop":
            survivors = [r for r in range(size) if r != victim]
        hang = False
        deadline = time.monotonic() + bound + HANG_MARGIN_S
        for r in survivors:
            try:
                procs[r].wait(timeout=max(0.1, deadline - time.monotonic()))
            except Exception:  # noqa: BLE001 - subprocess.TimeoutExpired
                hang = True
        for p in procs:
            c.kill(p)
        c.kill(store)
        reps = cluster.read_reports(result_dir, size)
        problems, slowest = [], 0.0
        for r in survivors:
            rep = reps[r]
            rc = procs[r].wait()
            if rep is None or not rep.get("error"):
                problems.append(f"rank {r}: no error reported (exit {rc})")
                continue
            dt = rep["t_error"] - t_fault
            slowest = max(slowest, dt)
            if rc == 0 or rc < 0 and rc != -signal.SIGKILL:
                problems.append(f"rank {r}: exit code {rc}")
            if dt > bound:
                problems.append(f"rank {r}: error after {dt:.1f} s > {bound} s: {rep['message']}")
            if not _names_failure(rep["message"], failed_ranks - {r}, failed_hosts):
                problems.append(f"rank {r}: message names no failed rank/host: {rep['message']}")
        if hang:
            problems.append("hang")
        tag = f"(victim rank {victim}) " if victim is not None else ""
        return {"ok": not problems, "hang": hang, "slowest": slowest,
                "problems": [tag + x for x in problems],
                "messages": {r: (reps[r] or {}).get("message") for r in survivors}}
    finally:
        for p in procs:
            if kind == "stop":
                try:
                    os.kill(p.pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass
            c.kill(p)
        c.kill(store)
        for h in c.hosts:
            h.link_up()


def run_table(scenarios, trials, seed=0, log=print):
    rng = random.Random(seed)
    rows = []
    for name in scenarios:
        row = {"scenario": name, "trials": 0, "slowest_s": 0.0, "hangs": 0, "failures": 0,
               "problems": [], "example_message": None}
        for _ in range(trials):
            with cluster.Cluster(2) as c:
                res = trial(c, name, rng)
            row["trials"] += 1
            row["hangs"] += int(res["hang"])
            row["failures"] += int(not res["ok"])
            row["slowest_s"] = max(row["slowest_s"], res["slowest"] or 0.0)
            row["problems"] += res["problems"]
            if row["example_message"] is None and res.get("messages"):
                row["example_message"] = next(iter(res["messages"].values()))
        log(f"{name:34s} {row['trials']:3d} {row['slowest_s']:7.2f} {row['hangs']:3d} "
            f"{row['failures']:3d}")
        rows.append(row)
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None)
    ap.add_argument("-k", default="", help="only scenarios containing this text")
    ap.add_argument("--env", action="append", default=[], metavar="K=V",
                    help="set K=V in every rank (e.g. TFRING_HEARTBEAT_TIMEOUT=0); repeatable")
    args = ap.parse_args()
    EXTRA_ENV.update(item.split("=", 1) for item in args.env)
    why = cluster.why_unavailable()
    if why:
        sys.exit(f"cannot build the cluster: {why}")
    cluster.cleanup_leftovers()
    # Killed by SIGTERM: unwind, so that the cluster of the trial is removed.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    names = [n for n in SCENARIOS if args.k in n]
    print(f"{'scenario':34s} {'n':>3s} {'slowest':>7s} {'hang':>3s} {'bad':>3s}")
    rows = run_table(names, args.trials, args.seed)
    print()
    print("| scenario | trials | slowest time to error (s) | hangs | failed trials |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['scenario']} | {r['trials']} | {r['slowest_s']:.2f} | {r['hangs']} | "
              f"{r['failures']} |")
    for r in rows:
        for p in r["problems"][:5]:
            print(f"  {r['scenario']}: {p}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    sys.exit(1 if any(r["failures"] for r in rows) else 0)


if __name__ == "__main__":
    main()
