"""A TF2 custom training loop made data-parallel without touching its tape
code: the tf.function step is decorated with @tfring.rewrite.

    tfring-run -np 2 python examples/custom_loop.py

Each rank reads its own shard of a tf.data pipeline; the rewritten step
averages the gradients over ranks where the Keras optimizer applies them,
and its first call broadcasts rank 0's weights and optimizer state.
"""

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import numpy as np
import tensorflow as tf

import tfring
from tfring import _core


def make_data(n, features, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, features)).astype(np.float32)
    w = rng.normal(size=(features, 1)).astype(np.float32)
    y = np.tanh(x @ w) + 0.05 * rng.normal(size=(n, 1)).astype(np.float32)
    return x, y.astype(np.float32)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch-size", type=int, default=64, help="per rank")
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--log-every", type=int, default=50)
    args = p.parse_args()

    tfring.init()
    rank, size = tfring.rank(), tfring.size()
    threads = max(1, (os.cpu_count() or 1) // tfring.local_size())
    tf.config.threading.set_intra_op_parallelism_threads(threads)

    x, y = make_data(8192, 32)
    data = (tf.data.Dataset.from_tensor_slices((x, y))
            .shard(size, rank)                      # this rank's examples
            .shuffle(1024, seed=rank).repeat().batch(args.batch_size))

    keras.utils.set_random_seed(rank)  # differs per rank; rank 0's wins
    model = keras.Sequential([keras.Input((32,)),
                              keras.layers.Dense(64, activation="relu"),
                              keras.layers.Dense(64, activation="relu"),
                              keras.layers.Dense(1)])
    optimizer = keras.optimizers.Adam(args.lr)
    loss_fn = keras.losses.MeanSquaredError()

    @tfring.rewrite                                   # <- the added line
    @tf.function
    def train_step(xb, yb):
        with tf.GradientTape() as tape:
            loss = loss_fn(yb, model(xb, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    for step, (xb, yb) in enumerate(data.take(args.steps), start=1):
        loss = train_step(xb, yb)
        if step % args.log_every == 0 or step == 1:
            # Average the loss over ranks for the log (numpy collective).
            avg = _core.allreduce(np.array([float(loss)]), op="average",
                                         name="log.loss")[0]
            if rank == 0:
                print(f"step {step:4d}  loss {avg:.5f}", flush=True)

    total = float(sum(np.sum(w) for w in model.get_weights()))
    top = _core.allreduce(np.array([total]), op="max", name="check")[0]
    low = _core.allreduce(np.array([total]), op="min", name="check2")[0]
    if rank == 0:
        mse = float(np.mean((model.predict(x, verbose=0) - y) ** 2))
        print(f"done: full-data mse {mse:.5f}; weights identical on all "
              f"{size} ranks: {top == low}")


if __name__ == "__main__":
    main()
