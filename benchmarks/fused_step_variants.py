"""Where a fused step's time goes after the collective: one job that
alternates eight variants of the 100 x 16 KiB step of allreduce_bench.py
(gradients read from variables inside a tf.function), with
``tfring.grouped_allreduce`` or TF's ``tf.identity_n`` in the collective's
place, and four ways of using the outputs: as control dependencies only,
summed, assigned to variables, assigned through one more ``identity_n``.

    tfring-run -np 2 python benchmarks/fused_step_variants.py [--count 100]
        [--bytes 16384] [--blocks 7] [--steps 100]

Rank 0 prints the median time of a step per variant and the difference
between the collective's and ``identity_n``'s (docs/training-step.md).
Every rank checks the reduced values once against numpy float64.
"""

import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tfring  # noqa: E402

USES = ("deps", "sum", "assign", "assign_idn")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--count", type=int, default=100)
    p.add_argument("--bytes", type=int, default=16384)
    p.add_argument("--blocks", type=int, default=7)
    p.add_argument("--steps", type=int, default=100)
    a = p.parse_args()
    tfring.init()
    rank, size = tfring.rank(), tfring.size()
    n = a.bytes // 4
    with tf.device("/CPU:0"):
        grads = [tf.Variable(tf.fill([n], float(rank + 1 + i))) for i in range(a.count)]
        upd = [tf.Variable(tf.zeros([n])) for _ in range(a.count)]

    def make(collective, use):
        @tf.function
        def step():
            ins = [g.read_value() for g in grads]
            outs = (tfring.grouped_allreduce(ins, op=tfring.Sum, name="variants")
                    if collective else tf.identity_n(ins))
            if use == "deps":
                with tf.control_dependencies(outs):
                    return tf.constant(0.0)
            if use == "sum":
                return tf.add_n([tf.reduce_sum(o) for o in outs])
            if use == "assign_idn":
                outs = tf.identity_n(outs)
            for v, r in zip(upd, outs):
                v.assign(r)
            return tf.constant(0.0)
        return step

    variants = {(c, u): make(c, u) for c in (True, False) for u in USES}
    variants[(True, "assign")]()
    want = np.array([sum(r + 1 + i for r in range(size)) for i in range(a.count)], np.float64)
    got = np.array([v.numpy()[0] for v in upd], np.float64)
    assert np.array_equal(got, want), f"rank {rank}: reduced values {got[:4]} != {want[:4]}"
    for f in variants.values():
        for _ in range(20):
            f()
    times = {k: [] for k in variants}
    for _ in range(a.blocks):
        for k, f in variants.items():
            t = time.perf_counter()
            for _ in range(a.steps):
                f()
            times[k].append((time.perf_counter() - t) / a.steps * 1e6)
    if rank == 0:
        print(f"{size} ranks, {a.count} x {a.bytes} B, medians of {a.blocks} blocks of "
              f"{a.steps} steps, us a step")
        print("| outputs | grouped_allreduce | identity_n | difference |")
        print("|---|---:|---:|---:|")
        for u in USES:
            g, i = np.median(times[(True, u)]), np.median(times[(False, u)])
            print(f"| {u} | {g:.0f} | {i:.0f} | {g - i:.0f} |")
    tfring.shutdown()


if __name__ == "__main__":
    main()
