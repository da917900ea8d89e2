"""A training step compiled with XLA (tf.function(jit_compile=True)) against
the same step without XLA, both running tfring's collectives, on CPU.

Two steps, each timed both ways in one job, alternating:
  * mlp: a DistributedGradientTape training step of an MLP (the model's
    math, the gradients' allreduce and the optimizer update);
  * fused: 100 gradients of 16 KiB read from variables, grouped_allreduce,
    each result assigned to a variable (what an optimizer does).

Prints each step's median time (max over ranks), and the XLA / no-XLA
ratio (target: <= 1.10). Each step also runs without communication (the
plain tape; tf.identity_n in place of the allreduce), XLA and not, in the
same alternation: what XLA costs by itself, and what the collective adds
with and without XLA.

    python benchmarks/xla_bench.py              # 2 ranks via tfring-run
    python benchmarks/xla_bench.py --np 4 --reps 7
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


def worker(args):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    import numpy as np
    import tensorflow as tf

    import tfring

    tfring.init()
    import keras

    rank, size = tfring.rank(), tfring.size()
    rng = np.random.default_rng(rank)

    def mlp_step(jit, comm=True):
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((args.features,))]
                                 + [keras.layers.Dense(args.width, "relu")
                                    for _ in range(args.layers)]
                                 + [keras.layers.Dense(10)])
        opt = keras.optimizers.SGD(0.01)
        x = tf.constant(rng.normal(size=(args.batch, args.features)).astype("float32"))
        y = tf.constant(rng.integers(0, 10, args.batch))
        loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

        @tf.function(jit_compile=jit)
        def step():
            with tf.GradientTape() as tape:
                loss = loss_fn(y, model(x))
            if comm:
                tape = tfring.DistributedGradientTape(tape)
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables))
            return loss
        return step

    def fused_step(jit, comm=True):
        grads = [tf.Variable(rng.normal(size=4096).astype("float32")) for _ in range(100)]
        outs = [tf.Variable(tf.zeros(4096)) for _ in range(100)]
        reduce = tfring.grouped_allreduce if comm else tf.identity_n

        @tf.function(jit_compile=jit)
        def step():
            reduced = reduce([g.read_value() for g in grads])
            for o, r in zip(outs, reduced):
                o.assign(r)
        return step

    def timed(fn, iters):
        # Start together: a barrier, then the loop; the slowest rank counts.
        tfring.allreduce(np.zeros(1, np.float32), name="bench.sync")
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        dt = (time.perf_counter() - t0) / iters
        return float(tfring.allreduce(np.array([dt]), op=tfring.Max, name="bench.max")[0])

    report = {}
    for label, make, iters in (("mlp", mlp_step, args.iters),
                               ("fused", fused_step, args.iters * 4)):
        kinds = [(jit, comm) for comm in (True, False) for jit in (False, True)]
        steps = {k: make(*k) for k in kinds}
        for fn in steps.values():
            for _ in range(3):
                fn()  # trace, compile, warm the engine's cache
        times = {k: [] for k in kinds}
        for _ in range(args.reps):
            for k in kinds:
                times[k].append(timed(steps[k], iters))
        med = {k: statistics.median(v) for k, v in times.items()}
        report[label] = {"no_xla_s": med[(False, True)], "xla_s": med[(True, True)],
                         "alone_no_xla_s": med[(False, False)],
                         "alone_xla_s": med[(True, False)],
                         "no_xla_all": times[(False, True)], "xla_all": times[(True, True)]}
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump({"ranks": size, "steps": report}, f, indent=2)


def driver(args):
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "xla_bench.json")
        sys.path.insert(0, HERE)
        from _common import child_env

        # The ranks import the tfring this process would (a build's package
        # directory on PYTHONPATH, an install), else the checkout.
        env = child_env()
        env.setdefault("CUDA_VISIBLE_DEVICES", "")
        cmd = [sys.executable, "-m", "tfring.run", "-np", str(args.np), sys.executable,
               os.path.abspath(__file__), "--worker", "--out", out,
               "--reps", str(args.reps), "--iters", str(args.iters),
               "--width", str(args.width), "--layers", str(args.layers),
               "--batch", str(args.batch), "--features", str(args.features)]
        code = subprocess.run(cmd, env=env, stdin=subprocess.DEVNULL).returncode
        if code != 0 or not os.path.exists(out):
            sys.exit(f"xla_bench: the job failed (exit code {code})")
        with open(out) as f:
            res = json.load(f)
    print(f"XLA-compiled step vs the same step without XLA, {res['ranks']} ranks, CPU "
          f"(median of {args.reps}, max over ranks)")
    print("(alone: the same step without communication; added: the step less alone)")
    print(f"{'step':8} {'no XLA ms':>10} {'XLA ms':>10} {'XLA/no XLA':>11} "
          f"{'alone ms':>9} {'alone XLA':>10} {'ratio':>6} {'added ms':>9} {'added XLA':>10}")
    worst = 0.0
    for label, r in res["steps"].items():
        ratio = r["xla_s"] / r["no_xla_s"]
        worst = max(worst, ratio)
        alone = r["alone_xla_s"] / r["alone_no_xla_s"]
        print(f"{label:8} {r['no_xla_s'] * 1e3:10.3f} {r['xla_s'] * 1e3:10.3f} {ratio:11.3f} "
              f"{r['alone_no_xla_s'] * 1e3:9.3f} {r['alone_xla_s'] * 1e3:10.3f} {alone:6.3f} "
              f"{(r['no_xla_s'] - r['alone_no_xla_s']) * 1e3:9.3f} "
              f"{(r['xla_s'] - r['alone_xla_s']) * 1e3:10.3f}")
    print(f"target XLA/no XLA <= 1.10: {'met' if worst <= 1.10 else 'NOT met'} "
          f"(worst {worst:.3f})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--np", type=int, default=2)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--iters", type=int, default=20, help="steps per timed loop (fused: x4)")
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--features", type=int, default=256)
    p.add_argument("--json", help="also write the results here")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    (worker if args.worker else driver)(args)


if __name__ == "__main__":
    main()
