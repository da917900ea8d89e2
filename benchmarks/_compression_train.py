#!/usr/bin/env python3
"""One rank of compression_bench.py's Keras comparison (started by
tfring-run on every namespace host; rank 0 writes --result).

The task: scikit-learn's handwritten digits (1797 8x8 images, bundled,
offline), each scaled up to 32x32 (every pixel a 4x4 block, plus a little
fixed noise so the wide first layer sees more than 64 distinct inputs), a
fixed 80/20 train/test split. The model: 1024 -> 4096 -> 4096 -> 10 dense
layers with ReLU, 21.0M parameters (84 MB of float32 gradients per step).
Each rank trains on its own equal share of the training set (x[rank::size],
cut to the same length), ``model.fit`` with tfring's RingAllreduceCallback
carrying ``compression=`` (weights broadcast from rank 0 at the start, so
every compression starts from the same weights: the seed is fixed).

Measured on rank 0: the wall time of each training step (Keras'
on_train_batch_begin to on_train_batch_end), the median over every step
after the first 3 + --start-iter (tracing, the first broadcast, and
PowerSGD's uncompressed warm-up; the same steps for every compression); and
the test accuracy of the trained model (every rank holds the same weights).
"""

import argparse
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.append(os.path.dirname(HERE))  # tfring from the checkout, unless installed
from _common import import_tf  # noqa: E402

WIDTH = 4096
SKIP = 3  # steps left out of the step time: tracing, the first broadcast


def digits(seed):
    """(x_train, y_train, x_test, y_test): digits scaled to 32x32 in [0, 1]."""
    import numpy as np
    from sklearn.datasets import load_digits

    d = load_digits()
    x = np.kron(d.images, np.ones((4, 4))) / 16.0
    rng = np.random.default_rng(seed)
    x = (x + 0.05 * rng.standard_normal(x.shape)).reshape(len(x), -1).astype(np.float32)
    y = d.target.astype(np.int64)
    order = rng.permutation(len(x))
    cut = int(0.8 * len(x))
    return x[order[:cut]], y[order[:cut]], x[order[cut:]], y[order[cut:]]


def compressor(tfring, name, powersgd_rank, start_iter):
    c = tfring.Compression
    if name == "powersgd":
        return c.powersgd(rank=powersgd_rank, start_iter=start_iter)
    return getattr(c, name)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--result", required=True)
    p.add_argument("--compression", default="none")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch", type=int, default=16, help="per rank")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--powersgd-rank", type=int, default=4)
    p.add_argument("--start-iter", type=int, default=10,
                   help="PowerSGD's uncompressed warm-up steps (PyTorch's start_powerSGD_iter)")
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args()

    tf = import_tf()
    import keras

    import tfring
    import tfring.keras as tk

    tfring.init()
    rank, n = tfring.rank(), tfring.size()
    x, y, xt, yt = digits(args.seed)
    per = len(x) // n
    x, y = x[rank::n][:per], y[rank::n][:per]
    keras.utils.set_random_seed(args.seed)
    model = keras.Sequential([
        keras.Input((x.shape[1],)),
        keras.layers.Dense(WIDTH, activation="relu"),
        keras.layers.Dense(WIDTH, activation="relu"),
        keras.layers.Dense(10),
    ])
    # Plain SGD with momentum, as PowerSGD is usually run; the rate is not
    # scaled with the number of ranks (the gradients are averaged).
    model.compile(optimizer=keras.optimizers.SGD(args.lr, momentum=0.9),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    steps = []

    class StepTimes(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            self.t0 = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            steps.append(time.perf_counter() - self.t0)

    callback = tk.callbacks.RingAllreduceCallback(
        compression=compressor(tfring, args.compression, args.powersgd_rank, args.start_iter))
    t0 = time.perf_counter()
    hist = model.fit(x, y, batch_size=args.batch, epochs=args.epochs, shuffle=True,
                     callbacks=[callback, StepTimes()], verbose=0)
    fit_s = time.perf_counter() - t0
    loss, acc = model.evaluate(xt, yt, batch_size=256, verbose=0)
    tfring.shutdown()
    if rank == 0:
        timed = steps[SKIP + args.start_iter:] or steps
        doc = {"np": n, "compression": args.compression, "params": model.count_params(),
               "epochs": args.epochs, "batch_per_rank": args.batch,
               "steps": len(steps), "step_s": statistics.median(timed),
               "step_min_s": min(timed), "fit_s": fit_s, "test_accuracy": float(acc),
               "test_loss": float(loss), "train_loss": [float(v) for v in hist.history["loss"]],
               "train_accuracy": [float(v) for v in hist.history["accuracy"]],
               "lr": args.lr, "powersgd_rank": args.powersgd_rank,
               "start_iter": args.start_iter, "steps_timed": len(timed)}
        with open(args.result, "w") as f:
            json.dump(doc, f)
        print(json.dumps(doc), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
