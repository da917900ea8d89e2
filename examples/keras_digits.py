"""Keras classifier on scikit-learn's handwritten digits, data-parallel with
one callback.

    tfring-run -np 2 python examples/keras_digits.py

The only tfring lines: init, each rank taking its shard of the training set,
and RingAllreduceCallback in model.fit's callbacks. Gradients are averaged
over ranks in every step, so 2 ranks with --batch-size 32 each train like
one process with batch 64. Rank 0 prints progress and writes the
checkpoint (--checkpoint) alone.
"""

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import tfring.keras as tk


def limit_threads(threads):
    """Share the cores between the ranks on this host."""
    if threads <= 0:
        threads = max(1, (os.cpu_count() or 1) // tk.local_size())
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(2)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--lr", type=float, default=1e-3,
                   help="base learning rate, scaled by the number of ranks")
    p.add_argument("--checkpoint", default="",
                   help="save the best model here (.keras), from rank 0")
    p.add_argument("--threads", type=int, default=0, help="0: cores / ranks")
    args = p.parse_args()

    tk.init()
    limit_threads(args.threads)
    keras.utils.set_random_seed(42 + tk.rank())  # the callback syncs weights

    digits = load_digits()
    x = (digits.data / 16.0).astype("float32")
    y = digits.target.astype("int32")
    x_train, x_test, y_train, y_test = train_test_split(
        x, y, test_size=0.25, random_state=0, stratify=y)
    # Each rank trains and validates on its own rows.
    x_mine, y_mine = tk.shard(x_train, y_train)
    xv_mine, yv_mine = tk.shard(x_test, y_test)

    model = keras.Sequential([
        keras.Input((64,)),
        keras.layers.Dense(128, activation="relu"),
        keras.layers.Dropout(0.2),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(10),
    ])
    model.compile(
        # Linear scaling: the global batch is size times larger.
        optimizer=keras.optimizers.Adam(args.lr * tk.size()),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"])

    callbacks = [tk.callbacks.RingAllreduceCallback()]
    if args.checkpoint:
        callbacks.append(keras.callbacks.ModelCheckpoint(
            args.checkpoint, monitor="val_accuracy", save_best_only=True))
    model.fit(x_mine, y_mine, batch_size=args.batch_size, epochs=args.epochs,
              validation_data=(xv_mine, yv_mine), callbacks=callbacks,
              verbose=2)

    # Every rank holds the same weights: each scores its part of the test
    # set and the accuracies are averaged.
    _, acc = model.evaluate(xv_mine, yv_mine, verbose=0)
    acc = tk.average_metrics({"accuracy": acc})["accuracy"]
    weights_sum = float(sum(np.sum(w) for w in model.get_weights()))
    same = tk.average_metrics({"w": weights_sum})["w"] == weights_sum
    if tk.rank() == 0:
        print(f"test accuracy {acc:.4f} on {len(x_test)} digits "
              f"({tk.size()} ranks, weights identical: {same})")


if __name__ == "__main__":
    main()
