"""Keras training inside Spark written the way the model-training part of
Horovod's published examples/spark/keras/keras_spark_rossmann_run.py is
written: the model built and compiled on the driver, sent to the tasks as
bytes, and trained by `horovod.spark.run(train_fn, ...)` with the same hvd
calls and callbacks in the same order. Moving it from Horovod to tfring
changes the import lines only:

    import horovod.spark                       # before
    import horovod.tensorflow.keras as hvd
    import tfring as horovod                   # after: horovod.spark.run is
    import tfring.spark                        #   tfring.spark.run
    import tfring.keras as hvd

Run it with `python examples/horovod_style_spark.py --training-master
'local-cluster[2,1,1024]'` (a real Spark: two executors on this host) or
against a cluster. The data are Rossmann-shaped synthetic store sales made
and written to Parquet by Spark here (no download, no feature
engineering); the flags shorten the run (the defaults are the example's).

Differences from the Horovod example, none of them from tfring:
  * Keras 3 / TF2: no tf.Session or ConfigProto (GPUs are pinned with
    tf.config, as Horovod's TF2 examples do); a model is saved to a
    `.keras` file, not into an h5py handle, so the model bytes are that
    file's; `Embedding` takes no `input_length`; the optimizer's rate is
    `optimizer.learning_rate` (Keras 3 has no K.get_value/set_value, and
    `lr=` is `learning_rate=`); tf.log is tf.math.log; ReduceLROnPlateau
    on a custom metric needs `mode='min'` (Keras 3 no longer guesses).
  * Petastorm's make_batch_reader / make_petastorm_dataset read each
    rank's shard of the Parquet data; here tfring.spark.make_dataset does
    (each rank reads its own files: rank r of n reads files r, r+n, ...).
  * Not in Horovod's example: each rank prints its own (not yet averaged)
    epoch metrics and a digest of its trainable weights (the same on every
    rank: batch normalization's moving statistics are each rank's own),
    the driver checks that the loss fell and prints the history it got
    back. tests/run/test_engine_examples.py checks these against numpy.
"""

import argparse
import hashlib
import json
import os
import sys
import tempfile

import numpy as np
import pyarrow as pa
from pyspark import SparkConf
from pyspark.sql import SparkSession

parser = argparse.ArgumentParser(description='Keras Spark Rossmann Run Example',
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
parser.add_argument('--master', help='spark cluster to use for data preparation')
parser.add_argument('--num-proc', type=int, default=2,
                    help='number of worker processes for training')
parser.add_argument('--learning-rate', type=float, default=0.0001,
                    help='initial learning rate')
parser.add_argument('--batch-size', type=int, default=100, help='batch size')
parser.add_argument('--epochs', type=int, default=100, help='number of epochs to train')
parser.add_argument('--sample-rate', type=float, help='desired sampling rate')
parser.add_argument('--data-dir', default='file://' + os.getcwd(),
                    help='location of data on local filesystem (prefixed with file://)')
parser.add_argument('--local-checkpoint-file', default='checkpoint.keras',
                    help='model checkpoint on the driver')
parser.add_argument('--training-master', help='spark cluster to use for training')
parser.add_argument('--rows', type=int, default=20000, help='synthetic sales rows')
parser.add_argument('--width', type=int, default=1000, help='width of the first dense layers')

# The Rossmann columns this example keeps: categorical ones become
# embeddings, continuous ones go through batch normalization.
categorical_cols = ['Store', 'DayOfWeek', 'Promo', 'StateHoliday', 'StoreType']
continuous_cols = ['CompetitionDistance', 'Max_TemperatureC', 'Mean_Humidity']
all_cols = categorical_cols + continuous_cols
vocab = {'Store': 50, 'DayOfWeek': 7, 'Promo': 2, 'StateHoliday': 2, 'StoreType': 4}


def synthetic_sales(spark, rows, seed):
    """A DataFrame of store-day sales: each store has its own level, which
    the day, a promotion, a holiday, the store type and the weather move."""
    rng = np.random.default_rng(seed)
    cols = {c: rng.integers(0, vocab[c], rows) for c in categorical_cols}
    cols['CompetitionDistance'] = rng.uniform(0.0, 1.0, rows)
    cols['Max_TemperatureC'] = rng.normal(0.0, 1.0, rows)
    cols['Mean_Humidity'] = rng.normal(0.0, 1.0, rows)
    level = np.random.default_rng(0).uniform(7.5, 9.0, vocab['Store'])
    log_sales = (level[cols['Store']] + 0.05 * cols['DayOfWeek'] + 0.3 * cols['Promo']
                 - 0.4 * cols['StateHoliday'] + 0.1 * cols['StoreType']
                 - 0.2 * cols['CompetitionDistance'] + 0.05 * cols['Max_TemperatureC']
                 + rng.normal(0.0, 0.05, rows))
    cols['Sales'] = np.exp(log_sales)
    data = [tuple(float(cols[c][i]) for c in all_cols + ['Sales']) for i in range(rows)]
    return spark.createDataFrame(data, all_cols + ['Sales'])


if __name__ == '__main__':
    args = parser.parse_args()

    # ================ #
    # DATA PREPARATION #
    # ================ #

    print('================')
    print('Data preparation')
    print('================')

    conf = SparkConf().setAppName('data_prep')
    if args.master or args.training_master:
        conf.setMaster(args.master or args.training_master)
    spark = SparkSession.builder.config(conf=conf).getOrCreate()

    train_df = synthetic_sales(spark, args.rows, seed=1)
    val_df = synthetic_sales(spark, args.rows // 5, seed=2)
    if args.sample_rate:
        train_df = train_df.sample(withReplacement=False, fraction=args.sample_rate)
        val_df = val_df.sample(withReplacement=False, fraction=args.sample_rate)
    # One file per rank and a few more: every rank reads its own files.
    train_df.repartition(2 * args.num_proc).write.mode('overwrite') \
        .parquet('%s/train_df.parquet' % args.data_dir)
    val_df.repartition(2 * args.num_proc).write.mode('overwrite') \
        .parquet('%s/val_df.parquet' % args.data_dir)

    max_sales = train_df.agg({'Sales': 'max'}).collect()[0][0]
    train_rows, val_rows = train_df.count(), val_df.count()
    print('Training: %d' % train_rows)
    print('Validation: %d' % val_rows)

    # ============== #
    # MODEL TRAINING #
    # ============== #

    print('==============')
    print('Model training')
    print('==============')

    import tensorflow as tf
    from tensorflow.keras.layers import (Input, Embedding, Concatenate, Dense, Flatten, Reshape,
                                         BatchNormalization, Dropout)
    import tfring as horovod
    import tfring.spark
    import tfring.keras as hvd

    def exp_rmspe(y_true, y_pred):
        """Competition evaluation metric, expects logarithic inputs."""
        pct = tf.square((tf.exp(y_true) - tf.exp(y_pred)) / tf.exp(y_true))
        # Compute mean excluding stores with zero denominator.
        x = tf.reduce_sum(tf.where(y_true > 0.001, pct, tf.zeros_like(pct)))
        y = tf.reduce_sum(tf.where(y_true > 0.001, tf.ones_like(pct), tf.zeros_like(pct)))
        return tf.sqrt(x / y)

    def act_sigmoid_scaled(x):
        """Sigmoid scaled to logarithm of maximum sales scaled by 20%."""
        return tf.nn.sigmoid(x) * tf.math.log(max_sales) * 1.2

    CUSTOM_OBJECTS = {'exp_rmspe': exp_rmspe,
                      'act_sigmoid_scaled': act_sigmoid_scaled}

    def serialize_model(model):
        """Serialize model into byte array."""
        with tempfile.TemporaryDirectory() as d:
            model.save(os.path.join(d, 'model.keras'))
            with open(os.path.join(d, 'model.keras'), 'rb') as f:
                return f.read()

    def deserialize_model(model_bytes, load_model_fn):
        """Deserialize model from byte array."""
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, 'model.keras'), 'wb') as f:
                f.write(model_bytes)
            return load_model_fn(os.path.join(d, 'model.keras'), custom_objects=CUSTOM_OBJECTS)

    # Build the model.
    inputs = {col: Input(shape=(1,), name=col) for col in all_cols}
    embeddings = [Embedding(vocab[col], 10, name='emb_' + col)(inputs[col])
                  for col in categorical_cols]
    continuous_bn = Concatenate()([Reshape((1, 1), name='reshape_' + col)(inputs[col])
                                   for col in continuous_cols])
    continuous_bn = BatchNormalization()(continuous_bn)
    x = Concatenate()(embeddings + [continuous_bn])
    x = Flatten()(x)
    x = Dense(args.width, activation='relu',
              kernel_regularizer=tf.keras.regularizers.l2(0.00005))(x)
    x = Dense(args.width, activation='relu',
              kernel_regularizer=tf.keras.regularizers.l2(0.00005))(x)
    x = Dense(args.width, activation='relu',
              kernel_regularizer=tf.keras.regularizers.l2(0.00005))(x)
    x = Dense(args.width // 2, activation='relu',
              kernel_regularizer=tf.keras.regularizers.l2(0.00005))(x)
    x = Dropout(0.5)(x)
    output = Dense(1, activation=act_sigmoid_scaled)(x)
    model = tf.keras.Model([inputs[f] for f in all_cols], output)
    model.summary()

    # Horovod: add Distributed Optimizer.
    opt = tf.keras.optimizers.Adam(learning_rate=args.learning_rate, epsilon=1e-3)
    opt = hvd.DistributedOptimizer(opt)
    model.compile(opt, 'mae', metrics=[exp_rmspe])
    model_bytes = serialize_model(model)

    def train_fn(model_bytes):
        # Make sure pyarrow is referenced before anything else to avoid segfault due to conflict
        # with TensorFlow libraries.  Use `pa` package reference to ensure it's loaded before
        # functions like `deserialize_model` which are implemented at the top level.
        # See https://jira.apache.org/jira/browse/ARROW-3346
        pa

        import atexit
        import tfring.keras as hvd
        import os
        import tfring.spark
        import tempfile
        import tensorflow as tf
        import shutil

        # Horovod: initialize Horovod inside the trainer.
        hvd.init()

        # Horovod: pin GPU to be used to process local rank (one GPU per process), if GPUs are
        # available.
        gpus = tf.config.experimental.list_physical_devices('GPU')
        for gpu in gpus:
            tf.config.experimental.set_memory_growth(gpu, True)
        if gpus:
            tf.config.experimental.set_visible_devices(gpus[hvd.local_rank()], 'GPU')

        # Horovod: restore from checkpoint, use hvd.load_model under the hood.
        model = deserialize_model(model_bytes, hvd.load_model)

        # Horovod: adjust learning rate based on number of processes.
        scaled_lr = float(np.array(model.optimizer.learning_rate)) * hvd.size()
        model.optimizer.learning_rate = scaled_lr

        # Horovod: print summary logs on the first worker.
        verbose = 2 if hvd.rank() == 0 else 0

        class RankLogs(tf.keras.callbacks.Callback):
            """Not in Horovod's example: this rank's own epoch-end metrics,
            before MetricAverageCallback averages them."""

            def on_epoch_end(self, epoch, logs=None):
                print(json.dumps({'rank': hvd.rank(), 'epoch': epoch,
                                  **{k: float(v) for k, v in logs.items()}}), flush=True)

        callbacks = [
            RankLogs(),

            # Horovod: broadcast initial variable states from rank 0 to all other processes.
            # This is necessary to ensure consistent initialization of all workers when
            # training is started with random weights or restored from a checkpoint.
            hvd.callbacks.BroadcastGlobalVariablesCallback(root_rank=0),

            # Horovod: average metrics among workers at the end of every epoch.
            #
            # Note: This callback must be in the list before the ReduceLROnPlateau,
            # TensorBoard, or other metrics-based callbacks.
            hvd.callbacks.MetricAverageCallback(),

            # Horovod: using `lr = 1.0 * hvd.size()` from the very beginning leads to worse final
            # accuracy. Scale the learning rate `lr = 1.0` ---> `lr = 1.0 * hvd.size()` during
            # the first five epochs. See https://arxiv.org/abs/1706.02677 for details.
            hvd.callbacks.LearningRateWarmupCallback(initial_lr=scaled_lr, warmup_epochs=5,
                                                     verbose=verbose),

            # Reduce LR if the metric is not improved for 10 epochs, and stop training
            # if it has not improved for 20 epochs.
            tf.keras.callbacks.ReduceLROnPlateau(monitor='val_exp_rmspe', mode='min', patience=10,
                                                 verbose=verbose),
            tf.keras.callbacks.EarlyStopping(monitor='val_exp_rmspe', mode='min', patience=20,
                                             verbose=verbose),
            tf.keras.callbacks.TerminateOnNaN()
        ]

        # Model checkpoint location.
        ckpt_dir = tempfile.mkdtemp()
        ckpt_file = os.path.join(ckpt_dir, 'checkpoint.keras')
        atexit.register(lambda: shutil.rmtree(ckpt_dir))

        # Horovod: save checkpoints only on the first worker to prevent other workers from
        # corrupting them.
        if hvd.rank() == 0:
            callbacks.append(tf.keras.callbacks.ModelCheckpoint(ckpt_file, monitor='val_exp_rmspe',
                                                                mode='min', save_best_only=True))

        # Make the readers: this rank's files of each Parquet directory.
        def as_inputs(x, y):
            return (tuple(x[:, i:i + 1] for i in range(len(all_cols))),
                    tf.math.log(tf.cast(y, tf.float32)))

        train_ds, _ = tfring.spark.make_dataset(
            '%s/train_df.parquet' % args.data_dir.replace('file://', ''), all_cols, 'Sales',
            batch_size=args.batch_size, shuffle=True, seed=hvd.rank(),
            rank=hvd.rank(), size=hvd.size())
        train_ds = train_ds.map(as_inputs)
        val_ds, _ = tfring.spark.make_dataset(
            '%s/val_df.parquet' % args.data_dir.replace('file://', ''), all_cols, 'Sales',
            batch_size=args.batch_size, rank=hvd.rank(), size=hvd.size())
        val_ds = val_ds.map(as_inputs)

        history = model.fit(train_ds,
                            validation_data=val_ds,
                            steps_per_epoch=int(train_rows / args.batch_size / hvd.size()),
                            validation_steps=int(val_rows / args.batch_size / hvd.size()),
                            callbacks=callbacks,
                            verbose=verbose,
                            epochs=args.epochs)

        # Not in Horovod's example: the trainable weights every rank ends with
        # (batch normalization's moving statistics are each rank's own).
        digest = hashlib.sha256(b"".join(
            np.ascontiguousarray(w).tobytes() for w in model.trainable_weights))
        print('rank %d trainable weights sha256 %s' % (hvd.rank(), digest.hexdigest()), flush=True)

        if hvd.rank() == 0:
            with open(ckpt_file, 'rb') as f:
                return history.history, f.read()

    # Create Spark session for training.
    conf = SparkConf().setAppName('training')
    if args.training_master:
        conf.setMaster(args.training_master)
    spark = SparkSession.builder.config(conf=conf).getOrCreate()

    # Horovod: run training.
    history, best_model_bytes = \
        horovod.spark.run(train_fn, args=(model_bytes,), num_proc=args.num_proc,
                          stdout=sys.stdout, stderr=sys.stderr, verbose=2,
                          prefix_output_with_timestamp=True)[0]

    best_val_rmspe = min(history['val_exp_rmspe'])
    print('Best RMSPE: %f' % best_val_rmspe)

    # Write checkpoint.
    with open(args.local_checkpoint_file, 'wb') as f:
        f.write(best_model_bytes)
    print('Written checkpoint to %s' % args.local_checkpoint_file)

    # Not in Horovod's example: the history's loss fell.
    assert history['loss'][-1] < history['loss'][0], history['loss']
    print('HISTORY ' + json.dumps({k: [float(v) for v in vs] for k, vs in history.items()}))

    spark.stop()
