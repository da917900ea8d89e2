"""Rank worker for tests/core/test_resilience.py: resource use over many
collectives and over init/shutdown cycles.

argv: "collectives" ITERATIONS WARMUP, "unnamed" ITERATIONS WARMUP, or
"cycles" COUNT.

collectives: runs WARMUP then ITERATIONS collective calls, cycling through
allreduce of sizes 1 to 65,536 float32 (sum and max), a grouped
allreduce of three tensors submitted together, allgather of a varying
first dimension, broadcast from either root, and allreduce_async + poll +
wait; spot-checks results against numpy; samples VmRSS and the number of
open file descriptors after the warm-up and at the end. unnamed: the same
with small allreduces given no name.

cycles: COUNT times in the same job, as a Spark or Ray worker that runs job
after job lives: tfring.init(), a process set of all ranks but the last and
one of all ranks but the first added, an allreduce on the world and on each
set this rank belongs to, a broadcast, a TF training step through
DistributedGradientTape (every CYCLE_TF-th cycle), both sets removed,
tfring.shutdown(). Samples RSS, open fds, threads and this process's
/dev/shm segments before the first init, after the first shutdown and after
the last; checks every result against numpy and, after the last step, that
every rank holds the same weights.
"""

import os
import sys

import numpy as np
from common import report

from tfring import _bootstrap, _core, basics


def rss_kib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS in /proc/self/status")


def fd_count():
    return len(os.listdir("/proc/self/fd"))


def thread_count():
    return len(os.listdir("/proc/self/task"))


def shm_count():
    """Shared-memory segments mapped into this process (its links' and its
    host segment's): a segment left mapped after shutdown shows here even
    when another rank has already unlinked its name."""
    with open("/proc/self/maps") as f:
        return len({line.split()[-1] for line in f if "/dev/shm/" in line})


def sample():
    return {"rss_kib": rss_kib(), "fds": fd_count(), "threads": thread_count(),
            "shm": shm_count()}


SIZES = (1, 7, 100, 1000, 4096, 65536)


def one(i, rank, n):
    """Collective call number i; raises on a wrong result."""
    kind = i % 6
    size = SIZES[(i // 6) % len(SIZES)]
    if kind == 0:
        x = np.full(size, rank + 1, np.float32)
        y = _core.allreduce(x, op="sum", name=f"leak.ar.{size}")
        want = n * (n + 1) / 2
    elif kind == 1:
        y = _core.allreduce(np.full(size, rank + 1.0, np.float32), op="max",
                            name=f"leak.max.{size}")
        want = n
    elif kind == 2:
        hs = [_core.allreduce_async(np.full(s, float(rank), np.float32),
                                    op="sum", name=f"leak.group.{j}")
              for j, s in enumerate((size, 3, 17))]
        y = np.concatenate([h.wait(60.0) for h in hs])
        want = n * (n - 1) / 2
    elif kind == 3:
        rows = (i + rank) % 4
        y = _core.allgather(np.full((rows, 2), rank, np.int32), name="leak.ag")
        expect = sum((i + r) % 4 for r in range(n))
        if y.shape != (expect, 2):
            raise AssertionError(f"call {i}: allgather shape {y.shape}")
        return
    elif kind == 4:
        root = (i // 6) % n
        y = _core.broadcast(np.full(size, float(rank), np.float32),
                            root=root, name=f"leak.bc.{size}")
        want = root
    else:
        h = _core.allreduce_async(np.full(size, 2.0, np.float32), op="average",
                                  name=f"leak.async.{size}")
        h.poll()
        y = h.wait(60.0)
        want = 2.0
    if i % 97 == 0 and not np.all(y == want):
        raise AssertionError(f"call {i} (kind {kind}, size {size}): got "
                             f"{y[:4]}, want {want}")


def unnamed(i, rank, n):
    """An allreduce without a name: each gets a fresh one (allreduce.noname.N)."""
    y = _core.allreduce(np.ones(8, np.float32), op="sum")
    if i % 97 == 0 and not np.all(y == n):
        raise AssertionError(f"call {i}: got {y[:4]}, want {n}")


def collectives(iterations, warmup, call=one):
    _core.init(*_bootstrap.discover())
    rank, n = _core.rank(), _core.size()
    for i in range(warmup):
        call(i, rank, n)
    start = sample()
    for i in range(warmup, warmup + iterations):
        call(i, rank, n)
    end = sample()
    transport = _core.transport()
    _core.shutdown()
    return {"start": start, "end": end, "transport": transport}


CYCLE_TF = 10


def train_step(tf, tfring, w, x, c):
    """One data-parallel step of a linear model on this rank's rows; the
    reference applies the same update with every rank's rows in numpy."""
    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(tf.linalg.matvec(x, w) - 1.0))
        tape = tfring.DistributedGradientTape(tape)
        (g,) = tape.gradient(loss, [w])
        w.assign_sub(0.1 * g)
    step()


def cycles(count):
    import tensorflow as tf

    import tfring

    samples = []
    before = sample()
    w = None
    for c in range(count):
        basics.init()
        rank, n = basics.rank(), basics.size()
        sets = []
        if n > 1:
            sets = [tfring.add_process_set(list(range(n - 1))),
                    tfring.add_process_set(list(range(1, n)))]
        y = _core.allreduce(np.full(1000, rank + 1.0, np.float32), op="sum",
                            name="cycle")
        if not np.all(y == n * (n + 1) / 2):
            raise AssertionError(f"cycle {c}: got {y[:4]}")
        for ps in sets:
            if not ps.included():
                continue
            got = tfring.allreduce(np.full(4, rank + 1.0, np.float32),
                                   op=tfring.Sum, process_set=ps).numpy()
            want = sum(r + 1.0 for r in ps.ranks)
            if not np.all(got == want):
                raise AssertionError(f"cycle {c}, set {ps.ranks}: {got} != {want}")
        root = c % n
        b = _core.broadcast(np.full(3, float(rank), np.float32), root=root,
                            name="cycle.bc")
        if not np.all(b == root):
            raise AssertionError(f"cycle {c}: broadcast from {root} gave {b}")
        if c % CYCLE_TF == 0:
            if w is None:
                w = tf.Variable(np.zeros(4, np.float32))
            x = tf.constant(np.arange(8, dtype=np.float32).reshape(2, 4) + rank)
            train_step(tf, tfring, w, x, c)
        for ps in sets:
            tfring.remove_process_set(ps)
        basics.shutdown()
        samples.append(sample())
    # The same steps in numpy with every rank's rows: the mean over ranks of
    # each rank's mean-loss gradient.
    n = int(os.environ["TFRING_SIZE"])
    ref = np.zeros(4, np.float64)
    for _ in range(0, count, CYCLE_TF):
        g = np.zeros(4)
        for r in range(n):
            x = np.arange(8, dtype=np.float64).reshape(2, 4) + r
            g += 2 * x.T @ (x @ ref - 1.0) / 2
        ref -= 0.1 * g / n
    return {"before": before, "after_first": samples[0],
            "after_last": samples[-1], "weights": w.numpy().tolist(),
            "reference": ref.tolist()}


mode = sys.argv[1]
if mode in ("collectives", "unnamed"):
    out = collectives(int(sys.argv[2]), int(sys.argv[3]),
                      one if mode == "collectives" else unnamed)
else:
    out = cycles(int(sys.argv[2]))
report(out)
