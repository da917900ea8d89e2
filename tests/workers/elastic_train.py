"""Elastic linear-regression training on numpy and the core (no TensorFlow).

Step s of a job of n ranks: rank r's example depends on (s, r, n) only, its
gradient is averaged over the ranks, so the weights depend on the sequence
of sizes alone. That sequence is part of the committed state ("sizes"), so
rank 0 of the last membership reports what a numpy replay must reproduce
(tests/run/test_elastic.py: reference()).

Environment: STEPS (total steps), COMMIT_EVERY, STEP_SLEEP (s per step),
KILL_HOST/KILL_STEP (the ranks on that host SIGKILL themselves before step
KILL_STEP of their first membership), GROW_FILE/GROW_LINES/GROW_STEP (rank 0
rewrites the discovery file at that step, then trains on until 4 steps ran
on GROW_SIZE ranks), FLAG_FILE/FLAG_STEP (rank 0 creates the file at that step), KILL_WIDS (these
workers SIGKILL themselves 4 steps after they join), STOP_WIDS (the same
with SIGSTOP: hung, not dead), UNTIL_WID (train on until
that worker is a member), FAIL_STEP (every rank raises a ValueError naming
itself at that step: a script error everywhere), EXIT_STAGGER (s: after
training, rank r waits r * EXIT_STAGGER, or (size - 1 - r) * -EXIT_STAGGER
when negative, and exits without tfring.shutdown() (it runs at exit): ranks
leave at different times).
"""

import json
import os
import signal
import sys
import time

import numpy as np

import tfring
from tfring import _core

DIM = 8
LR = 0.05


def example(step, rank, size):
    rng = np.random.default_rng(1000003 * step + 1009 * rank + size)
    x = rng.standard_normal(DIM)
    y = float(x @ np.arange(1, DIM + 1) / DIM) + 0.1 * rng.standard_normal()
    return x, y


def env_int(name, default=-1):
    return int(os.environ.get(name, default))


STEPS = env_int("STEPS", 30)
COMMIT_EVERY = env_int("COMMIT_EVERY", 2)
SLEEP = float(os.environ.get("STEP_SLEEP", "0.05"))
HOST = os.environ.get("TFRING_HOSTNAME")
WID = int(os.environ.get("TFRING_ELASTIC_ID", "-1"))
KILL_WIDS = [int(w) for w in os.environ.get("KILL_WIDS", "").split(",") if w]
STOP_WIDS = [int(w) for w in os.environ.get("STOP_WIDS", "").split(",") if w]


def membership():
    return tfring.elastic._worker._worker.record


def resources():
    """What this process holds: open fds, threads, mapped /dev/shm segments."""
    with open("/proc/self/maps") as f:
        shm = {line.split()[-1] for line in f if "/dev/shm/" in line}
    return {"fds": len(os.listdir("/proc/self/fd")), "threads": len(os.listdir("/proc/self/task")),
            "shm": len(shm)}


def main():
    tfring.init()
    first_epoch = True
    state = tfring.elastic.ObjectState(w=np.zeros(DIM), step=0, sizes=[])
    since_join = [0]

    def joined():
        since_join[0] = 0
        print("JOIN " + json.dumps({"rank": tfring.rank(), "size": tfring.size(),
                                    "pid": os.getpid(), "wid": WID, "step": state.step,
                                    "host": HOST, "epoch": membership()["epoch"],
                                    **resources()}), flush=True)

    state.register_reset_callbacks([lambda: print(f"RESET pid={os.getpid()}", flush=True)])

    @tfring.elastic.run
    def train(state):
        nonlocal first_epoch
        joined()
        grow = env_int("GROW_SIZE")
        while state.step < STEPS or (grow > 0 and state.sizes.count(grow) < 4 and
                                     state.step < 2000) or (
                                         max(membership()["members"]) < env_int("UNTIL_WID")
                                         and state.step < 2000):
            s, r, n = state.step, tfring.rank(), tfring.size()
            since_join[0] += 1
            if WID in KILL_WIDS and since_join[0] == 4:
                os.kill(os.getpid(), signal.SIGKILL)
            if WID in STOP_WIDS and since_join[0] == 4:
                os.kill(os.getpid(), signal.SIGSTOP)  # hung, not dead
            if first_epoch and HOST == os.environ.get("KILL_HOST") and s == env_int("KILL_STEP"):
                os.kill(os.getpid(), signal.SIGKILL)
            if r == 0 and s == env_int("GROW_STEP") and os.environ.get("GROW_FILE"):
                with open(os.environ["GROW_FILE"], "w") as f:
                    f.write(os.environ["GROW_LINES"].replace(",", "\n") + "\n")
            if r == 0 and s == env_int("FLAG_STEP") and os.environ.get("FLAG_FILE"):
                open(os.environ["FLAG_FILE"], "w").close()
            if s == env_int("FAIL_STEP"):
                raise ValueError(f"step {s} failed on rank {r} (worker {WID})")
            x, y = example(s, r, n)
            grad = (x @ state.w - y) * x
            avg = _core.allreduce(grad, op="average", name="grad")
            state.w = state.w - LR * avg
            state.sizes = state.sizes + [n]
            state.step = s + 1
            time.sleep(SLEEP)
            if state.step % COMMIT_EVERY == 0:
                if state.step > env_int("KILL_STEP", 10 ** 9):
                    first_epoch = False
                state.commit()
        state.commit()
        return state.w

    w = train(state)
    if tfring.rank() == 0:
        print("RESULT " + json.dumps({"w": w.tolist(), "sizes": state.sizes,
                                      "size": tfring.size(), "pid": os.getpid()}), flush=True)
    if "EXIT_STAGGER" in os.environ:  # exit as Horovod's examples do: shutdown at exit
        stagger = float(os.environ["EXIT_STAGGER"])
        order = tfring.rank() if stagger >= 0 else tfring.size() - 1 - tfring.rank()
        time.sleep(abs(stagger) * order)
        return
    tfring.shutdown()


if __name__ == "__main__":
    main()
