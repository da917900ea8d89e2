"""Elastic TensorFlow 2 training, written the way Horovod's elastic example
(tensorflow2_mnist_elastic.py) is written; only the import line differs.

    tfring-run --min-np 2 --max-np 6 --host-discovery-script ./hosts.sh \\
        python examples/elastic_tf2.py

The data is a synthetic MNIST-shaped set (no download), the same on every
process; each rank reads its own shard of every global batch.
"""

import numpy as np
import tensorflow as tf

import tfring as hvd

# Horovod: initialize Horovod.
hvd.init()

# Horovod: pin GPU to be used to process local rank (one GPU per process)
gpus = tf.config.experimental.list_physical_devices('GPU')
for gpu in gpus:
    tf.config.experimental.set_memory_growth(gpu, True)
if gpus:
    tf.config.experimental.set_visible_devices(gpus[hvd.local_rank()], 'GPU')

rng = np.random.default_rng(0)
images = rng.random((4096, 28, 28), dtype=np.float32)
labels = (images.reshape(4096, -1)[:, :10].argmax(axis=1)).astype(np.int64)

BATCH = 32
TOTAL_BATCHES = 200

mnist_model = tf.keras.Sequential([
    tf.keras.layers.Input((28, 28)),
    tf.keras.layers.Flatten(),
    tf.keras.layers.Dense(32, activation='relu'),
    tf.keras.layers.Dense(10, activation='softmax')
])
loss = tf.losses.SparseCategoricalCrossentropy()

# Horovod: adjust learning rate based on number of GPUs.
opt = tf.optimizers.Adam(0.001 * hvd.size())


def shard(batch_idx):
    """This rank's part of global batch batch_idx (ranks read disjoint parts)."""
    start = (batch_idx * BATCH * hvd.size() + hvd.rank() * BATCH) % (4096 - BATCH)
    return images[start:start + BATCH], labels[start:start + BATCH]


@tf.function
def training_step(images, labels, allreduce=True):
    with tf.GradientTape() as tape:
        probs = mnist_model(images, training=True)
        loss_value = loss(labels, probs)

    # Horovod: add Horovod Distributed GradientTape.
    if allreduce:
        tape = hvd.DistributedGradientTape(tape)

    grads = tape.gradient(loss_value, mnist_model.trainable_variables)
    opt.apply_gradients(zip(grads, mnist_model.trainable_variables))
    return loss_value


# Horovod: initialize model and optimizer state so we can synchronize across workers
training_step(*shard(0), allreduce=False)


@hvd.elastic.run
def train(state):
    start_batch = state.batch

    for batch_idx in range(start_batch, TOTAL_BATCHES):
        state.batch = batch_idx
        loss_value = training_step(*shard(batch_idx))

        if state.batch % 10 == 0 and hvd.local_rank() == 0:
            print('Step #%d\tLoss: %.6f' % (state.batch, loss_value))

        # Horovod: commit state at the end of each batch
        state.batch = batch_idx + 1
        state.commit()


def on_state_reset():
    opt.learning_rate.assign(0.001 * hvd.size())


state = hvd.elastic.TensorFlowKerasState(mnist_model, opt, batch=0)
state.register_reset_callbacks([on_state_reset])
train(state)

if hvd.rank() == 0:
    digest = float(sum(np.abs(v.numpy()).sum() for v in mnist_model.variables))
    print('ELASTIC_DONE size=%d batch=%d weights=%.6f' % (hvd.size(), state.batch, digest))
