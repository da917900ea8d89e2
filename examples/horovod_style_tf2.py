"""A TF2 custom training loop written the way Horovod's published
tensorflow2_mnist.py example is written: the same hvd calls in the same
order. Moving it from Horovod to tfring changes the import line only:

    import horovod.tensorflow as hvd     # before
    import tfring as hvd                 # after

Run it with `tfring-run -np 2 python examples/horovod_style_tf2.py`.
The data are MNIST-shaped synthetic digits made here (no download); the
flags shorten the run (the defaults are the example's own settings).

One difference from the Horovod example comes from Keras 3, not from
tfring: an optimizer's `variables` is a list, no longer a method.
"""

import argparse
import hashlib
import os
import sys

import numpy as np
import tensorflow as tf

import tfring as hvd


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
    loss = tf.losses.SparseCategoricalCrossentropy()

    # Horovod: adjust learning rate based on number of GPUs.
    opt = tf.optimizers.Adam(0.001 * hvd.size())

    checkpoint_dir = './checkpoints'
    checkpoint = tf.train.Checkpoint(model=mnist_model, optimizer=opt)

    @tf.function
    def training_step(images, labels, first_batch):
        with tf.GradientTape() as tape:
            probs = mnist_model(images, training=True)
            loss_value = loss(labels, probs)

        # Horovod: add Horovod Distributed GradientTape.
        tape = hvd.DistributedGradientTape(tape)

        grads = tape.gradient(loss_value, mnist_model.trainable_variables)
        opt.apply_gradients(zip(grads, mnist_model.trainable_variables))

        # Horovod: broadcast initial variable states from rank 0 to all other processes.
        # This is necessary to ensure consistent initialization of all workers when
        # training is started with random weights or restored from a checkpoint.
        #
        # Note: broadcast should be done after the first gradient step to ensure optimizer
        # initialization.
        if first_batch:
            hvd.broadcast_variables(mnist_model.variables, root_rank=0)
            hvd.broadcast_variables(opt.variables, root_rank=0)

        return loss_value

    # Horovod: adjust number of steps based on number of GPUs.
    for batch, (images, labels) in enumerate(dataset.take(args.steps // hvd.size())):
        loss_value = training_step(images, labels, batch == 0)

        if batch % 10 == 0 and hvd.local_rank() == 0:
            print('Step #%d\tLoss: %.6f' % (batch, loss_value))

    # Horovod: save checkpoints only on worker 0 to prevent other workers from
    # corrupting it.
    if hvd.rank() == 0:
        checkpoint.save(os.path.join(checkpoint_dir, 'ckpt'))

    # Not in Horovod's example: show that every rank ends with the same model.
    digest = hashlib.sha256(b"".join(
        np.ascontiguousarray(w).tobytes() for w in mnist_model.get_weights()))
    print(f"rank {hvd.rank()} loss {float(loss_value):.4f} "
          f"weights sha256 {digest.hexdigest()[:16]}", flush=True)


if __name__ == '__main__':
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10000,
                        help="global steps (divided by size)")
    parser.add_argument("--batch-size", type=int, default=128)
    main(parser.parse_args(sys.argv[1:]))
