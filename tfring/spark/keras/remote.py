"""What each rank of a KerasEstimator fit runs (Horovod's
horovod.spark.keras.remote): ``train(spec)``, through the backend.

On every rank:
  1. tfring.keras.init(); pin the rank to its local GPU (use_gpu, when
     there are GPUs) or hide them; seed Keras (random_seed);
  2. load the model from its .keras bytes, compile it with
     tfring.keras.DistributedOptimizer around the optimizer rebuilt from its
     config, the learning rate scaled by the number of ranks (a schedule
     wrapped in a ScaledLearningRateSchedule); when resuming, load the
     checkpoint's weights and optimizer state (the step count included),
     the rate scaled afresh from the user's unscaled one;
  3. open its shard of the training (and validation) Parquet files and agree
     with the other ranks on the steps per epoch (reader.py);
  4. model.fit with BroadcastGlobalVariablesCallback(0) (every rank starts
     from rank 0's weights) and MetricAverageCallback (metrics, history
     included, are the ranks' average) first, then the user's callbacks;
     rank 0 also checkpoints every epoch into a local folder and publishes
     the checkpoint (tagged with the epoch) and the TensorBoard logs to the
     store, each file under a temporary name moved into place.
Rank 0 returns the history and the trained model's bytes; other ranks
return None.
"""

import os
import sys
import tempfile
import time

import numpy as np

from tfring.spark.common import reader as rd
from tfring.spark.common import tf_feed
from tfring.spark.keras import _serialize as ser


class TrainSpec:
    """Everything a rank needs, built by the estimator on the driver
    (plain values, bytes and the user's picklable callables)."""

    def __init__(self, **kw):
        self.__dict__.update(kw)


def _pin_devices(use_gpu, local_rank, verbose):
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        return
    try:
        if use_gpu:
            gpu = gpus[local_rank % len(gpus)]
            tf.config.experimental.set_memory_growth(gpu, True)
            tf.config.set_visible_devices(gpu, "GPU")
            if verbose:
                print(f"KerasEstimator: local rank {local_rank} uses {gpu.name}", flush=True)
        else:
            tf.config.set_visible_devices([], "GPU")
    except RuntimeError as e:  # TF already initialized in this (reused) Python worker
        print(f"KerasEstimator: cannot change the visible GPUs here ({e}); training on "
              "the devices TensorFlow already uses", flush=True)


def _target_shape(col_shape, model_shape):
    """The per-row shape to feed: the model's, its one unknown dimension
    filled from the column; the column's own when the model leaves more
    open."""
    if model_shape is None:
        return list(col_shape)
    model_shape = [None if d in (None, -1) else int(d) for d in model_shape]
    size = int(np.prod(col_shape)) if col_shape else 1
    unknown = [i for i, d in enumerate(model_shape) if d is None]
    if not unknown:
        return model_shape if int(np.prod(model_shape or [1])) == size else list(col_shape)
    if len(unknown) == 1:
        known = int(np.prod([d for d in model_shape if d is not None] or [1]))
        if known and size % known == 0:
            out = list(model_shape)
            out[unknown[0]] = size // known
            return out
    return list(col_shape)


def _dtype_name(tensor, default):
    dtype = getattr(tensor, "dtype", None)
    return getattr(dtype, "name", None) or (str(dtype) if dtype is not None else default)


class _Element:
    """Turns a reader batch (column -> numpy) into Keras' (x, y[, w])."""

    def __init__(self, spec, model, batch_size):
        import tensorflow as tf

        meta = spec.metadata
        floatx = spec.floatx
        label_shapes = spec.label_shapes
        self.x, self.y = [], []
        for col, t in zip(spec.feature_cols, model.inputs):
            shape = _target_shape(meta[col]["shape"], list(t.shape)[1:])
            self.x.append((col, shape, _dtype_name(t, floatx)))
        for j, (col, t) in enumerate(zip(spec.label_cols, model.outputs)):
            target = label_shapes[j] if label_shapes else list(t.shape)[1:]
            shape = _target_shape(meta[col]["shape"], target)
            kind = np.dtype(meta[col]["dtype"]).kind
            dtype = meta[col]["dtype"] if kind in "iu" else _dtype_name(t, floatx)
            self.y.append((col, shape, dtype))
        self.w = spec.sample_weight_col
        specs = lambda cols: tuple(tf.TensorSpec((batch_size, *s), d) for _, s, d in cols)  # noqa: E731
        xs, ys = specs(self.x), specs(self.y)
        sig = [xs if len(xs) > 1 else xs[0], ys if len(ys) > 1 else ys[0]]
        if self.w:
            ws = tuple(tf.TensorSpec((batch_size,), floatx) for _ in self.y)
            sig.append(ws if len(ws) > 1 else ws[0])
        self.signature = tuple(sig)
        self.floatx = floatx

    def __call__(self, batch):
        def take(cols):
            out = tuple(batch[c].reshape((-1, *s)).astype(d, copy=False) for c, s, d in cols)
            return out if len(out) > 1 else out[0]

        element = [take(self.x), take(self.y)]
        if self.w:
            w = batch[self.w].reshape(-1).astype(self.floatx, copy=False)
            element.append(tuple(w for _ in self.y) if len(self.y) > 1 else w)
        return tuple(element)


def _compile(spec, model, size):
    """Compiles the model with a DistributedOptimizer, the learning rate
    scaled by size: a float rate becomes rate * size, a
    LearningRateSchedule is wrapped in a ScaledLearningRateSchedule
    (_schedule.py). Returns (the scaled float rate or None, whether a
    schedule was scaled)."""
    import keras

    import tfring.keras as tk
    from tfring.spark.keras import _schedule

    kw = {"backward_passes_per_step": spec.backward_passes_per_step}
    if spec.gradient_compression is not None:
        kw["compression"] = spec.gradient_compression
    # DistributedOptimizer rebuilds the optimizer from its config: a custom
    # schedule given in custom_objects must be found there too.
    with keras.saving.custom_object_scope(spec.custom_objects or {}):
        opt = keras.optimizers.deserialize(spec.optimizer, custom_objects=spec.custom_objects)
        dist = tk.DistributedOptimizer(opt, **kw)
    scaled, schedule = None, False
    if spec.base_lr is not None:
        scaled = spec.base_lr * size
        dist.learning_rate = scaled
    else:
        schedule = _schedule.scale_optimizer(dist, size)
    model.compile(optimizer=dist,
                  loss=ser.deserialize_compile_arg(spec.loss, spec.custom_objects),
                  loss_weights=spec.loss_weights,
                  metrics=ser.deserialize_compile_arg(spec.metrics, spec.custom_objects))
    return scaled, schedule


def _readers(spec, store, rank, size):
    """(train reader, steps, val reader or None, val steps, val batch)."""
    cols = list(dict.fromkeys(spec.feature_cols + spec.label_cols
                              + ([spec.sample_weight_col] if spec.sample_weight_col else [])))
    shapes = {c: spec.metadata[c]["shape"] for c in cols}
    dtypes = {c: spec.metadata[c]["dtype"] for c in cols}
    fs = store.filesystem
    local = lambda files: [store.get_localized_path(f) for f in files]  # noqa: E731
    train = rd.ShardReader(fs, rd.shard_files(local(spec.train_files), rank, size), shapes,
                           spec.batch_size, shuffle=spec.shuffle, buffer_rows=spec.buffer_rows,
                           seed=spec.seed, rank=rank, inmemory_cache_all=spec.inmemory_cache_all,
                           transformation_fn=spec.transformation_fn, dtypes=dtypes)
    steps = spec.train_steps_per_epoch
    if not steps:
        steps = rd.agreed_steps(train.steps_per_pass(), "tfring.spark.estimator.train_steps")
        if steps == 0:
            fewest = rd.agreed_steps(train.num_rows(), "tfring.spark.estimator.train_rows")
            raise ValueError(f"the smallest training shard holds {fewest} rows, fewer than "
                             f"batch_size={spec.batch_size}: lower batch_size or use fewer "
                             "ranks")
    if not spec.val_files:
        return train, steps, None, None, None
    vbs = spec.val_batch_size or spec.batch_size
    mine = rd.shard_files(local(spec.val_files), rank, size)
    val = rd.ShardReader(fs, mine, shapes, vbs, rank=rank,
                         inmemory_cache_all=spec.inmemory_cache_all,
                         transformation_fn=spec.transformation_fn, dtypes=dtypes)
    val_steps = spec.validation_steps_per_epoch
    if not val_steps:
        val_steps = rd.agreed_steps(val.steps_per_pass(), "tfring.spark.estimator.val_steps")
        if val_steps == 0:
            # Validation smaller than a batch per rank: one batch of the
            # smallest shard's rows on every rank.
            vbs = rd.agreed_steps(val.num_rows(), "tfring.spark.estimator.val_rows")
            if vbs == 0:
                raise ValueError("a rank's validation shard is empty")
            val = rd.ShardReader(fs, mine, shapes, vbs, rank=rank,
                                 inmemory_cache_all=spec.inmemory_cache_all,
                                 transformation_fn=spec.transformation_fn, dtypes=dtypes)
            val_steps = 1
    return train, steps, val, val_steps, vbs


def _publisher_class():
    import keras

    class StorePublisher(keras.callbacks.Callback):
        """Rank 0: after each epoch, publishes the local checkpoint (when it
        changed, tagged with the epoch and history) and the run's logs to
        the store."""

        def __init__(self, spec, ckpt_file, run_dir, prior_history, size):
            super().__init__()
            self.spec, self.ckpt_file, self.run_dir, self.size = spec, ckpt_file, run_dir, size
            self.history = {k: list(v) for k, v in (prior_history or {}).items()}
            self._stamp = None
            self._sync = spec.store.sync_fn(spec.run_id)
            self.published = None

        def on_epoch_end(self, epoch, logs=None):
            for k, v in (logs or {}).items():
                if isinstance(v, (int, float, np.number)) and not isinstance(v, bool):
                    self.history.setdefault(k, []).append(float(v))
            self._publish(epoch + 1)
            self._sync(self.run_dir)

        def on_train_end(self, logs=None):
            self._sync(self.run_dir)

        def _publish(self, epochs_done):
            if not os.path.exists(self.ckpt_file):
                return
            st = os.stat(self.ckpt_file)
            stamp = (st.st_mtime_ns, st.st_size)
            if stamp == self._stamp:
                return
            store, run_id = self.spec.store, self.spec.run_id
            tagged = self.ckpt_file + ".tagged"
            info = {"epoch": epochs_done, "history": self.history, "run_id": run_id,
                    "size": self.size, "base_lr": self.spec.base_lr}
            ser.tag_checkpoint(self.ckpt_file, tagged, info)
            try:
                dest = f"{store.get_checkpoint_path(run_id)}/{store.get_checkpoint_filename()}"
                store.upload(tagged, dest)
            finally:
                os.remove(tagged)
            self._stamp = stamp
            self.published = epochs_done

    return StorePublisher


def _tensorboard_installed():
    import importlib.util

    return importlib.util.find_spec("tensorboard") is not None


def _rank0_callbacks(spec, callbacks, out_dir, size):
    """The checkpoint, TensorBoard and publishing callbacks of rank 0."""
    import keras

    store = spec.store
    ckpt_dir = os.path.join(out_dir, "checkpoint")
    run_dir = os.path.join(out_dir, "run")
    os.makedirs(ckpt_dir)
    os.makedirs(run_dir)
    ckpt_file = os.path.join(ckpt_dir, store.get_checkpoint_filename())
    ckpt = spec.checkpoint_callback or keras.callbacks.ModelCheckpoint(ckpt_file)
    ckpt.filepath = ckpt_file
    callbacks.append(ckpt)
    logs_dir = os.path.join(run_dir, store.get_logs_subdir())
    tensorboard = [c for c in callbacks if isinstance(c, keras.callbacks.TensorBoard)]
    if tensorboard:
        for c in tensorboard:
            c.log_dir = logs_dir
            c._log_write_dir = logs_dir
            callbacks.remove(c)
            callbacks.append(c)
    elif _tensorboard_installed():
        callbacks.append(keras.callbacks.TensorBoard(logs_dir, write_graph=False,
                                                     profile_batch=0))
    elif spec.verbose:
        print("KerasEstimator: no TensorBoard logs (pip install tensorboard to get them in "
              "the run's logs folder)", flush=True)
    publisher = _publisher_class()(spec, ckpt_file, run_dir, spec.prior_history, size)
    callbacks.append(publisher)
    return publisher, ckpt_file


def _timer_class():
    import keras

    class StepTimer(keras.callbacks.Callback):
        """Marks the end of the first step; records the time between steps
        within an epoch and when each epoch begins (the result's timing)."""

        def __init__(self, marks):
            super().__init__()
            self.marks, self.intervals, self.epoch_begins, self._last = marks, [], [], None

        def on_epoch_begin(self, epoch, logs=None):
            self.epoch_begins.append(time.monotonic())
            self._last = None

        def on_train_batch_end(self, batch, logs=None):
            now = time.monotonic()
            self.marks.setdefault("first_step_end", now)
            if self._last is not None:
                self.intervals.append(now - self._last)
            self._last = now

        def summary(self):
            """step_s: the median time between steps within an epoch;
            epoch_s: the mean wall time of the epochs after the first
            (steps, validation and every epoch-end callback)."""
            out = {}
            if self.intervals:
                out["step_s"] = float(np.median(self.intervals))
            ends = self.epoch_begins[1:] + [self.marks.get("fit_end", time.monotonic())]
            walls = [e - b for b, e in zip(self.epoch_begins, ends)][1:]
            if walls:
                out["epoch_s"] = float(np.mean(walls))
            return out

    return StepTimer


def train(spec):
    """The function every rank runs (module docstring)."""
    t0, t0_wall = time.monotonic(), time.time()
    warm = "keras" in sys.modules
    import keras

    import tfring.keras as tk
    from tfring.keras import callbacks as tkc

    marks = {"imported": time.monotonic()}
    tk.init()
    marks["initialized"] = time.monotonic()
    rank, size = tk.rank(), tk.size()
    keras.backend.clear_session()
    keras.backend.set_floatx(spec.floatx)
    verbose = spec.verbose if rank == 0 else 0
    _pin_devices(spec.use_gpu, tk.local_rank(), verbose)
    if spec.random_seed is not None:
        keras.utils.set_random_seed(spec.random_seed)
    store = spec.store
    with tempfile.TemporaryDirectory(prefix="tfring-estimator-") as tmp:
        model = ser.bytes_to_model(spec.model_bytes, spec.custom_objects, compile=False,
                                   directory=tmp)
        scaled_lr, scaled_schedule = _compile(spec, model, size)
        if spec.resume:
            path = os.path.join(tmp, "resume.keras")
            with open(path, "wb") as f:
                f.write(spec.model_bytes)
            model.optimizer.build(model.trainable_variables)
            model.load_weights(path)  # weights and optimizer state
            if scaled_lr is not None:
                model.optimizer.learning_rate = scaled_lr
        marks["compiled"] = time.monotonic()
        train_reader, steps, val_reader, val_steps, vbs = _readers(spec, store, rank, size)
        marks["readers"] = time.monotonic()
        element = _Element(spec, model, spec.batch_size)
        train_ds = tf_feed.tf_dataset(train_reader, steps, spec.initial_epoch, element,
                                      element.signature, end_epoch=spec.epochs,
                                      prefetch=spec.prefetch)
        val_ds = None
        if val_reader is not None:
            vel = _Element(spec, model, vbs)
            val_ds = tf_feed.tf_dataset(val_reader, val_steps, 0, vel, vel.signature,
                                        prefetch=spec.prefetch)
        callbacks = [tk.callbacks.BroadcastGlobalVariablesCallback(0),
                     tk.callbacks.MetricAverageCallback()]
        for cb in spec.callbacks:
            if scaled_lr is not None and isinstance(cb, (tkc._LearningRateSchedule,
                                                         tkc._LearningRateWarmup)):
                cb.initial_lr = scaled_lr
            callbacks.append(cb)
        timer = _timer_class()(marks)
        callbacks.insert(0, timer)
        publisher = ckpt_file = None
        if rank == 0 and store.saving_runs():
            out_dir = os.path.join(tmp, "out")
            publisher, ckpt_file = _rank0_callbacks(spec, callbacks, out_dir, size)
        if verbose:
            print(f"KerasEstimator: {size} ranks, epochs {spec.initial_epoch}..{spec.epochs}, "
                  f"{steps} steps of {spec.batch_size} rows per rank per epoch"
                  + (f", validation {val_steps} steps of {vbs}" if val_reader else "")
                  + (f", learning rate {spec.base_lr:g} x {size}" if scaled_lr else "")
                  + (f", learning-rate schedule x {size}" if scaled_schedule else ""),
                  flush=True)
        history = model.fit(train_ds, steps_per_epoch=steps, epochs=spec.epochs,
                            initial_epoch=spec.initial_epoch, validation_data=val_ds,
                            validation_steps=val_steps, callbacks=callbacks, verbose=verbose,
                            shuffle=False)
        marks["fit_end"] = time.monotonic()
        if rank != 0:
            keras.backend.clear_session()
            return None
        full = {k: list(v) for k, v in (spec.prior_history or {}).items()}
        for k, v in history.history.items():
            full.setdefault(k, []).extend(float(x) for x in v)
        if spec.checkpoint_callback is not None and ckpt_file and os.path.exists(ckpt_file):
            with open(ckpt_file, "rb") as f:  # the model the user's checkpoint kept
                model_bytes = f.read()
        else:
            model_bytes = ser.model_to_bytes(model)
        keras.backend.clear_session()
        marks["result_ready"] = time.monotonic()
        timing = {k: round(v - t0, 4) for k, v in marks.items()}
        timing.update(timer.summary(), start_wall=t0_wall, pid=os.getpid(), warm_worker=warm)
        return {"history": full, "timing": timing, "model": model_bytes, "size": size,
                "epochs": spec.epochs, "steps_per_epoch": steps,
                "published_epoch": publisher.published if publisher else None}
