"""Rank worker for tests/core/test_resilience.py, started by tfring-run: a small
deterministic model.fit with ResumableCheckpointCallback that resumes from
the newest checkpoint in argv[1], and writes its final weights to
argv[2]/rank<R>.npz with what it ran to argv[2]/rank<R>.json.

RESUME_KILL_AT="rank:epoch:batch[:restart]" makes that rank SIGKILL itself
before that batch of that (0-based) epoch, only in that start of the job
(TFRING_RESTART, set by tfring-run --restarts) when given. Deterministic
settings: no shuffling, one intra-op thread, seeded dropout whose generator
state is part of the checkpoint.
"""

import json
import os
import signal
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras
import numpy as np
import tensorflow as tf

import tfring.keras as tk

tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(2)

tk.init()
RANK, SIZE = tk.rank(), tk.size()
CKPT, OUT, EPOCHS = sys.argv[1], sys.argv[2], int(sys.argv[3])
N, FEATURES, BATCH = 96, 8, 16  # BATCH: the global batch; 6 steps per epoch


def dataset():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(N, FEATURES)).astype(np.float32)
    y = (np.sin(x).sum(axis=1, keepdims=True)
         + 0.1 * rng.normal(size=(N, 1))).astype(np.float32)
    return x, y


def halves(a):
    """This rank's share of every global batch."""
    blocks = a.reshape(N // BATCH, BATCH, *a.shape[1:])
    part = BATCH // SIZE
    return blocks[:, RANK * part:(RANK + 1) * part].reshape(-1, *a.shape[1:])


class KillAt(keras.callbacks.Callback):
    def __init__(self, spec):
        super().__init__()
        parts = [int(p) for p in spec.split(":")] if spec else []
        restart = int(os.environ.get("TFRING_RESTART", "0"))
        self.at = None
        if parts and parts[0] == RANK and (len(parts) < 4 or parts[3] == restart):
            self.at = (parts[1], parts[2])
        self.epoch = None

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        if (self.epoch, batch) == self.at:
            print(f"rank {RANK}: killing myself at epoch {self.epoch} "
                  f"batch {batch}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)


class Epochs(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.ran = []

    def on_epoch_end(self, epoch, logs=None):
        self.ran.append(epoch)


x, y = dataset()
keras.utils.set_random_seed(100 + RANK)  # differs per rank: restore or broadcast fixes it
model = keras.Sequential([keras.Input((FEATURES,)),
                          keras.layers.Dense(16, activation="tanh"),
                          keras.layers.Dropout(0.25, seed=7),
                          keras.layers.Dense(1)])
model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")

ckpt = tk.callbacks.ResumableCheckpointCallback(CKPT, keep=2)
initial_epoch = ckpt.restore(model)
print(f"rank {RANK}: resuming at epoch {initial_epoch}", flush=True)
ran = Epochs()
model.fit(halves(x), halves(y), batch_size=BATCH // SIZE, epochs=EPOCHS,
          initial_epoch=initial_epoch, shuffle=False, verbose=0,
          callbacks=[tk.callbacks.RingAllreduceCallback(), ckpt,
                     KillAt(os.environ.get("RESUME_KILL_AT", "")), ran])

os.makedirs(OUT, exist_ok=True)
np.savez(os.path.join(OUT, f"rank{RANK}.npz"),
         *[np.asarray(v) for v in model.variables])
with open(os.path.join(OUT, f"rank{RANK}.json"), "w") as f:
    json.dump({"initial_epoch": initial_epoch, "epochs_ran": ran.ran,
               "iterations": int(model.optimizer.iterations.numpy())}, f)
