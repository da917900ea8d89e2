"""Rank worker for tests/test_resilience.py: resource use over many
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

cycles: tfring.init(), one allreduce, tfring.shutdown(), COUNT times in the
same job; samples before the first init, after the first shutdown and after
the last.
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


def sample():
    return {"rss_kib": rss_kib(), "fds": fd_count()}


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


def cycles(count):
    samples = []
    before = sample()
    for c in range(count):
        basics.init()
        y = _core.allreduce(np.ones(1000, np.float32), op="sum", name="cycle")
        if not np.all(y == basics.size()):
            raise AssertionError(f"cycle {c}: got {y[:4]}")
        basics.shutdown()
        samples.append(sample())
    return {"before": before, "after_first": samples[0],
            "after_last": samples[-1]}


mode = sys.argv[1]
if mode in ("collectives", "unnamed"):
    out = collectives(int(sys.argv[2]), int(sys.argv[3]),
                      one if mode == "collectives" else unnamed)
else:
    out = cycles(int(sys.argv[2]))
report(out)
