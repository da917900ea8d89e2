"""Recovery time after a host's death: elastic re-formation vs --restarts.

    python benchmarks/elastic_bench.py [--repeats 3] [--no-tf] [--cluster]

Both jobs run the same training loop on 6 ranks, 3 hosts x 2 slots: loopback
addresses of this machine (127.0.0.1-3), or with --cluster network-namespace
hosts started over ssh (tests/cluster.py, needs root), allreducing a float32 gradient of
--params values per step and committing every --commit-every steps. At step
--kill-step the two ranks of the second host SIGKILL themselves.

  * elastic: ``tfring-run --min-np 2 --max-np 6 --host-discovery-script``;
    the 4 survivors roll back to the last commit, re-form and continue.
  * restarts: ``tfring-run -np 6 --restarts 1``; every rank is stopped and
    the whole job started again, resuming from rank 0's last checkpoint
    file (the same commit points).

Measured from the first SIGKILL (the victim prints the time just before
it) to the end of the first step completed after recovery, on rank 0:
  * rejoined: the survivors are in the new membership (elastic) / the new
    processes finished tfring.init() (restarts);
  * resumed: the first training step after recovery completed;
  * redone: steps lost since the last commit.
The ranks import TensorFlow unless --no-tf, as a training script does; a
restart pays for that import again, a re-formation does not.
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


# ------------------------------------------------------------- the ranks --

def worker(a):
    import signal

    import numpy as np

    if not a.no_tf:
        import tensorflow  # noqa: F401 - what a real training script pays for

    import tfring
    from tfring import _core

    tfring.init()
    host = os.environ.get("TFRING_HOSTNAME", "")
    restart = int(os.environ.get("TFRING_RESTART", "0"))
    victim = host == a.victim_host if a.mode == "elastic" else tfring.rank() in (2, 3)

    def now():
        return f"{time.time():.6f}"

    def step_once(state):
        if victim and restart == 0 and state["first"] and state["step"] == a.kill_step:
            print(f"KILL {now()}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        grad = np.full(a.params, 1e-3 * (tfring.rank() + 1), np.float32)
        state["w"] -= 0.1 * _core.allreduce(grad, op="average", name="grad")
        state["step"] += 1
        time.sleep(a.step_sleep)
        if tfring.rank() == 0:
            print(f"STEP {now()} {tfring.size()} {state['step']}", flush=True)

    if a.mode == "elastic":
        st = tfring.elastic.ObjectState(w=np.zeros(a.params, np.float32), step=0)
        first = [True]

        @tfring.elastic.run
        def train(state):
            if tfring.rank() == 0:
                print(f"JOIN {now()} {tfring.size()} {state.step}", flush=True)
            while state.step < a.steps:
                d = {"w": state.w, "step": state.step, "first": first[0]}
                step_once(d)
                state.w, state.step = d["w"], d["step"]
                if state.step % a.commit_every == 0:
                    if state.step > a.kill_step:
                        first[0] = False
                    state.commit()

        train(st)
    else:
        ckpt = os.path.join(a.workdir, "ckpt.npz")
        d = {"w": np.zeros(a.params, np.float32), "step": 0, "first": True}
        if os.path.exists(ckpt):
            z = np.load(ckpt)
            d["w"], d["step"] = z["w"].copy(), int(z["step"])
        if tfring.rank() == 0:
            print(f"JOIN {now()} {tfring.size()} {d['step']}", flush=True)
        while d["step"] < a.steps:
            step_once(d)
            if d["step"] % a.commit_every == 0 and tfring.rank() == 0:
                np.savez(ckpt + ".tmp.npz", w=d["w"], step=d["step"])
                os.replace(ckpt + ".tmp.npz", ckpt)
    tfring.shutdown()


# ------------------------------------------------------------ the driver --

def run_job(a, mode, cluster=None):
    names = [h.name for h in cluster.hosts] if cluster else ["127.0.0.1", "127.0.0.2",
                                                             "127.0.0.3"]
    with tempfile.TemporaryDirectory() as work:
        os.chmod(work, 0o755)
        hosts = os.path.join(work, "hosts.txt")
        with open(hosts, "w") as f:
            f.write("".join(f"{n}:2\n" for n in names))
        me = [sys.executable, os.path.abspath(__file__), "--worker", "--mode", mode,
              "--workdir", work, "--params", str(a.params), "--steps", str(a.steps),
              "--kill-step", str(a.kill_step), "--commit-every", str(a.commit_every),
              "--step-sleep", str(a.step_sleep), "--victim-host", names[1]] + \
            (["--no-tf"] if a.no_tf else [])
        if mode == "elastic":
            launch = ["--min-np", "2", "--max-np", "6", "--host-discovery-script",
                      f"cat {hosts}"]
        else:
            launch = ["-np", "6", "--restarts", "1", "-H", ",".join(f"{n}:2" for n in names)]
        env = {k: v for k, v in os.environ.items() if not k.startswith("TFRING_")}
        env.update(TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1",
                   PYTHONPATH=os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH"))
                                              if p))
        forward = [x for k in ("PYTHONPATH", "TF_CPP_MIN_LOG_LEVEL", "CUDA_VISIBLE_DEVICES",
                               "OMP_NUM_THREADS") for x in ("-x", k)]
        argv = [sys.executable, "-m", "tfring.run", *launch, *forward, *me]
        if cluster:
            out = cluster.hosts[0].run(argv, env=env, cwd=work, timeout=600)
        else:
            out = subprocess.run(argv, env=env, cwd=work, capture_output=True, text=True,
                                 timeout=600)
    text = out.stdout + out.stderr
    if out.returncode != 0:
        raise RuntimeError(f"{mode} job failed ({out.returncode}):\n{text[-4000:]}")
    kill = min(float(t) for t in re.findall(r"KILL (\S+)", text))
    joins = [(float(t), int(n), int(s)) for t, n, s in re.findall(r"JOIN (\S+) (\d+) (\d+)", text)]
    steps = [(float(t), int(n), int(s)) for t, n, s in
             re.findall(r"STEP (\S+) (\d+) (\d+)", text)]
    rejoin = min(t for t, _, _ in joins if t > kill)
    resumed_from = min((t, s) for t, _, s in joins if t > kill)[1]
    first = min(t for t, _, _ in steps if t > rejoin)
    before = max(s for t, _, s in steps if t < rejoin)  # steps done before recovery
    return {"rejoined": rejoin - kill, "resumed": first - kill, "redone": before - resumed_from}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--mode", default="elastic", help=argparse.SUPPRESS)
    p.add_argument("--workdir", default=".", help=argparse.SUPPRESS)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--params", type=int, default=1 << 20, help="gradient size (float32)")
    p.add_argument("--steps", type=int, default=80)
    p.add_argument("--kill-step", type=int, default=25)
    p.add_argument("--commit-every", type=int, default=10)
    p.add_argument("--step-sleep", type=float, default=0.02, help="simulated compute per step")
    p.add_argument("--no-tf", action="store_true", help="ranks do not import TensorFlow")
    p.add_argument("--cluster", action="store_true",
                   help="3 network-namespace hosts over ssh (tests/cluster.py; needs root) "
                   "instead of loopback addresses of this machine")
    p.add_argument("--victim-host", default="127.0.0.2", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker:
        return worker(a)
    c = None
    if a.cluster:
        sys.path.insert(0, os.path.join(REPO, "tests"))
        import cluster

        cluster.cleanup_leftovers()
        c = cluster.Cluster(3)
        cluster.start_sshd(c)
    rows = {}
    try:
        for mode in ("elastic", "restarts"):
            rows[mode] = _measure(a, mode, c)
    finally:
        if c is not None:
            c.close()
    where = "3 namespace hosts x 2, over ssh" if c else "3 hosts x 2 on one machine"
    print(f"6 ranks ({where}), {a.params * 4 / 2**20:.0f} MiB gradient, "
          f"TensorFlow {'not ' if a.no_tf else ''}imported, commit every {a.commit_every} "
          f"steps, killed at step {a.kill_step}; median of {a.repeats}\n")
    print("| recovery | death -> rejoined | death -> training resumed | steps redone |")
    print("|---|---|---|---|")
    for mode, label in (("elastic", "elastic (4 survivors re-form)"),
                        ("restarts", "`--restarts 1` (6 new processes)")):
        r = rows[mode]
        print(f"| {label} | {r['rejoined']:.2f} s | {r['resumed']:.2f} s | {r['redone']:.0f} |")
    return 0


def _measure(a, mode, c):
    runs = [run_job(a, mode, c) for _ in range(a.repeats)]
    print(f"{mode}: " + "; ".join(
        f"run {i}: rejoined {r['rejoined']:.2f} s, resumed {r['resumed']:.2f} s"
        for i, r in enumerate(runs)), file=sys.stderr)
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


if __name__ == "__main__":
    sys.exit(main())
