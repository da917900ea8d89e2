"""Training throughput on synthetic data: images/s per rank and in total.

    tfring-run -np 2 python examples/synthetic_benchmark.py              # ResNet-50
    tfring-run -np 2 python examples/synthetic_benchmark.py --model mlp  # comm-heavy
    tfring-run -np 2 python examples/synthetic_benchmark.py --model small \\
        --image-size 32 --num-iters 2                                    # quick

Models (Keras, random weights, no downloads):
  resnet50  keras.applications.ResNet50(weights=None): 25.6M parameters
  mlp       3 dense layers on flattened images: 33.6M parameters at
            --image-size 32, little compute per parameter (communication
            bound)
  small     a tiny CNN, for smoke tests

--backend picks how gradients are combined across ranks:
  tfring    the training step rewritten with tfring.rewrite (ring allreduce)
  none      no communication: every rank trains alone (the compute-only
            baseline; with tfring's launcher, ranks still report together)
  mwms      tf.distribute.MultiWorkerMirroredStrategy (RING collectives over
            gRPC); the workers read TF_CONFIG (benchmarks/keras_scaling.py
            sets it)

--fit trains with Keras's model.fit instead of the custom loop (backends
tfring, with tfring.keras.callbacks.RingAllreduceCallback, and none).

Each rank prints "RESULT {json}" with its numbers; rank 0 prints the total
(tfring and none). Timing starts after --num-warmup-batches steps.
"""

import argparse
import json
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="resnet50",
                   choices=["resnet50", "mlp", "small"])
    p.add_argument("--backend", default="tfring",
                   choices=["tfring", "none", "mwms"])
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--classes", type=int, default=1000)
    p.add_argument("--num-warmup-batches", type=int, default=2)
    p.add_argument("--num-batches-per-iter", type=int, default=5)
    p.add_argument("--num-iters", type=int, default=3)
    p.add_argument("--threads", type=int, default=0,
                   help="TF intra-op threads per rank (0: cores / local ranks)")
    p.add_argument("--fit", action="store_true",
                   help="model.fit (tfring: with RingAllreduceCallback)")
    p.add_argument("--fp16-allreduce", action="store_true",
                   help="tfring: send gradients as float16")
    return p.parse_args()


def build_model(name, image_size, classes):
    import keras

    shape = (image_size, image_size, 3)
    if name == "resnet50":
        return keras.applications.ResNet50(weights=None, input_shape=shape,
                                           classes=classes)
    if name == "mlp":
        return keras.Sequential([
            keras.Input(shape), keras.layers.Flatten(),
            keras.layers.Dense(4096, activation="relu"),
            keras.layers.Dense(4096, activation="relu"),
            keras.layers.Dense(classes)])
    return keras.Sequential([
        keras.Input(shape),
        keras.layers.Conv2D(16, 3, activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Conv2D(32, 3, activation="relu"),
        keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dense(classes)])


def main():
    args = parse_args()
    mwms = args.backend == "mwms"
    if mwms:
        cluster = json.loads(os.environ["TF_CONFIG"])
        rank = cluster["task"]["index"]
        size = len(cluster["cluster"]["worker"])
        local_size = size
    else:
        import tfring

        tfring.init()
        rank, size, local_size = tfring.rank(), tfring.size(), tfring.local_size()
    threads = args.threads or max(1, (os.cpu_count() or 1) // local_size)
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(2)

    import keras

    strategy = None
    if mwms:
        impl = tf.distribute.experimental.CommunicationImplementation.RING
        strategy = tf.distribute.MultiWorkerMirroredStrategy(
            communication_options=tf.distribute.experimental.CommunicationOptions(
                implementation=impl))
    scope = strategy.scope() if strategy else _null()
    with scope:
        model = build_model(args.model, args.image_size, args.classes)
        optimizer = keras.optimizers.SGD(0.01, momentum=0.9)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(
        from_logits=args.model != "resnet50",
        reduction="sum_over_batch_size")
    replicas = strategy.num_replicas_in_sync if strategy else 1

    def step(images, labels):
        with tf.GradientTape() as tape:
            loss = loss_fn(labels, model(images, training=True)) / replicas
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    if args.backend == "tfring":
        import tfring

        compression = (tfring.Compression.fp16 if args.fp16_allreduce
                       else tfring.Compression.none)
        train_step = tfring.rewrite(tf.function(step), compression=compression)
    elif mwms:
        @tf.function
        def train_step(images, labels):
            return strategy.run(step, args=(images, labels))
    else:
        train_step = tf.function(step)

    rng = np.random.default_rng(rank)
    images = tf.constant(rng.uniform(size=(args.batch_size, args.image_size,
                                           args.image_size, 3)).astype(np.float32))
    labels = tf.constant(rng.integers(0, args.classes, args.batch_size))
    params = int(sum(np.prod(v.shape) for v in model.trainable_variables))

    def log(msg):
        if rank == 0:
            print(msg, flush=True)

    if args.fit:
        if mwms:
            raise SystemExit("--fit: backends tfring and none only")
        rates = _fit_rates(args, model, optimizer, loss_fn, images, labels, log)

    log(f"model {args.model}: {params / 1e6:.1f}M parameters, batch "
        f"{args.batch_size} per rank, {args.image_size}px, {size} ranks, "
        f"backend {args.backend}, {threads} threads per rank")
    for _ in range(args.num_warmup_batches if not args.fit else 0):
        float(np.sum(train_step(images, labels)))  # waits for the step
    if not args.fit:
        rates = []
    for i in range(args.num_iters if not args.fit else 0):
        start = time.perf_counter()
        for _ in range(args.num_batches_per_iter):
            out = train_step(images, labels)
        float(np.sum(out))
        elapsed = time.perf_counter() - start
        rate = args.batch_size * args.num_batches_per_iter / elapsed
        rates.append(rate)
        log(f"iter #{i}: {rate:.1f} img/s per rank")
    mean, std = float(np.mean(rates)), float(np.std(rates))
    result = {"rank": rank, "size": size, "backend": args.backend,
              "model": args.model, "params": params,
              "batch_size": args.batch_size, "image_size": args.image_size,
              "threads": threads, "images_per_sec": mean,
              "images_per_sec_std": std,
              "step_time_s": args.batch_size / mean}
    print("RESULT " + json.dumps(result), flush=True)
    if not mwms:
        from tfring import _core

        total = float(_core.allreduce(np.array([mean]), op="sum",
                                      name="bench.total")[0])
        log(f"img/s per rank: {mean:.1f} +- {1.96 * std:.1f}")
        log(f"total img/s on {size} ranks: {total:.1f}")


def _fit_rates(args, model, optimizer, loss_fn, images, labels, log):
    """model.fit over the same batch: img/s per rank of each group of
    --num-batches-per-iter steps after the warm-up steps, timed between
    Keras's batch-end callbacks."""
    import keras

    callbacks = []
    if args.backend == "tfring":
        import tfring.keras as tk

        callbacks.append(tk.callbacks.RingAllreduceCallback())
    model.compile(optimizer=optimizer, loss=loss_fn)
    ends = []

    class Clock(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            # the loss is read, so the step has finished (fit runs async)
            float(np.sum(logs["loss"])) if logs and "loss" in logs else None
            ends.append(time.perf_counter())

    per = args.num_batches_per_iter
    steps = args.num_warmup_batches + 1 + per * args.num_iters
    data = tf.data.Dataset.from_tensors((images, labels)).repeat()
    model.fit(data, steps_per_epoch=steps, epochs=1, verbose=0,
              callbacks=callbacks + [Clock()])
    rates = []
    start = args.num_warmup_batches
    for i in range(args.num_iters):
        elapsed = ends[start + per * (i + 1)] - ends[start + per * i]
        rates.append(args.batch_size * per / elapsed)
        log(f"iter #{i}: {rates[-1]:.1f} img/s per rank (model.fit)")
    return rates


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


if __name__ == "__main__":
    main()
