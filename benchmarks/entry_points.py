"""Exposed communication of a training step, entry point by entry point, in
one job: each rank alternates a data-parallel step with the same step
training alone, so the VM's drift between jobs cancels out.

    python benchmarks/entry_points.py                       # mlp, 2 ranks
    python benchmarks/entry_points.py --model resnet50 --batch-size 8 \
        --image-size 224 --steps 3 --reps 3
    python benchmarks/entry_points.py --entries tape,fit --json out.json
    python benchmarks/entry_points.py --gpu --model resnet50 --batch-size 64 \
        --image-size 224                                  # ranks share GPU 0

With --gpu the ranks train on GPU 0 (share it under MPS: see
tools/gpu_run.sh's STEP_BENCH), the batch is made on the GPU, and
the floor is the TF op's allreduce of a GPU tensor of the gradients' size.

Entry points (each has its own model and optimizer, built alike):
  tape      tf.function step with tfring.DistributedGradientTape
  rewrite   tfring.rewrite(tf.function(step))
  fit       model.fit with RingAllreduceCallback
  opt       model.fit with tfring.keras.DistributedOptimizer (compile)
  v1        a tf.compat.v1 graph and session with tfring.rewrite() (the
            same dense layers as the Keras model, built from variables;
            dense models only)

For every entry point and repetition the script times `--steps` steps of
the tfring version and of the same step without communication ("alone"),
back to back. Exposed communication is 1 - alone / tfring, from the
medians over repetitions; "exposed / floor" divides the exposed time per
step by the time the core needs to allreduce the model's gradients once
(the floor: 1 means no overlap at all, 0 that communication is hidden).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENTRIES = ("tape", "rewrite", "fit", "opt", "v1")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--np", type=int, default=2)
    p.add_argument("--model", default="mlp",
                   choices=["mlp", "resnet50", "small", "many"])
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--image-size", type=int, default=32)
    p.add_argument("--classes", type=int, default=1000)
    p.add_argument("--layers", type=int, default=50,
                   help="hidden layers of the 'many' model")
    p.add_argument("--steps", type=int, default=5, help="timed per block")
    p.add_argument("--reps", type=int, default=3, help="alternated blocks")
    p.add_argument("--entries", default=",".join(ENTRIES))
    p.add_argument("--timeout", type=int, default=1200)
    p.add_argument("--json", default="")
    p.add_argument("--gpu", action="store_true",
                   help="train on GPU 0 (every rank), floor on a GPU tensor")
    p.add_argument("--profile-steps", type=int, default=0,
                   help="then profile this many steps of each variant with "
                   "TensorFlow's profiler on rank 0 and print where the "
                   "step's time went on TF's op threads")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def build_model(name, image_size, classes, hidden=50):
    import keras

    if name == "many":
        # Many small dense layers (50: 102 tensors, 16 KiB weights each):
        # what a step costs per tensor.
        layers = [keras.Input((64,))]
        layers += [keras.layers.Dense(64, activation="relu")
                   for _ in range(hidden)]
        layers += [keras.layers.Dense(classes)]
        return keras.Sequential(layers)
    sys.path.insert(0, os.path.join(ROOT, "examples"))
    from synthetic_benchmark import build_model as build

    return build(name, image_size, classes)


def worker(args):
    import numpy as np
    import tensorflow as tf

    import tfring

    if args.gpu:
        gpus = tf.config.list_physical_devices("GPU")
        if not gpus:
            raise SystemExit("--gpu: TensorFlow sees no GPU (is it a CUDA "
                             "build, and CUDA_VISIBLE_DEVICES unset?)")
        for g in gpus:  # ranks share the GPU: none may take all its memory
            tf.config.experimental.set_memory_growth(g, True)
    tfring.init()
    rank, local_size = tfring.rank(), tfring.local_size()
    threads = max(1, (os.cpu_count() or 1) // local_size)
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(2)
    import keras

    import tfring.keras as tk

    rng = np.random.default_rng(rank)
    if args.model == "many":
        shape = (args.batch_size, 64)
    else:
        shape = (args.batch_size, args.image_size, args.image_size, 3)
    with tf.device("/GPU:0" if args.gpu else "/CPU:0"):
        images = tf.identity(rng.uniform(size=shape).astype(np.float32))
        labels = tf.identity(rng.integers(0, args.classes, args.batch_size))
    from_logits = args.model != "resnet50"

    def make():
        keras.utils.set_random_seed(1)
        model = build_model(args.model, args.image_size, args.classes,
                            args.layers)
        opt = keras.optimizers.SGD(0.01, momentum=0.9)
        loss_fn = keras.losses.SparseCategoricalCrossentropy(
            from_logits=from_logits)
        return model, opt, loss_fn

    def custom_loop(kind, distributed):
        model, opt, loss_fn = make()

        def step(x, y):
            with tf.GradientTape() as tape:
                loss = loss_fn(y, model(x, training=True))
            if distributed and kind == "tape":
                tape = tfring.DistributedGradientTape(tape)
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables))
            return loss

        fn = tf.function(step)
        if distributed and kind == "rewrite":
            fn = tfring.rewrite(fn)
        if distributed:
            tfring.broadcast_variables(model.variables, root_rank=0)

        def run(n, prof=None):
            loss = None
            if prof:
                prof[0]()
            for _ in range(n):
                loss = fn(images, labels)
            float(loss)  # the step's result is used: it has finished
            if prof:
                prof[1]()
        return run, lambda: [v.numpy() for v in model.trainable_variables]

    def fit_loop(kind, distributed):
        model, opt, loss_fn = make()
        callbacks = []
        if distributed and kind == "fit":
            callbacks.append(tk.callbacks.RingAllreduceCallback())
        if distributed and kind == "opt":
            opt = tk.DistributedOptimizer(opt)
            callbacks.append(tk.callbacks.BroadcastGlobalVariablesCallback(0))
        model.compile(optimizer=opt, loss=loss_fn)
        with tf.device("/CPU:0"):  # tf.data's tensors live on the host
            data = tf.data.Dataset.from_tensors(
                (tf.identity(images), tf.identity(labels))).repeat()
        ends, hooks = [], {}

        class Clock(keras.callbacks.Callback):
            def on_train_batch_end(self, batch, logs=None):
                if logs and "loss" in logs:
                    float(np.sum(logs["loss"]))
                ends.append(time.perf_counter())
                if batch in hooks:
                    hooks[batch]()

        def run(n, prof=None):
            # Two untimed steps per fit call: the first step of a fit pays
            # for the iterator and the callbacks' train-begin work.
            ends.clear()
            hooks.clear()
            if prof:
                hooks.update({1: prof[0], n + 1: prof[1]})
            model.fit(data, steps_per_epoch=n + 2, epochs=1, verbose=0,
                      callbacks=callbacks + [Clock()])
            return (ends[-1] - ends[1]) / n
        return run, lambda: [v.numpy() for v in model.trainable_variables]

    def v1_loop(kind, distributed):
        # The Keras model's dense layers as plain variables in a v1 graph.
        dims = [int(np.prod(shape[1:]))]
        for layer in build_model(args.model, args.image_size,
                                 args.classes, args.layers).layers:
            if isinstance(layer, keras.layers.Dense):
                dims.append(layer.units)
            elif not isinstance(layer, (keras.layers.Flatten,
                                        keras.layers.InputLayer)):
                raise SystemExit(f"--entries v1: dense models only "
                                 f"({args.model} has {type(layer).__name__})")
        graph = tf.Graph()
        with graph.as_default():
            v1 = tf.compat.v1
            v1.set_random_seed(1)
            x = tf.reshape(tf.constant(images.numpy()), [shape[0], dims[0]])
            h = x
            for i, (a, b) in enumerate(zip(dims[:-1], dims[1:])):
                w = v1.get_variable(f"w{i}", [a, b], initializer=v1.glorot_uniform_initializer())
                bias = v1.get_variable(f"b{i}", [b], initializer=v1.zeros_initializer())
                h = tf.matmul(h, w) + bias
                if i < len(dims) - 2:
                    h = tf.nn.relu(h)
            loss = tf.reduce_mean(
                tf.nn.sparse_softmax_cross_entropy_with_logits(
                    labels=tf.constant(labels.numpy()), logits=h))
            train_op = v1.train.MomentumOptimizer(0.01, 0.9).minimize(loss)
            if distributed:
                tfring.rewrite()
            init = v1.global_variables_initializer()
        sess = tf.compat.v1.Session(graph=graph)
        sess.run(init)

        def run(n, prof=None):
            if prof:
                prof[0]()
            for _ in range(n):
                _, value = sess.run([train_op, loss])
            float(value)
            if prof:
                prof[1]()
        def values():
            with graph.as_default():
                return sess.run(tf.compat.v1.trainable_variables())
        return run, values

    entries = [e for e in args.entries.split(",") if e]
    runs, weights = {}, {}
    for e in entries:
        maker = {"tape": custom_loop, "rewrite": custom_loop,
                 "v1": v1_loop}.get(e, fit_loop)
        runs[e] = {"tfring": None, "alone": maker(e, False)[0]}
        runs[e]["tfring"], weights[e] = maker(e, True)
        for fn in runs[e].values():
            fn(2)  # trace and warm up
    times = {e: {"tfring": [], "alone": []} for e in entries}
    cpu = {e: {"tfring": [], "alone": []} for e in entries}
    for _ in range(args.reps):
        for e in entries:
            for variant in ("tfring", "alone"):
                tfring.barrier()
                c0, t0 = time.process_time(), time.perf_counter()
                per = runs[e][variant](args.steps)
                if per is None:
                    per = (time.perf_counter() - t0) / args.steps
                times[e][variant].append(per)
                # CPU seconds of the whole process per step (fit's two
                # untimed steps included): on a loaded machine the
                # difference shows what communication costs in work.
                extra = 2 if e in ("fit", "opt") else 0
                cpu[e][variant].append((time.process_time() - c0)
                                       / (args.steps + extra))
    profiles = {}
    if args.profile_steps:
        import tempfile

        from _xplane import op_thread_breakdown

        for e in entries:
            profiles[e] = {}
            for variant in ("tfring", "alone"):
                logdir = tempfile.mkdtemp(prefix=f"tfring-profile-{e}-")
                prof = ((lambda d=logdir: tf.profiler.experimental.start(d)),
                        tf.profiler.experimental.stop)
                tfring.barrier()
                runs[e][variant](args.profile_steps,
                                 prof if rank == 0 else None)
                if rank == 0:
                    profiles[e][variant] = op_thread_breakdown(
                        logdir, args.profile_steps)
    params = int(sum(np.prod(v.shape) for v in
                     build_model(args.model, args.image_size,
                                 args.classes, args.layers).trainable_variables))
    floor = (gpu_floor(tf, tfring, 4 * params) if args.gpu
             else core_floor(4 * params))
    # Each data-parallel model must be the same on every rank.
    from tfring import _core

    agree = {}
    for e in entries:
        total = sum(float(np.sum(np.asarray(w, np.float64)))
                    for w in weights[e]())
        hi, lo = _core.allreduce(np.array([total, -total]), op="max",
                                 name=f"agree.{e}")
        agree[e] = bool(hi == -lo)
    result = {"rank": rank, "model": args.model, "params": params,
              "gradient_bytes": 4 * params, "floor_s": floor,
              "threads": threads, "times": times, "cpu": cpu,
              "ranks_agree": agree, "profiles": profiles}
    print("RESULT " + json.dumps(result), flush=True)


def core_floor(nbytes):
    import numpy as np

    from tfring import _core

    buf = np.ones(nbytes // 4, np.float32)
    return median_seconds(lambda: _core.allreduce(buf, op="sum", name="floor", out=buf))


def gpu_floor(tf, tfring, nbytes):
    """The TF op's allreduce of a GPU tensor of `nbytes`, median of 5; the
    one-element result read back to the host marks its end."""
    with tf.device("/GPU:0"):
        buf = tf.ones([nbytes // 4], tf.float32)

    @tf.function
    def reduce(x):
        return tfring.allreduce(x, op=tfring.Sum, name="floor")[:1]

    return median_seconds(lambda: float(reduce(buf)[0]))


def median_seconds(fn, reps=5):
    """fn() once to warm up, then the median of `reps` timed calls."""
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def summarize(results, args):
    """Per entry point: medians over repetitions of the slowest rank."""
    nreps = len(results[0]["times"][next(iter(results[0]["times"]))]["tfring"])
    floor = max(r["floor_s"] for r in results)
    rows = {}
    for e in results[0]["times"]:
        med = {}
        for variant in ("tfring", "alone"):
            med[variant] = statistics.median(
                max(r["times"][e][variant][i] for r in results)
                for i in range(nreps))
        exposed = med["tfring"] - med["alone"]
        cpu = {v: statistics.median(statistics.mean(r["cpu"][e][v][i]
                                                    for r in results)
                                    for i in range(nreps))
               for v in ("tfring", "alone")}
        # Each block's time (the slowest rank's), to see the spread behind
        # the medians.
        blocks = {v: [max(r["times"][e][v][i] for r in results) for i in range(nreps)]
                  for v in ("tfring", "alone")}
        rows[e] = {"ranks_agree": all(r["ranks_agree"][e] for r in results),
                   "blocks_s": blocks,
                   "step_s": med["tfring"], "alone_s": med["alone"],
                   "cpu_s": cpu["tfring"], "alone_cpu_s": cpu["alone"],
                   "exposed_fraction": 1 - med["alone"] / med["tfring"],
                   "exposed_over_floor": exposed / floor}
    return {"model": args.model, "np": args.np,
            "profiles": next((r["profiles"] for r in results
                              if r["rank"] == 0), {}),
            "gradient_bytes": results[0]["gradient_bytes"],
            "floor_s": floor, "entries": rows}


def main():
    args = parse_args()
    if args.worker:
        worker(args)
        return
    cmd = [sys.executable, "-m", "tfring.run", "-np", str(args.np),
           "--timeout", str(args.timeout), sys.executable,
           os.path.abspath(__file__), "--worker", *sys.argv[1:]]
    env = dict(os.environ)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if not args.gpu:
        env.setdefault("CUDA_VISIBLE_DEVICES", "")
    with tempfile.TemporaryDirectory() as cwd:
        proc = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True,
                              text=True, timeout=args.timeout + 60,
                              check=False)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} exited {proc.returncode}:\n"
                         f"{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    results = []
    for line in proc.stdout.splitlines():
        i = line.find("RESULT ")
        if i >= 0:
            results.append(json.loads(line[i + len("RESULT "):]))
    summary = summarize(results, args)
    print(f"{args.model}, {args.np} ranks{' on GPU 0' if args.gpu else ''}, "
          f"batch {args.batch_size} a rank: gradients "
          f"{summary['gradient_bytes'] / 1e6:.1f} MB, core allreduce floor "
          f"{summary['floor_s'] * 1e3:.1f} ms; medians of {args.reps} "
          f"alternated blocks of {args.steps} steps")
    print("| entry point | tfring step (s) | alone (s) | exposed | "
          "exposed / floor | CPU s/step tfring | alone |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for e, r in summary["entries"].items():
        print(f"| {e} | {r['step_s']:.4f} | {r['alone_s']:.4f} | "
              f"{r['exposed_fraction']:.1%} | {r['exposed_over_floor']:.2f} | "
              f"{r['cpu_s']:.4f} | {r['alone_cpu_s']:.4f} |")
    if summary["profiles"]:
        print(f"\nTensorFlow's profiler, rank 0, {args.profile_steps} steps "
              f"per variant, ms per step: the op threads' busy time (union), "
              f"their idle time (no op running: waiting for an asynchronous "
              f"op or for Python) and the ops' summed time")
        print("| entry point | variant | profiled step | busy | idle | "
              "op time | ops |")
        print("|---|---|---:|---:|---:|---:|---:|")
        for e, pv in summary["profiles"].items():
            for variant, b in pv.items():
                print(f"| {e} | {variant} | {b['window']:.2f} | "
                      f"{b['busy']:.2f} | {b['idle']:.2f} | "
                      f"{b['op_cpu']:.2f} | {b['ops']:.0f} |")
    bad = [e for e, r in summary["entries"].items() if not r["ranks_agree"]]
    if bad:
        raise SystemExit(f"ranks ended with different weights: {bad}")
    print("every entry point's ranks ended with the same weights")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1)


if __name__ == "__main__":
    main()
