"""Data-parallel training on 2 ranks ends where one process training on the
concatenated batch ends, with bitwise identical weights on every rank:
a Horovod-style TF2 loop (DistributedGradientTape, initial variables
broadcast from rank 0) in eager mode and in tf.function, with sparse
(embedding) gradients; and tf.compat.v1 DistributedOptimizer in a session
with local gradient accumulation (backward_passes_per_step) and op=Sum.

One job of 2 ranks runs every check (this file is the worker script too);
the reference training runs inside each rank on the full batch.
"""

import functools
import os
import sys

import pytest

TESTS = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
SIZE = 2
CHECKS = ["keras_tape_eager", "keras_tape_function", "v1_optimizer_session",
          "v1_optimizer_eager_sum", "tape_accumulation_eager"]

if __name__ != "__main__":
    sys.path.insert(0, TESTS)
    from test_tf_ops import RANK_ENV
    from tf_util import tf_available

    pytestmark = pytest.mark.skipif(
        not tf_available(),
        reason="TensorFlow or tfring's op library (_tfring_ops.so) missing")

    _job = []

    def job():
        if not _job:
            from multiproc import run_ranks

            _job.append(run_ranks(SIZE, os.path.abspath(__file__), ["--worker"],
                                  env=RANK_ENV, timeout=300))
        return _job[0]

    def _outs(check):
        from multiproc import rank_results

        return rank_results(job(), check)

    @pytest.mark.parametrize("check", CHECKS)
    def test_training(check):
        outs = _outs(check)
        failed = [(r, o["error"]) for r, o in enumerate(outs) if o["error"]]
        assert not failed, "\n".join(f"rank {r}:\n{e}" for r, e in failed)
        # Every rank ends with the same weights, bit for bit.
        digests = [o["value"] for o in outs]
        assert all(d == digests[0] for d in digests), digests


# ------------------------------------------------------------- worker side --

STEPS = 5
LOCAL_BATCH = 6


def _digest(arrays):
    import hashlib

    import numpy as np

    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def _assert_close(label, got, exp, rtol=1e-5, atol=1e-6):
    import numpy as np

    for i, (g, e) in enumerate(zip(got, exp)):
        if not np.allclose(g, e, rtol=rtol, atol=atol):
            raise AssertionError(f"{label}[{i}]: max diff "
                                 f"{np.max(np.abs(np.asarray(g) - e))}\n"
                                 f"got {g!r}\nexpected {e!r}")


def _global_batch(step, size):
    """Every rank builds the whole batch; rank r trains on its slice."""
    import numpy as np

    rng = np.random.default_rng(1234 + step)
    n = LOCAL_BATCH * size
    ids = rng.integers(0, 20, (n, 3)).astype(np.int32)
    feats = rng.normal(size=(n, 8)).astype(np.float32)
    target = rng.normal(size=(n, 1)).astype(np.float32)
    return ids, feats, target


def _local(batch, rank):
    return [a[rank * LOCAL_BATCH:(rank + 1) * LOCAL_BATCH] for a in batch]


def _make_model(keras, seed):
    keras.utils.set_random_seed(seed)
    ids = keras.Input((3,), dtype="int32")
    feats = keras.Input((8,))
    emb = keras.layers.Embedding(20, 4)(ids)   # sparse (IndexedSlices) grads
    x = keras.layers.Concatenate()([keras.ops.mean(emb, axis=1), feats])
    x = keras.layers.Dense(16, activation="tanh")(x)
    out = keras.layers.Dense(1)(x)
    return keras.Model([ids, feats], out)


def _keras_tape(tf, tfring, rank, size, use_function):
    import keras

    # Different initial weights per rank: the broadcast must fix them.
    model = _make_model(keras, 100 + rank)
    tfring.broadcast_variables(model.variables, root_rank=0)
    reference = _make_model(keras, 999)
    reference.set_weights(model.get_weights())
    opt = keras.optimizers.SGD(learning_rate=0.1, momentum=0.9)
    ref_opt = keras.optimizers.SGD(learning_rate=0.1, momentum=0.9)

    def step(ids, feats, target):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model([ids, feats]) - target))
        tape = tfring.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    def ref_step(ids, feats, target):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(reference([ids, feats]) - target))
        grads = tape.gradient(loss, reference.trainable_variables)
        ref_opt.apply_gradients(zip(grads, reference.trainable_variables))

    if use_function:
        step = tf.function(step)
        ref_step = tf.function(ref_step)
    for s in range(STEPS):
        batch = _global_batch(s, size)
        step(*_local(batch, rank))
        if s == 0:
            # Horovod's habit: optimizer state exists after the first step.
            tfring.broadcast_variables(opt.variables, root_rank=0)
        ref_step(*batch)
    weights = model.get_weights()
    _assert_close("weights vs one process on the whole batch", weights,
                  reference.get_weights())
    return _digest(weights)


def check_keras_tape_eager(tf, tfring, rank, size):
    return _keras_tape(tf, tfring, rank, size, use_function=False)


def check_keras_tape_function(tf, tfring, rank, size):
    return _keras_tape(tf, tfring, rank, size, use_function=True)


def _linear_batch(call, size):
    import numpy as np

    rng = np.random.default_rng(500 + call)
    x = rng.normal(size=(LOCAL_BATCH * size, 8)).astype(np.float32)
    y = rng.normal(size=(LOCAL_BATCH * size, 1)).astype(np.float32)
    return x, y


def check_v1_optimizer_session(tf, tfring, rank, size):
    """MomentumOptimizer wrapped with backward_passes_per_step=2: every
    second session.run applies the mean gradient of 2 micro-batches on every
    rank, i.e. one step on their concatenation."""
    import numpy as np

    passes, updates = 2, 3
    w0 = np.random.default_rng(rank).normal(size=(8, 1)).astype(np.float32)

    def linear_loss(w, b, x, y):
        return tf.reduce_mean(tf.square(tf.matmul(x, w) + b - y))

    with tf.Graph().as_default():
        w = tf.compat.v1.Variable(w0)
        b = tf.compat.v1.Variable(np.zeros([1], np.float32))
        x = tf.compat.v1.placeholder(tf.float32, [LOCAL_BATCH, 8])
        y = tf.compat.v1.placeholder(tf.float32, [LOCAL_BATCH, 1])
        step = tf.compat.v1.train.get_or_create_global_step()
        opt = tfring.DistributedOptimizer(
            tf.compat.v1.train.MomentumOptimizer(0.05, 0.9),
            backward_passes_per_step=passes,
            average_aggregated_gradients=True)
        train = opt.minimize(linear_loss(w, b, x, y), global_step=step)
        bcast = tfring.broadcast_variables([w, b], root_rank=0)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(bcast)
            start = sess.run(w)
            for call in range(passes * updates):
                bx, by = _linear_batch(call, size)
                sl = slice(rank * LOCAL_BATCH, (rank + 1) * LOCAL_BATCH)
                sess.run(train, {x: bx[sl], y: by[sl]})
                assert sess.run(step) == (call + 1) // passes
            trained = sess.run([w, b])

    # One process: each update is a step on all micro-batches of its window.
    with tf.Graph().as_default():
        w = tf.compat.v1.Variable(start)
        b = tf.compat.v1.Variable(np.zeros([1], np.float32))
        x = tf.compat.v1.placeholder(tf.float32, [None, 8])
        y = tf.compat.v1.placeholder(tf.float32, [None, 1])
        train = tf.compat.v1.train.MomentumOptimizer(0.05, 0.9).minimize(
            linear_loss(w, b, x, y))
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for u in range(updates):
                batches = [_linear_batch(u * passes + p, size)
                           for p in range(passes)]
                sess.run(train, {x: np.concatenate([bx for bx, _ in batches]),
                                 y: np.concatenate([by for _, by in batches])})
            expected = sess.run([w, b])
    _assert_close("v1 session weights", trained, expected)
    return _digest(trained)


def check_v1_optimizer_eager_sum(tf, tfring, rank, size):
    """op=Sum in eager mode: the update uses the sum of the ranks' gradients."""
    import numpy as np

    w = tf.Variable(np.ones((8, 1), np.float32))
    opt = tfring.DistributedOptimizer(
        tf.compat.v1.train.GradientDescentOptimizer(0.01), op=tfring.Sum)
    bx, by = _linear_batch(99, size)
    sl = slice(rank * LOCAL_BATCH, (rank + 1) * LOCAL_BATCH)
    opt.minimize(lambda: tf.reduce_mean(tf.square(tf.matmul(bx[sl], w) - by[sl])),
                 var_list=[w])
    grads = []
    for r in range(size):
        xr = bx[r * LOCAL_BATCH:(r + 1) * LOCAL_BATCH].astype(np.float64)
        yr = by[r * LOCAL_BATCH:(r + 1) * LOCAL_BATCH].astype(np.float64)
        grads.append(2.0 * xr.T @ (xr @ np.ones((8, 1)) - yr) / LOCAL_BATCH)
    _assert_close("eager Sum", [w.numpy()], [1.0 - 0.01 * np.sum(grads, axis=0)])
    return _digest([w.numpy()])


def check_tape_accumulation_eager(tf, tfring, rank, size):
    """DistributedGradientTape(backward_passes_per_step=3) returns None for
    two passes, then the mean over passes and ranks."""
    import numpy as np

    v = tf.Variable([1.0, 2.0])
    got = []
    for p in range(3):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(v * v) * float(p + 1 + rank)
        tape = tfring.DistributedGradientTape(
            tape, backward_passes_per_step=3,
            average_aggregated_gradients=True)
        got.append(tape.gradient(loss, [v]))
    assert got[0] == [None] and got[1] == [None], got
    factor = np.mean([p + 1 + r for p in range(3) for r in range(size)])
    _assert_close("accumulated", [got[2][0].numpy()],
                  [2.0 * np.array([1.0, 2.0]) * factor])
    return _digest([got[2][0].numpy()])


def _worker():
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(2)
    import tfring

    tfring.init()
    rank, size = tfring.rank(), tfring.size()
    sys.path.insert(0, os.path.join(TESTS, "workers"))
    from common import report, run_checks

    results = run_checks({name: functools.partial(globals()[f"check_{name}"], tf, tfring,
                                                  rank, size) for name in CHECKS})
    report(results)
    tfring.shutdown()


if __name__ == "__main__" and "--worker" in sys.argv:
    _worker()
