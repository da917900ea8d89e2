"""Rank worker for tests/tf/test_keras.py: model.fit with tfring's Keras
callbacks on 2 ranks.

Every rank takes its half of each global batch; rank 0 then trains the same
model in one process on the full batches without tfring and reports its
largest difference from that reference. Ranks initialize with different
seeds, so matching the reference also shows the broadcast from rank 0.
argv[1] is a directory shared by the ranks. Results go back as
{check: {"ok": bool, "error": str, ...}}.
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras
import numpy as np
import tensorflow as tf
from common import checker, digest, report

import tfring.keras as tk
from tfring import _core

tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(2)

tk.init()
RANK, SIZE = tk.rank(), tk.size()
SHARED = sys.argv[1]
MINE = os.path.join(SHARED, f"rank{RANK}")
os.makedirs(MINE, exist_ok=True)
N, FEATURES, BATCH = 64, 6, 16     # BATCH: the global batch
TOL = 1e-5                         # float32, a few SGD steps
results = {}
check = checker(results, announce=True)


def barrier(tag):
    _core.allreduce(np.zeros(1, np.float32), name=f"barrier.{tag}")


def dataset(n=N, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, FEATURES)).astype(np.float32)
    y = (np.sin(x).sum(axis=1, keepdims=True) + 0.1 * rng.normal(size=(n, 1))).astype(np.float32)
    return x, y


def halves(a, rank=RANK, size=SIZE, batch=BATCH):
    """Rank's share of every global batch: its 1/size of each block."""
    blocks = a.reshape(len(a) // batch, batch, *a.shape[1:])
    part = batch // size
    return blocks[:, rank * part:(rank + 1) * part].reshape(-1, *a.shape[1:])


def make_model(seed, optimizer=None):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((FEATURES,)),
                              keras.layers.Dense(16, activation="tanh"),
                              keras.layers.Dense(1)])
    model.compile(optimizer=optimizer or keras.optimizers.SGD(0.05, momentum=0.9),
                  loss="mse", metrics=["mae"])
    return model


def weights(model):
    return [np.asarray(w) for w in model.get_weights()]


def max_diff(a, b):
    return max(float(np.max(np.abs(x - y))) for x, y in zip(a, b))


class Recorder(keras.callbacks.Callback):
    """Keeps copies of the epoch logs as this rank saw them (put it before
    the averaging callback to see local values)."""

    def __init__(self):
        super().__init__()
        self.epochs = []

    def on_epoch_end(self, epoch, logs=None):
        self.epochs.append(dict(logs or {}))


X, Y = dataset()
XV, YV = dataset(32, seed=1)


@check("fit")
def _():
    model = make_model(1 + RANK)
    local = Recorder()
    ckpt = os.path.join(MINE, "ckpt.weights.h5")
    hist = model.fit(
        halves(X), halves(Y), batch_size=BATCH // SIZE, epochs=2, shuffle=False,
        validation_data=(halves(XV), halves(YV)), verbose=2,
        callbacks=[local, tk.callbacks.RingAllreduceCallback(),
                   keras.callbacks.ModelCheckpoint(ckpt, save_weights_only=True)])
    out = {"digest": digest(weights(model)), "history": hist.history,
           "local": local.epochs, "checkpoint_written": os.path.exists(ckpt)}
    # A full save (with optimizer state) from rank 0 for the restore check;
    # outside fit every rank saves normally.
    if RANK == 0:
        model.save(os.path.join(SHARED, "restore.keras"))
        ref = make_model(1)
        ref.fit(X, Y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
        out["max_diff"] = max_diff(weights(model), weights(ref))
    barrier("saved")
    return out


@check("fit_per_epoch")
def _():
    # An epoch alone first traces the train function without reduction;
    # the callback's first fit must trace it again, later fits (once per
    # epoch, as some loops call it) must keep that trace.
    model = make_model(21 + RANK)
    model.fit(halves(X), halves(Y), batch_size=BATCH // SIZE, epochs=1,
              shuffle=False, verbose=0)
    alone = id(model.train_function)
    cb = tk.callbacks.RingAllreduceCallback()
    fns = []
    for _ in range(3):
        model.fit(halves(X), halves(Y), batch_size=BATCH // SIZE, epochs=1,
                  shuffle=False, verbose=0, callbacks=[cb])
        fns.append(id(model.train_function))
    out = {"digest": digest(weights(model)), "functions": len(set(fns)),
           "retraced_after_alone": alone not in fns}
    if RANK == 0:
        # Rank 0's lone epoch is broadcast, then the job trains as one
        # process on the full batch.
        ref = make_model(21)
        ref.fit(halves(X), halves(Y), batch_size=BATCH // SIZE, epochs=1,
                shuffle=False, verbose=0)
        for _ in range(3):
            ref.fit(X, Y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
        out["max_diff"] = max_diff(weights(model), weights(ref))
    return out


@check("fit_unbuilt")
def _():
    # Models without an Input are built by their first batch: the callbacks
    # broadcast rank 0's weights then, so every rank ends equal, also when
    # the fit has one batch.
    out = {}
    for name, steps, callback in (
            ("ring", 3, lambda: tk.callbacks.RingAllreduceCallback()),
            ("ring_one_batch", 1, lambda: tk.callbacks.RingAllreduceCallback()),
            ("hvd", 3, lambda: tk.callbacks.BroadcastGlobalVariablesCallback(0)),
            ("hvd_one_batch", 1,
             lambda: tk.callbacks.BroadcastGlobalVariablesCallback(0))):
        keras.utils.set_random_seed(31 + RANK)
        model = keras.Sequential([keras.layers.Dense(8, activation="tanh"),
                                  keras.layers.Dense(1)])
        opt = keras.optimizers.SGD(0.05)
        if name.startswith("hvd"):
            opt = tk.DistributedOptimizer(opt)
        model.compile(optimizer=opt, loss="mse")
        cb = callback()
        model.fit(halves(X), halves(Y), batch_size=BATCH // SIZE,
                  steps_per_epoch=steps, epochs=1, shuffle=False, verbose=0,
                  callbacks=[cb])
        out[name] = digest(weights(model))
    return out


@check("restored")
def _():
    # Rank 0 restores the checkpoint (weights, momentum, iteration count);
    # the others start fresh: the callback broadcasts rank 0's state.
    path = os.path.join(SHARED, "restore.keras")
    model = keras.models.load_model(path) if RANK == 0 else make_model(7)
    model.fit(halves(X), halves(Y), batch_size=BATCH // SIZE, epochs=1,
              shuffle=False, verbose=0,
              callbacks=[tk.callbacks.RingAllreduceCallback()])
    out = {"digest": digest(weights(model)),
           "iterations": int(model.optimizer.iterations.numpy())}
    if RANK == 0:
        ref = keras.models.load_model(path)
        ref.fit(X, Y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
        out["max_diff"] = max_diff(weights(model), weights(ref))
    return out


@check("steps_per_epoch")
def _():
    def ds(x, y, batch):
        return tf.data.Dataset.from_tensor_slices((x, y)).batch(batch).repeat()

    model = make_model(11 + RANK)
    model.fit(ds(halves(X), halves(Y), BATCH // SIZE), steps_per_epoch=3,
              epochs=2, verbose=0,
              callbacks=[tk.callbacks.RingAllreduceCallback()])
    out = {"digest": digest(weights(model))}
    if RANK == 0:
        ref = make_model(11)
        ref.fit(ds(X, Y, BATCH), steps_per_epoch=3, epochs=2, verbose=0)
        out["max_diff"] = max_diff(weights(model), weights(ref))
    return out


class LRLog(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.lrs = []

    def on_train_batch_begin(self, batch, logs=None):
        self.lrs.append(float(keras.ops.convert_to_numpy(
            self.model.optimizer.learning_rate)))


class LRReplay(keras.callbacks.Callback):
    def __init__(self, lrs):
        super().__init__()
        self.lrs = list(lrs)
        self.i = 0

    def on_train_batch_begin(self, batch, logs=None):
        self.model.optimizer.learning_rate = self.lrs[self.i]
        self.i += 1


@check("horovod_style")
def _():
    # DistributedOptimizer + BroadcastGlobalVariablesCallback +
    # MetricAverageCallback + LearningRateWarmupCallback.
    opt = tk.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9))
    model = make_model(21 + RANK, optimizer=opt)
    lrs, local = LRLog(), Recorder()
    hist = model.fit(
        halves(X), halves(Y), batch_size=BATCH // SIZE, epochs=3,
        shuffle=False, verbose=1 if RANK == 0 else 0,
        callbacks=[tk.callbacks.BroadcastGlobalVariablesCallback(0), local,
                   tk.callbacks.MetricAverageCallback(),
                   tk.callbacks.LearningRateWarmupCallback(
                       initial_lr=0.1, warmup_epochs=2, verbose=1),
                   lrs])
    out = {"digest": digest(weights(model)), "lrs": lrs.lrs,
           "history": hist.history, "local": local.epochs,
           "steps": len(X) // BATCH}
    if RANK == 0:
        ref = make_model(21)
        ref.fit(X, Y, batch_size=BATCH, epochs=3, shuffle=False, verbose=0,
                callbacks=[LRReplay(lrs.lrs)])
        out["max_diff"] = max_diff(weights(model), weights(ref))
    return out


@check("save_load_distributed_optimizer")
def _():
    # A model saved with a DistributedOptimizer loads without tfring.
    opt = tk.DistributedOptimizer(keras.optimizers.Adam(0.01))
    model = make_model(3, optimizer=opt)
    model.fit(halves(X), halves(Y), batch_size=BATCH // SIZE, epochs=1,
              verbose=0, shuffle=False)
    path = os.path.join(MINE, "dist_opt.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    cls = type(loaded.optimizer)
    return {"class": f"{cls.__module__}.{cls.__name__}",
            "plain": not hasattr(cls, "_tfring_base"),
            "digest": digest(weights(model))}


@check("tf_keras")
def _():
    # The same callback bound to tf_keras (Keras 2), when it is installed.
    try:
        import tf_keras
    except ImportError:
        return {"skipped": "tf_keras is not installed"}
    import tfring.keras.legacy as tkl

    def model_of(seed):
        tf_keras.utils.set_random_seed(seed)
        m = tf_keras.Sequential([
            tf_keras.layers.Dense(16, activation="tanh", input_shape=(FEATURES,)),
            tf_keras.layers.Dense(1)])
        m.compile(optimizer=tf_keras.optimizers.SGD(0.05, momentum=0.9),
                  loss="mse")
        return m

    model = model_of(31 + RANK)
    model.fit(halves(X), halves(Y), batch_size=BATCH // SIZE, epochs=2,
              shuffle=False, verbose=0,
              callbacks=[tkl.callbacks.RingAllreduceCallback()])
    out = {"digest": digest(weights(model))}
    if RANK == 0:
        ref = model_of(31)
        ref.fit(X, Y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
        out["max_diff"] = max_diff(weights(model), weights(ref))
    return out


report(results)
sys.stdout.flush()
