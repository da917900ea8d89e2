"""Rank worker for tests/hvd/test_hvd_keras.py: Horovod's Keras API on tfring
(import tfring.keras as hvd), each check against a single-process
reference computed here on the full (global) batch.

argv[1]: a directory shared by the ranks; argv[2]: "all" or "syncbn" (the
SyncBatchNormalization checks only, for the 4-rank job). Results go back
as {check: {"ok": bool, "error": str, "max_diff": float, "tol": float,
...}}; the test asserts max_diff <= tol.
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras
import numpy as np
import tensorflow as tf
from common import checker, digest, report

import tfring
import tfring.keras as hvd
from tfring import _core

tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(2)

hvd.init()
RANK, SIZE = hvd.rank(), hvd.size()
SHARED = sys.argv[1]
MODE = sys.argv[2] if len(sys.argv) > 2 else "all"
FEATURES = 5
TOL = 2e-5       # float32 weights after a few SGD steps vs. float32 reference
results = {}
check = checker(results, announce=True)


def barrier(tag):
    _core.allreduce(np.zeros(1, np.float32), name=f"barrier.{tag}")


def data(n, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, FEATURES)).astype(np.float32)
    y = (np.sin(x).sum(axis=1, keepdims=True)
         + 0.1 * rng.normal(size=(n, 1))).astype(np.float32)
    return x, y


def shard_batches(a, batch):
    """This rank's 1/SIZE of each global batch of `batch` rows."""
    blocks = a.reshape(len(a) // batch, batch, *a.shape[1:])
    part = batch // SIZE
    return blocks[:, RANK * part:(RANK + 1) * part].reshape(-1, *a.shape[1:])


def diff(a, b):
    return max(float(np.max(np.abs(np.asarray(x) - np.asarray(y))))
               for x, y in zip(a, b))


def weights(model):
    return [np.asarray(w) for w in model.get_weights()]


def mlp(seed, optimizer, bn=None, loss="mse", jit_compile="auto"):
    keras.utils.set_random_seed(seed)
    layers = [keras.Input((FEATURES,)), keras.layers.Dense(8, activation="tanh")]
    if bn is not None:
        layers.append(bn())
    layers.append(keras.layers.Dense(1))
    model = keras.Sequential(layers)
    model.compile(optimizer=optimizer, loss=loss, jit_compile=jit_compile)
    return model


# ------------------------------------------------- SyncBatchNormalization --

def uneven_sizes():
    return [3 + 2 * r for r in range(SIZE)]    # 3, 5, 7, 9 rows


@check("syncbn_layer_uneven")
def _():
    """Training calls on uneven local batches: outputs, input gradients,
    gamma/beta gradients and moving statistics equal BatchNormalization on
    the concatenated batch; inference too."""
    sizes = uneven_sizes()
    start = sum(sizes[:RANK])
    mine = slice(start, start + sizes[RANK])
    sbn = hvd.SyncBatchNormalization(momentum=0.8)
    ref = keras.layers.BatchNormalization(momentum=0.8)
    sbn.build((None, FEATURES))
    ref.build((None, FEATURES))
    rng = np.random.default_rng(7)
    worst = 0.0
    for step in range(3):
        xg = (rng.normal(size=(sum(sizes), FEATURES)) * (step + 1)
              + step).astype(np.float32)
        wg = rng.normal(size=xg.shape).astype(np.float32)
        x = tf.constant(xg[mine])
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = sbn(x, training=True)
            loss = tf.reduce_sum(y * wg[mine])
        gx, gg, gb = tape.gradient(loss, [x, sbn.gamma, sbn.beta])
        xr = tf.constant(xg)
        with tf.GradientTape() as tape:
            tape.watch(xr)
            yr = ref(xr, training=True)
            lr_ = tf.reduce_sum(yr * wg)
        rx, rg, rb = tape.gradient(lr_, [xr, ref.gamma, ref.beta])
        # gamma/beta gradients: each rank holds its rows' part; their sum
        # over ranks is the full batch's.
        gg, gb = tfring.allreduce(gg, op=tfring.Sum), tfring.allreduce(
            gb, op=tfring.Sum)
        worst = max(worst, diff([y, gx, gg, gb],
                                [yr.numpy()[mine], rx.numpy()[mine], rg, rb]))
    worst = max(worst, diff([sbn.moving_mean, sbn.moving_variance],
                            [ref.moving_mean, ref.moving_variance]))
    xt = rng.normal(size=(4, FEATURES)).astype(np.float32)
    worst = max(worst, diff([sbn(xt, training=False)],
                            [ref(xt, training=False)]))
    return {"max_diff": worst, "tol": 1e-4}


@check("syncbn_fit")
def _():
    """model.fit with SyncBatchNormalization, SIZE ranks x 1/SIZE of each
    batch == one process with BatchNormalization on the full batch:
    weights, moving statistics and predictions."""
    batch = 8 * SIZE
    x, y = data(batch * 4, seed=3)
    model = mlp(5 + RANK, hvd.DistributedOptimizer(keras.optimizers.SGD(0.05)),
                bn=hvd.SyncBatchNormalization)
    model.fit(shard_batches(x, batch), shard_batches(y, batch),
              batch_size=batch // SIZE, epochs=2, shuffle=False, verbose=0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    ref = mlp(5, keras.optimizers.SGD(0.05),
              bn=keras.layers.BatchNormalization)
    ref.fit(x, y, batch_size=batch, epochs=2, shuffle=False, verbose=0)
    xt, _ = data(16, seed=4)
    return {"max_diff": diff(weights(model) + [model.predict(xt, verbose=0)],
                             weights(ref) + [ref.predict(xt, verbose=0)]),
            "tol": TOL, "digest": digest(weights(model))}


# --------------------------------------------------- gradient accumulation --

PASSES = 4


def accumulation_reference(x, y, batch, seed, lr, average, epochs=1):
    """One process: one SGD step per PASSES global batches, on their
    concatenation; the sum of PASSES mean gradients is PASSES times their
    mean, so Horovod's default (sum) is the same step at PASSES x lr."""
    ref = mlp(seed, keras.optimizers.SGD(lr * (1 if average else PASSES),
                                         momentum=0.9))
    ref.fit(x, y, batch_size=batch * PASSES, epochs=epochs, shuffle=False,
            verbose=0)
    return ref


if MODE == "all":
    for average in (False, True):
        tag = "average" if average else "sum"

        @check(f"accumulate_fit_{tag}")
        def _(average=average):
            batch = 2 * SIZE
            x, y = data(batch * PASSES * 3, seed=11)
            opt = hvd.DistributedOptimizer(
                keras.optimizers.SGD(0.02, momentum=0.9),
                backward_passes_per_step=PASSES,
                average_aggregated_gradients=average)
            model = mlp(12 + RANK, opt)
            seen = []
            log = keras.callbacks.LambdaCallback(
                on_train_batch_end=lambda b, logs: seen.append(
                    int(model.optimizer.iterations.numpy())))
            model.fit(shard_batches(x, batch), shard_batches(y, batch),
                      batch_size=batch // SIZE, epochs=2, shuffle=False,
                      verbose=0, callbacks=[
                          hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                          log])
            ref = accumulation_reference(x, y, batch, 12, 0.02, average,
                                         epochs=2)
            return {"max_diff": diff(weights(model), weights(ref)),
                    "tol": TOL, "digest": digest(weights(model)),
                    "iterations": seen}

        @check(f"accumulate_custom_loop_{tag}")
        def _(average=average):
            """A Keras 3 optimizer's apply(), eagerly and in tf.function,
            plus DistributedGradientTape(backward_passes_per_step)."""
            batch = 2 * SIZE
            x, y = data(batch * PASSES * 2, seed=13)
            xs, ys = shard_batches(x, batch), shard_batches(y, batch)
            local = batch // SIZE
            out = {}
            for how in ("eager", "function", "tape"):
                model = mlp(14, None)
                if how == "tape":
                    opt = keras.optimizers.SGD(0.02, momentum=0.9)
                else:
                    opt = hvd.DistributedOptimizer(
                        keras.optimizers.SGD(0.02, momentum=0.9),
                        backward_passes_per_step=PASSES,
                        average_aggregated_gradients=average)

                def step(bx, by):
                    with tf.GradientTape() as tape:
                        loss = keras.losses.mean_squared_error(
                            by, model(bx, training=True))
                        loss = tf.reduce_mean(loss)
                    if how == "tape":
                        tape = hvd.DistributedGradientTape(
                            tape, backward_passes_per_step=PASSES,
                            average_aggregated_gradients=average)
                        grads = tape.gradient(loss, model.trainable_variables)
                        if grads[0] is not None:
                            opt.apply(grads, model.trainable_variables)
                        return
                    grads = tape.gradient(loss, model.trainable_variables)
                    opt.apply(grads, model.trainable_variables)

                run = tf.function(step) if how == "function" else step
                for i in range(len(xs) // local):
                    run(tf.constant(xs[i * local:(i + 1) * local]),
                        tf.constant(ys[i * local:(i + 1) * local]))
                ref = accumulation_reference(x, y, batch, 14, 0.02, average)
                out[how] = diff(weights(model), weights(ref))
            return {"max_diff": max(out.values()), "tol": TOL, "each": out}


# --------------------------------------- DistributedOptimizer(keras_opt) --

if MODE == "all":
    @check("tfring_distributed_optimizer_keras")
    def _():
        """tfring.DistributedOptimizer given a Keras 3 optimizer, with every
        Horovod keyword, trains in fit (compiled with jit_compile=True) like
        one process on the full batch."""
        batch = 4 * SIZE
        x, y = data(batch * 6, seed=21)
        kwargs = dict(name=None, device_dense="/gpu:0", device_sparse="",
                      compression=tfring.Compression.none,
                      sparse_as_dense=False, backward_passes_per_step=1,
                      op=tfring.Average, gradient_predivide_factor=1.0,
                      average_aggregated_gradients=False, num_groups=0,
                      groups=None, process_set=getattr(
                          tfring, "global_process_set", None),
                      scale_local_gradients=True)
        opt = tfring.DistributedOptimizer(
            keras.optimizers.SGD(0.05, momentum=0.9), **kwargs)
        # XLA on, as Keras 3 sets it by default on GPU hosts: the broadcast
        # callback turns it off for the step that runs tfring's ops.
        model = mlp(22 + RANK, opt, jit_compile=True)
        model.fit(shard_batches(x, batch), shard_batches(y, batch),
                  batch_size=batch // SIZE, epochs=2, shuffle=False,
                  verbose=0, callbacks=[
                      hvd.callbacks.BroadcastGlobalVariablesCallback(
                          0, device="", local_variables=[]),
                      hvd.callbacks.MetricAverageCallback(device="")])
        ref = mlp(22, keras.optimizers.SGD(0.05, momentum=0.9))
        ref.fit(x, y, batch_size=batch, epochs=2, shuffle=False, verbose=0)
        return {"max_diff": diff(weights(model), weights(ref)), "tol": TOL,
                "digest": digest(weights(model)),
                "type": type(model.optimizer).__name__}

    # ------------------------------------------------------ local layers --

    @check("partial_tape")
    def _():
        """PartialDistributedGradientTape: the local layer's gradients are
        this rank's own (divided by SIZE with scale_local_gradients, as
        Horovod), the others the average over ranks."""
        x, y = data(4 * SIZE, seed=31)
        model = mlp(32, None)
        local_layer = model.layers[0]
        out = {}
        for scale in (True, False):
            def grads_of(rows):
                with tf.GradientTape() as tape:
                    loss = tf.reduce_mean(keras.losses.mean_squared_error(
                        y[rows], model(x[rows])))
                return tape, loss
            mine = slice(RANK * 4, RANK * 4 + 4)
            tape, loss = grads_of(mine)
            tape = hvd.PartialDistributedGradientTape(
                tape, local_layers=[local_layer], scale_local_gradients=scale)
            got = tape.gradient(loss, model.trainable_variables)
            per_rank = []
            for r in range(SIZE):
                t, l_ = grads_of(slice(r * 4, r * 4 + 4))
                per_rank.append([g.numpy() for g in t.gradient(
                    l_, model.trainable_variables)])
            n_local = len(local_layer.trainable_weights)
            want = [per_rank[RANK][i] / (SIZE if scale else 1)
                    for i in range(n_local)]
            want += [np.mean([p[i] for p in per_rank], axis=0)
                     for i in range(n_local, len(per_rank[0]))]
            out[str(scale)] = diff(got, want)
        tape, loss = grads_of(mine)
        tape = hvd.PartialDistributedGradientTape(tape,
                                                  local_layers=local_layer)
        local, shared = tape.get_local_and_global_gradients(
            loss, model.trainable_variables)
        return {"max_diff": max(out.values()), "tol": 1e-6, "each": out,
                "split": [len(local), len(shared)]}

    @check("partial_optimizer_fit")
    def _():
        """PartialDistributedOptimizer in fit: shared layers end equal on
        every rank and equal to the reference; the local layer trains on
        this rank's data alone (its gradients scaled by 1/SIZE)."""
        batch = 4 * SIZE
        x, y = data(batch * 4, seed=41)
        keras.utils.set_random_seed(42)
        model = mlp(42, None)
        local_layer = model.layers[-1]
        opt = hvd.PartialDistributedOptimizer(keras.optimizers.SGD(0.05),
                                              local_layers=[local_layer])
        model.compile(optimizer=opt, loss="mse")
        model.fit(shard_batches(x, batch), shard_batches(y, batch),
                  batch_size=batch // SIZE, epochs=1, shuffle=False,
                  verbose=0, callbacks=[
                      hvd.callbacks.BroadcastGlobalVariablesCallback(
                          0, local_variables=local_layer.trainable_weights)])
        shared = [np.asarray(w) for w in model.layers[0].get_weights()]
        return {"shared_digest": digest(shared),
                "local_digest": digest(weights(model)[len(shared):]),
                "max_diff": 0.0, "tol": 0.0}

    # -------------------------------------------------------- callbacks --

    @check("lr_schedule")
    def _():
        """LearningRateScheduleCallback (staircase and per batch) sets
        initial_lr * multiplier(epoch) within [start_epoch, end_epoch)."""
        x, y = data(8 * SIZE, seed=51)
        out = {}
        for staircase in (True, False):
            model = mlp(52, hvd.DistributedOptimizer(keras.optimizers.SGD(0.1)))
            lrs = []
            cb = hvd.callbacks.LearningRateScheduleCallback(
                initial_lr=0.1, multiplier=lambda e: 0.5 ** e, start_epoch=1,
                end_epoch=3, staircase=staircase)
            rec = keras.callbacks.LambdaCallback(
                on_train_batch_begin=lambda b, logs: lrs.append(float(
                    np.asarray(model.optimizer.learning_rate))))
            hist = model.fit(shard_batches(x, 2 * SIZE),
                             shard_batches(y, 2 * SIZE), batch_size=2,
                             epochs=4, shuffle=False, verbose=0,
                             callbacks=[cb, rec])
            steps = 4
            want = []
            for e in range(4):
                for b in range(steps):
                    if e < 1:
                        want.append(0.1)
                    elif e < 3:
                        want.append(0.1 * 0.5 ** (e if staircase
                                                  else e + b / steps))
                    else:
                        want.append(want[-1])
            out[str(staircase)] = diff([lrs], [want])
            out[f"lr_logged_{staircase}"] = hist.history["lr"]
        return {"max_diff": max(v for v in out.values()
                                if isinstance(v, float)),
                "tol": 1e-7, "each": out}

    @check("best_model_checkpoint")
    def _():
        """BestModelCheckpoint saves only improvements of `monitor`: the
        file holds the weights of the epoch with the lowest loss."""
        x, y = data(8 * SIZE, seed=61)
        path = os.path.join(SHARED, f"best{RANK}.weights.h5")
        model = mlp(62, hvd.DistributedOptimizer(
            keras.optimizers.SGD(0.3, momentum=0.9)))
        snaps = []
        rec = keras.callbacks.LambdaCallback(
            on_epoch_end=lambda e, logs: snaps.append(weights(model)))
        ckpt = hvd.callbacks.BestModelCheckpoint(monitor="loss",
                                                 save_weights_only=True)
        ckpt.filepath = path
        hist = model.fit(shard_batches(x, 2 * SIZE), shard_batches(y, 2 * SIZE),
                         batch_size=2, epochs=6, shuffle=False, verbose=0,
                         callbacks=[hvd.callbacks.MetricAverageCallback(),
                                    rec, ckpt])
        best = int(np.argmin(hist.history["loss"]))
        model.load_weights(path)
        return {"max_diff": diff(weights(model), snaps[best]), "tol": 0.0,
                "losses": hist.history["loss"]}

    @check("load_model")
    def _():
        """hvd.load_model of a model saved mid-training (Adam state
        included) resumes with a DistributedOptimizer: 2 ranks continue like
        one process continuing the plain load on the full batch."""
        batch = 4 * SIZE
        x, y = data(batch * 4, seed=71)
        path = os.path.join(SHARED, "saved.keras")
        if RANK == 0:
            m = mlp(72, keras.optimizers.Adam(0.01))
            m.fit(x, y, batch_size=batch, epochs=1, shuffle=False, verbose=0)
            m.save(path)
        barrier("saved")
        model = hvd.load_model(path)
        iters = int(model.optimizer.iterations.numpy())
        model.fit(shard_batches(x, batch), shard_batches(y, batch),
                  batch_size=batch // SIZE, epochs=1, shuffle=False,
                  verbose=0,
                  callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
        ref = keras.models.load_model(path)
        ref.fit(x, y, batch_size=batch, epochs=1, shuffle=False, verbose=0)
        return {"max_diff": diff(weights(model), weights(ref)), "tol": TOL,
                "iterations_loaded": iters,
                "distributed": getattr(model.optimizer, "_tfring_config",
                                       None) is not None,
                "class": type(model.optimizer).__name__}

    @check("broadcast_global_variables")
    def _():
        """Horovod's broadcast_global_variables(root_rank) with the model
        named, and tfring's older (model, root_rank) form."""
        a = mlp(81 + RANK, keras.optimizers.SGD(0.1))
        hvd.broadcast_global_variables(0, model=a)
        b = mlp(91 + RANK, keras.optimizers.SGD(0.1))
        hvd.broadcast_global_variables(b, 0)
        try:
            hvd.broadcast_global_variables(0)
            eager_error = None
        except RuntimeError as e:
            eager_error = str(e)
        return {"max_diff": max(diff(weights(a), weights(mlp(81, None))),
                                diff(weights(b), weights(mlp(91, None)))),
                "tol": 0.0, "eager_error": eager_error}


# ------------------------------------------------------------- tf_keras --

def _legacy():
    try:
        import tf_keras
    except ImportError:
        return None, None
    import tfring.keras.legacy as hvdl
    return tf_keras, hvdl


if MODE == "all":
    @check("legacy_accumulate_fit")
    def _():
        """tf_keras: DistributedOptimizer(backward_passes_per_step=4) in
        fit, sum and average, == one step on the 4x batch."""
        tf_keras, hvdl = _legacy()
        if tf_keras is None:
            return {"skipped": "tf_keras is not installed"}

        def model_of(seed, opt):
            tf_keras.utils.set_random_seed(seed)
            m = tf_keras.Sequential([
                tf_keras.layers.Dense(8, activation="tanh",
                                      input_shape=(FEATURES,)),
                tf_keras.layers.Dense(1)])
            m.compile(optimizer=opt, loss="mse")
            return m

        batch = 2 * SIZE
        x, y = data(batch * PASSES * 2, seed=101)
        out = {}
        for average in (False, True):
            opt = hvdl.DistributedOptimizer(
                tf_keras.optimizers.SGD(0.02, momentum=0.9),
                backward_passes_per_step=PASSES,
                average_aggregated_gradients=average)
            model = model_of(102 + RANK, opt)
            model.fit(shard_batches(x, batch), shard_batches(y, batch),
                      batch_size=batch // SIZE, epochs=2, shuffle=False,
                      verbose=0, callbacks=[
                          hvdl.callbacks.BroadcastGlobalVariablesCallback(0)])
            ref = model_of(102, tf_keras.optimizers.SGD(
                0.02 * (1 if average else PASSES), momentum=0.9))
            ref.fit(x, y, batch_size=batch * PASSES, epochs=2,
                    shuffle=False, verbose=0)
            out[str(average)] = diff(model.get_weights(), ref.get_weights())
        return {"max_diff": max(out.values()), "tol": TOL, "each": out}

    @check("legacy_syncbn_and_callbacks")
    def _():
        """tf_keras SyncBatchNormalization on uneven batches == BN on the
        concatenation; the tf_keras LR schedule callback,
        PartialDistributedOptimizer and load_model."""
        tf_keras, hvdl = _legacy()
        if tf_keras is None:
            return {"skipped": "tf_keras is not installed"}
        sizes = uneven_sizes()
        start = sum(sizes[:RANK])
        mine = slice(start, start + sizes[RANK])
        sbn = hvdl.SyncBatchNormalization(momentum=0.8)
        ref = tf_keras.layers.BatchNormalization(momentum=0.8)
        rng = np.random.default_rng(5)
        worst = 0.0
        for step in range(2):
            xg = (rng.normal(size=(sum(sizes), FEATURES)) + step).astype(
                np.float32)
            worst = max(worst, diff([sbn(xg[mine], training=True)],
                                    [ref(xg, training=True).numpy()[mine]]))
        worst = max(worst, diff([sbn.moving_mean, sbn.moving_variance],
                                [ref.moving_mean, ref.moving_variance]))
        x, y = data(4 * SIZE, seed=111)
        tf_keras.utils.set_random_seed(1)
        m = tf_keras.Sequential([tf_keras.layers.Dense(
            3, input_shape=(FEATURES,)), tf_keras.layers.Dense(1)])
        m.compile(optimizer=hvdl.PartialDistributedOptimizer(
            tf_keras.optimizers.SGD(0.1), local_layers=m.layers[1]),
            loss="mse")
        lrs = []
        m.fit(x[RANK::SIZE], y[RANK::SIZE], batch_size=2, epochs=2,
              verbose=0, shuffle=False, callbacks=[
                  hvdl.callbacks.LearningRateScheduleCallback(
                      0.1, 0.5, start_epoch=0),
                  tf_keras.callbacks.LambdaCallback(
                      on_epoch_begin=lambda e, logs: None,
                      on_train_batch_end=lambda b, logs: lrs.append(
                          float(tf_keras.backend.get_value(
                              m.optimizer.learning_rate))))])
        want = [0.1] * 2 + [0.05] * 2
        worst_lr = diff([lrs], [want])
        # load_model: the saved optimizer state comes back, distributed.
        path = os.path.join(SHARED, f"legacy{RANK}.keras")
        m.save(path)
        loaded = hvdl.load_model(path)
        restored = diff(
            [loaded.optimizer.iterations.numpy()] + loaded.get_weights(),
            [m.optimizer.iterations.numpy()] + m.get_weights())
        return {"max_diff": max(worst, worst_lr, restored), "tol": 1e-4,
                "shared_digest": digest(m.layers[0].get_weights()),
                "distributed": getattr(loaded.optimizer, "_tfring_config",
                                       None) is not None}


report(results)
sys.stdout.flush()
