"""Elastic Keras training, written the way Horovod's elastic Keras example
(tensorflow2_keras_mnist_elastic.py) is written; only the import line
differs, plus Keras 3's spelling of the learning rate and compile().

    tfring-run --min-np 2 --max-np 6 --host-discovery-script ./hosts.sh \\
        python examples/elastic_keras.py

The data is a synthetic MNIST-shaped set (no download).
"""

import numpy as np
import tensorflow as tf

import tfring.keras as hvd

# Horovod: initialize Horovod.
hvd.init()

# Horovod: pin GPU to be used to process local rank (one GPU per process)
gpus = tf.config.experimental.list_physical_devices('GPU')
for gpu in gpus:
    tf.config.experimental.set_memory_growth(gpu, True)
if gpus:
    tf.config.experimental.set_visible_devices(gpus[hvd.local_rank()], 'GPU')

rng = np.random.default_rng(hvd.rank())
images = rng.random((2048, 28, 28), dtype=np.float32)
labels = (images.reshape(2048, -1)[:, :10].argmax(axis=1)).astype(np.int64)
dataset = tf.data.Dataset.from_tensor_slices((images, labels)).repeat().batch(32)

model = tf.keras.Sequential([
    tf.keras.layers.Input((28, 28)),
    tf.keras.layers.Flatten(),
    tf.keras.layers.Dense(32, activation='relu'),
    tf.keras.layers.Dense(10, activation='softmax')
])

# Horovod: adjust learning rate based on number of GPUs.
lr = 0.001
scaled_lr = lr * hvd.size()
opt = tf.optimizers.Adam(scaled_lr)

# Horovod: add Horovod DistributedOptimizer.
opt = hvd.DistributedOptimizer(opt)

model.compile(loss=tf.losses.SparseCategoricalCrossentropy(),
              optimizer=opt,
              metrics=['accuracy'])


def on_state_reset():
    state.model.optimizer.learning_rate.assign(lr * hvd.size())


state = hvd.elastic.KerasState(model, batch=0, epoch=0)
state.register_reset_callbacks([on_state_reset])

callbacks = [
    # Horovod: average metrics among workers at the end of every epoch.
    hvd.callbacks.MetricAverageCallback(),

    # Horovod: elastic callbacks to update and commit state.
    hvd.elastic.UpdateEpochStateCallback(state),
    hvd.elastic.UpdateBatchStateCallback(state),
    hvd.elastic.CommitStateCallback(state),
]

epochs = 6


@hvd.elastic.run
def train(state):
    state.model.fit(dataset,
                    steps_per_epoch=120 // hvd.size(),
                    callbacks=callbacks,
                    epochs=epochs - state.epoch,
                    verbose=2 if hvd.rank() == 0 else 0)


train(state)

if hvd.rank() == 0:
    print('ELASTIC_DONE size=%d epoch=%d' % (hvd.size(), state.epoch))
