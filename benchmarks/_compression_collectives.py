#!/usr/bin/env python3
"""One rank of compression_bench.py's collective sweep (started by
tfring-run on every namespace host; rank 0 writes --result).

Every rank holds the same float32 buffer shape, element i being
(rank + 1) + (i mod 13): the sum stays a small integer, exact in float32,
float16 and bfloat16 (at most 36 + 8 * 12 = 132 for 8 ranks), so each 16-bit
path is checked exactly. Paths, size by size, in the same processes:

- core: ``_core.allreduce(buf, op="sum", out=out)`` on numpy buffers;
- op: ``v.assign(tfring.allreduce(x, op=Sum))`` in a tf.function (the result
  is used, as an optimizer's update uses it);
- fp16, bf16: the same with ``compression=Compression.fp16`` / ``.bf16``
  (16-bit words on the wire where the build has them);
- fp16cast: Horovod's cast-then-sum, written out: the tensor cast to
  float16, summed in float16 by the op, cast back;
- tape: a tf.function training step's reduction without compression: a
  tfring.DistributedGradientTape over a loss whose gradients (square
  matrices, S bytes in all) cost nothing to compute, the reduced gradients
  assigned to variables;
- powersgd: the same step with ``compression=Compression.powersgd(rank=R,
  start_iter=0)`` (compressed from the first step). Its result is a
  low-rank approximation, so it is not checked.

Timing: one warm-up call per path (two below 16 MiB), whose slowest rank
sets the loop length (about --loop-s seconds, at least one call); then
--reps repetitions in which the paths take turns, each a barrier-started
loop; the median loop's seconds per call, slowest rank. Each path also
records the allreduce algorithms its checked call ran (rank 0's counts).
"""

import argparse
import json
import math
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.append(os.path.dirname(HERE))  # tfring from the checkout, unless installed
from _common import RingSync, import_tf, parse_sizes  # noqa: E402

PATHS = ("core", "op", "fp16", "bf16", "fp16cast", "tape", "powersgd")
LARGE = 16 << 20


def _matrices(size):
    """Shapes of the gradient set for `size` bytes: square float32 matrices
    of side up to 2048 (16 MiB each), their sizes adding up to `size`."""
    count = size // 4
    side = min(2048, int(math.isqrt(count)))
    n, rest = divmod(count, side * side)
    shapes = [(side, side)] * n
    if rest:
        shapes.append((rest,))
    return shapes


def build_paths(tf, tfring, np, size, rank, powersgd_rank, names):
    """{path: (check, call) or an "unavailable: ..." string}; check() returns
    the result as a numpy array (None: not checked), call() is timed."""
    from tfring import _core

    count = size // 4
    mine = ((np.arange(count) % 13) + rank + 1).astype(np.float32)
    paths = {}
    if "core" in names:
        out = np.empty_like(mine)
        core = lambda: _core.allreduce(mine, op="sum", name=f"core.{size}", out=out)  # noqa: E731
        paths["core"] = (lambda: (core(), out)[1], core)
    x = tf.constant(mine)

    def assigned(reduce):
        v = tf.Variable(tf.zeros_like(x))
        fn = tf.function(lambda: v.assign(reduce(x)))
        return (lambda: (fn(), v.numpy())[1], fn)

    comp = tfring.Compression
    if "op" in names:
        paths["op"] = assigned(lambda t: tfring.allreduce(
            t, op=tfring.Sum, name=f"op.{size}"))
    for path in ("fp16", "bf16"):
        if path in names:
            c = getattr(comp, path, None)
            paths[path] = (f"unavailable: this build has no Compression.{path}" if c is None
                           else assigned(lambda t, c=c, p=path: tfring.allreduce(
                               t, op=tfring.Sum, name=f"{p}.{size}", compression=c)))
    if "fp16cast" in names:
        paths["fp16cast"] = assigned(lambda t: tf.cast(tfring.allreduce(
            tf.cast(t, tf.float16), op=tfring.Sum, name=f"fp16cast.{size}"), tf.float32))
    for path in ("tape", "powersgd"):
        if path not in names:
            continue
        if path == "powersgd" and getattr(comp, "powersgd", None) is None:
            paths[path] = "unavailable: this build has no Compression.powersgd"
            continue
        # start_iter=0: every timed step is compressed (no warm-up steps).
        c = comp.none if path == "tape" else comp.powersgd(rank=powersgd_rank, start_iter=0)
        paths[path] = tape_step(tf, tfring, np, size, rank, c)
    return paths


def tape_step(tf, tfring, np, size, rank, compression):
    """A tf.function step: gradients of sum(v * g) (so each gradient is this
    rank's g, no compute) through DistributedGradientTape(op=Sum), assigned
    to variables. check() gives the first gradient's reduced values."""
    rng = np.random.default_rng(rank)
    shapes = _matrices(size)
    weights = [tf.Variable(tf.zeros(s)) for s in shapes]
    grads_in = [tf.constant(rng.standard_normal(s).astype(np.float32)) for s in shapes]
    sinks = [tf.Variable(tf.zeros(s)) for s in shapes]

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = tf.add_n([tf.reduce_sum(w * g) for w, g in zip(weights, grads_in)])
        dtape = tfring.DistributedGradientTape(tape, op=tfring.Sum, compression=compression)
        for s, g in zip(sinks, dtape.gradient(loss, weights)):
            s.assign(g)

    return (lambda: (step(), None)[1], step)


def time_paths(sync, calls, reps, loop_s, max_iters, warmup):
    """{path: {"time_s", "min_s", "iters"}}; see the module docstring."""
    iters, times = {}, {p: [] for p in calls}
    for p, call in calls.items():
        for _ in range(warmup - 1):
            call()
        sync.barrier()
        t0 = time.perf_counter()
        call()
        one = sync.max(time.perf_counter() - t0)
        iters[p] = max(1, min(max_iters, int(loop_s / max(one, 1e-9))))
    for _ in range(reps):
        for p, call in calls.items():
            sync.barrier()
            t0 = time.perf_counter()
            for _ in range(iters[p]):
                call()
            times[p].append((time.perf_counter() - t0) / iters[p])
    return {p: {"time_s": sync.max(statistics.median(t)), "min_s": sync.max(min(t)),
                "iters": iters[p]} for p, t in times.items()}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--result", required=True)
    p.add_argument("--sizes", type=parse_sizes, required=True)
    p.add_argument("--paths", default=",".join(PATHS))
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--loop-s", type=float, default=0.3)
    p.add_argument("--max-iters", type=int, default=50)
    p.add_argument("--powersgd-rank", type=int, default=4)
    args = p.parse_args()
    names = [x for x in args.paths.split(",") if x]

    import numpy as np

    import tfring
    from tfring import _core

    tf = import_tf()
    tfring.init()
    rank, n = tfring.rank(), tfring.size()
    sync = RingSync(_core)
    rows = []
    for size in args.sizes:
        count = size // 4
        want = (n * (n + 1) // 2 + n * (np.arange(count) % 13)).astype(np.float32)
        built = build_paths(tf, tfring, np, size, rank, args.powersgd_rank, names)
        row = {"size": size, "paths": {}}
        calls, ran = {}, {}
        for path, entry in built.items():
            if isinstance(entry, str):
                row["paths"][path] = {"error": entry}
                continue
            check, call = entry
            error = None
            before = _core.allreduce_algorithm_counts()
            try:
                got = check()
                if got is not None and not np.array_equal(got, want):
                    i = int(np.flatnonzero(got != want)[0])
                    error = f"rank {rank}: wrong sum at element {i}: {got[i]} != {want[i]}"
            except Exception as e:  # noqa: BLE001 - reported in the table
                error = f"rank {rank}: {type(e).__name__}: {str(e)[-600:]}"
            after = _core.allreduce_algorithm_counts()  # before sync's own allreduce
            ran[path] = sorted(k for k in after if after[k] > before.get(k, 0))
            if not sync.all(error is None):
                row["paths"][path] = {"error": error or "failed on another rank"}
                print(f"{path} at {size} B: {error}", file=sys.stderr, flush=True)
                continue
            calls[path] = call
        large = size >= LARGE
        timed = time_paths(sync, calls, args.reps, args.loop_s, args.max_iters,
                           1 if large else 2)
        for path, m in timed.items():
            row["paths"][path] = dict(m, ran=ran[path])
        rows.append(row)
        if rank == 0:
            print(f"size {size}: " + ", ".join(
                f"{k} {v['time_s'] * 1e3:.1f} ms" for k, v in timed.items()), flush=True)
    tfring.shutdown()
    if rank == 0:
        with open(args.result, "w") as f:
            json.dump({"np": n, "rows": rows}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
