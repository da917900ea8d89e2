"""A plain Horovod-style training script, run unchanged with no launcher,
under tfring-run, Open MPI's mpirun and MPICH's mpiexec
(tests/run/test_bootstrap_launchers.py).

Each rank builds its model from a different seed (the initial broadcast must
make them equal), trains a few steps on its own data through
DistributedGradientTape, and prints one line

    LAUNCH_RESULT {"rank": .., "size": .., "digest": <sha256 of the weights>, ...}

``--fail-rank R --fail-step S``: rank R calls ``sys.exit(3)`` just before
step S, while the others wait for it in that step's allreduce; at step 0 it
does so right after init, before importing TensorFlow, and the others wait
for it in the initial broadcast.
"""

import argparse
import hashlib
import json
import os
import sys

import tfring as hvd

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=4)
parser.add_argument("--fail-rank", type=int, default=-1)
parser.add_argument("--fail-step", type=int, default=1)
args = parser.parse_args()

hvd.init()


def fail_here(rank, step):
    if rank == args.fail_rank and step == args.fail_step:
        print(f"rank {rank}: failing on purpose at step {step}", flush=True)
        sys.exit(3)


fail_here(hvd.rank(), 0)

import keras
import numpy as np
import tensorflow as tf

rank, size = hvd.rank(), hvd.size()
print(f"rank {rank} of {size} (local {hvd.local_rank()} of {hvd.local_size()}) "
      f"pid {os.getpid()}", flush=True)

keras.utils.set_random_seed(100 + rank)
model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="tanh"),
                          keras.layers.Dense(1)])
opt = keras.optimizers.SGD(learning_rate=0.05, momentum=0.9)
hvd.broadcast_variables(model.variables, root_rank=0)


@tf.function
def train_step(x, y):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(model(x) - y))
    tape = hvd.DistributedGradientTape(tape)
    grads = tape.gradient(loss, model.trainable_variables)
    opt.apply_gradients(zip(grads, model.trainable_variables))
    return loss


rng = np.random.default_rng(rank)
for step in range(args.steps):
    fail_here(rank, step)
    x = rng.normal(size=(16, 6)).astype(np.float32)
    y = np.sin(x.sum(axis=1, keepdims=True))
    loss = train_step(x, y)

h = hashlib.sha256()
for w in model.get_weights():
    h.update(np.ascontiguousarray(w).tobytes())
result = {"rank": rank, "size": size, "local_rank": hvd.local_rank(),
          "local_size": hvd.local_size(), "loss": float(loss), "digest": h.hexdigest()}
# One write per line: launchers relaying several ranks keep lines whole.
sys.stdout.write("LAUNCH_RESULT " + json.dumps(result) + "\n")
sys.stdout.flush()
