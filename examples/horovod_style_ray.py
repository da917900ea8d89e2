"""A Keras training job on Ray written the way Horovod's published
examples/ray/tensorflow2_mnist_ray.py is written: the same hvd and
RayExecutor calls in the same order. Moving it from Horovod to tfring
changes the import lines only:

    import horovod.tensorflow.keras as hvd     # before
    from horovod.ray import RayExecutor
    import tfring.keras as hvd                 # after
    from tfring.ray import RayExecutor

Run it with `python examples/horovod_style_ray.py` (a local Ray instance,
or `--address` of a cluster). The data are MNIST-shaped synthetic digits
made in each worker (no download); the flags shorten the run and size the
job for one machine (the defaults are the example's own settings: 2 hosts
of 4 workers with 8 CPUs each).

Differences from the Horovod example, none of them from tfring:
  * Keras 3: compile() no longer takes `experimental_run_tf_function`
    (the train step calls the optimizer tfring wraps), and a whole-model
    checkpoint is a `.keras` file, not `.h5`.
  * The example names the workers `num_slots` / `cpus_per_slot`, which
    Horovod's RayExecutor has since renamed `num_workers_per_host` /
    `cpus_per_worker`; this script uses the current names, which tfring's
    RayExecutor takes too.
  * Not in Horovod's example: `train` returns what the run did (loss,
    learning rate, a digest of the weights), and the driver checks that
    every worker ends with the same model and that the loss fell.
"""

import argparse
import hashlib
import json
import os

import numpy as np
import tensorflow as tf

import tfring.keras as hvd

import ray
from tfring.ray import RayExecutor

parser = argparse.ArgumentParser(
    description='Tensorflow Ray example',
    formatter_class=argparse.ArgumentDefaultsHelpFormatter)
parser.add_argument('--address', type=str, help="Ray cluster address")
parser.add_argument('--num-hosts', type=int, default=2)
parser.add_argument('--num-workers-per-host', type=int, default=4)
parser.add_argument('--cpus-per-worker', type=int, default=8)
parser.add_argument('--num-epochs', type=int, default=1)
parser.add_argument('--steps', type=int, default=500, help="global steps per epoch")
parser.add_argument('--batch-size', type=int, default=128)
parser.add_argument('--checkpoint-dir', default='.')


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


def train(num_epochs, steps=500, batch_size=128, checkpoint_dir='.'):
    # Horovod: initialize Horovod.
    hvd.init()

    # Horovod: pin GPU to be used to process local rank (one GPU per process)
    gpus = tf.config.experimental.list_physical_devices('GPU')
    for gpu in gpus:
        tf.config.experimental.set_memory_growth(gpu, True)
    if gpus:
        tf.config.experimental.set_visible_devices(gpus[hvd.local_rank()],
                                                   'GPU')

    (mnist_images, mnist_labels) = synthetic_mnist(seed=hvd.rank())

    dataset = tf.data.Dataset.from_tensor_slices(
        (tf.cast(mnist_images[..., tf.newaxis] / 255.0, tf.float32),
         tf.cast(mnist_labels, tf.int64)))
    dataset = dataset.repeat().shuffle(10000).batch(batch_size)

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
    opt = hvd.DistributedOptimizer(opt)

    mnist_model.compile(
        loss=tf.losses.SparseCategoricalCrossentropy(),
        optimizer=opt,
        metrics=['accuracy'])

    callbacks = [
        # Horovod: broadcast initial variable states from rank 0 to all other processes.
        # This is necessary to ensure consistent initialization of all workers when
        # training is started with random weights or restored from a checkpoint.
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),

        # Horovod: average metrics among workers at the end of every epoch.
        #
        # Note: This callback must be in the list before the ReduceLROnPlateau,
        # TensorBoard or other metrics-based callbacks.
        hvd.callbacks.MetricAverageCallback(),

        # Horovod: using `lr = 1.0 * hvd.size()` from the very beginning leads to worse final
        # accuracy. Scale the learning rate `lr = 1.0` ---> `lr = 1.0 * hvd.size()` during
        # the first three epochs. See https://arxiv.org/abs/1706.02677 for details.
        hvd.callbacks.LearningRateWarmupCallback(
            initial_lr=scaled_lr, warmup_epochs=3, verbose=1),
    ]

    # Horovod: save checkpoints only on worker 0 to prevent other workers from corrupting them.
    if hvd.rank() == 0:
        callbacks.append(
            tf.keras.callbacks.ModelCheckpoint(
                os.path.join(checkpoint_dir, 'checkpoint-{epoch}.keras')))

    # Horovod: write logs on worker 0.
    verbose = 1 if hvd.rank() == 0 else 0

    # Train the model.
    # Horovod: adjust number of steps based on number of GPUs.
    history = mnist_model.fit(
        dataset,
        steps_per_epoch=steps // hvd.size(),
        callbacks=callbacks,
        epochs=num_epochs,
        verbose=verbose)

    # Not in Horovod's example: what this worker ended with.
    digest = hashlib.sha256(b"".join(
        np.ascontiguousarray(w).tobytes() for w in mnist_model.get_weights()))
    return {"rank": hvd.rank(), "size": hvd.size(), "loss": history.history['loss'],
            "learning_rate": float(np.array(opt.learning_rate)),
            "weights_sha256": digest.hexdigest()}


if __name__ == '__main__':
    args = parser.parse_args()
    ray.init(address=args.address)
    settings = RayExecutor.create_settings(timeout_s=30)
    executor = RayExecutor(
        settings, num_hosts=args.num_hosts, num_workers_per_host=args.num_workers_per_host,
        use_gpu=False, cpus_per_worker=args.cpus_per_worker)
    executor.start()
    results = executor.run(train, kwargs=dict(
        num_epochs=args.num_epochs, steps=args.steps, batch_size=args.batch_size,
        checkpoint_dir=os.path.abspath(args.checkpoint_dir)))
    executor.shutdown()

    # Not in Horovod's example: every worker ends with rank 0's model, and
    # training lowered the loss.
    assert [r["rank"] for r in results] == list(range(len(results))), results
    assert len({r["weights_sha256"] for r in results}) == 1, \
        f"the workers' models differ: {[r['weights_sha256'][:16] for r in results]}"
    print(json.dumps({"ranks": len(results), "loss": results[0]["loss"],
                      "learning_rate": results[0]["learning_rate"],
                      "weights_sha256": results[0]["weights_sha256"]}), flush=True)
