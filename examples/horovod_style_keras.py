"""A Keras training script written the way Horovod's published
tensorflow2_keras_mnist.py example is written: the same hvd calls in the
same order. Moving it from Horovod to tfring changes the import line only:

    import horovod.tensorflow.keras as hvd     # before
    import tfring.keras as hvd                 # after

Run it with `tfring-run -np 2 python examples/horovod_style_keras.py`.
The data are MNIST-shaped synthetic digits made here (no download); the
flags shorten the run (the defaults are the example's own settings).

Two differences from the Horovod example come from Keras 3, not from
tfring: `tf.optimizers` are Keras 3 optimizers, and Keras 3's compile()
no longer takes `experimental_run_tf_function` (there is nothing to turn
off: the train step calls the optimizer tfring wraps).
"""

import argparse
import hashlib
import sys

import numpy as np
import tensorflow as tf

import tfring.keras as hvd


def synthetic_mnist(seed, n=6000):
    """28x28 images of 10 classes: each class lights its own blob of
    pixels, plus noise, so the model has something to learn."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 10, n)
    centers = np.random.default_rng(0).integers(4, 24, size=(10, 2))
    yy, xx = np.mgrid[0:28, 0:28]
    blobs = np.stack([np.exp(-((yy - cy) ** 2 + (xx - cx) ** 2) / 18.0)
                      for cy, cx in centers])
    images = blobs[labels] * 200 + rng.uniform(0, 55, size=(n, 28, 28))
    return images.astype(np.uint8), labels.astype(np.uint8)


def main(args):
    # Horovod: initialize Horovod.
    hvd.init()

    # Horovod: pin GPU to be used to process local rank (one GPU per process)
    gpus = tf.config.experimental.list_physical_devices('GPU')
    for gpu in gpus:
        tf.config.experimental.set_memory_growth(gpu, True)
    if gpus:
        tf.config.experimental.set_visible_devices(gpus[hvd.local_rank()], 'GPU')

    (mnist_images, mnist_labels) = synthetic_mnist(seed=hvd.rank())

    dataset = tf.data.Dataset.from_tensor_slices(
        (tf.cast(mnist_images[..., tf.newaxis] / 255.0, tf.float32),
         tf.cast(mnist_labels, tf.int64))
    )
    dataset = dataset.repeat().shuffle(10000, seed=hvd.rank()).batch(args.batch_size)

    mnist_model = tf.keras.Sequential([
        tf.keras.layers.Conv2D(32, [3, 3], activation='relu'),
        tf.keras.layers.Conv2D(64, [3, 3], activation='relu'),
        tf.keras.layers.MaxPooling2D(pool_size=(2, 2)),
        tf.keras.layers.Dropout(0.25),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(128, activation='relu'),
        tf.keras.layers.Dropout(0.5),
        tf.keras.layers.Dense(10, activation='softmax')
    ])

    # Horovod: adjust learning rate based on number of GPUs.
    scaled_lr = 0.001 * hvd.size()
    opt = tf.optimizers.Adam(scaled_lr)

    # Horovod: add Horovod DistributedOptimizer.
    opt = hvd.DistributedOptimizer(
        opt, backward_passes_per_step=1, average_aggregated_gradients=True)

    mnist_model.compile(loss=tf.losses.SparseCategoricalCrossentropy(),
                        optimizer=opt,
                        metrics=['accuracy'])

    callbacks = [
        # Horovod: broadcast initial variable states from rank 0 to all other processes.
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),

        # Horovod: average metrics among workers at the end of every epoch.
        hvd.callbacks.MetricAverageCallback(),

        # Horovod: warm the learning rate up to lr * size over the first epochs.
        hvd.callbacks.LearningRateWarmupCallback(initial_lr=scaled_lr, warmup_epochs=3, verbose=1),
    ]

    # Horovod: save checkpoints only on worker 0 to prevent other workers from corrupting them.
    if hvd.rank() == 0:
        callbacks.append(tf.keras.callbacks.ModelCheckpoint('./checkpoint-{epoch}.h5'))

    # Horovod: write logs on worker 0.
    verbose = 1 if hvd.rank() == 0 else 0

    # Train the model.
    # Horovod: adjust number of steps based on number of GPUs.
    history = mnist_model.fit(dataset, steps_per_epoch=args.steps // hvd.size(),
                              callbacks=callbacks, epochs=args.epochs, verbose=verbose)

    # Not in Horovod's example: show that every rank ends with the same model.
    digest = hashlib.sha256(b"".join(
        np.ascontiguousarray(w).tobytes() for w in mnist_model.get_weights()))
    print(f"rank {hvd.rank()} loss {history.history['loss'][-1]:.4f} "
          f"weights sha256 {digest.hexdigest()[:16]}", flush=True)


if __name__ == '__main__':
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=24)
    parser.add_argument("--steps", type=int, default=500,
                        help="global steps per epoch (divided by size)")
    parser.add_argument("--batch-size", type=int, default=128)
    main(parser.parse_args(sys.argv[1:]))
