"""PowerSGD checks on each rank of a job (tests/tf/test_powersgd.py).

Every rank makes every rank's gradients from shared seeds, so each can run
the float64 numpy reference (tests/powersgd_ref.py) on all of them and
compare with what tfring's reduction gave it; the test also checks that
every rank got the same result (a digest of its outputs)."""

import hashlib
import os
import sys
import tempfile
import time

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(TESTS, "workers"))
sys.path.insert(0, TESTS)

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tfring  # noqa: E402
from common import checker, report  # noqa: E402
from powersgd_ref import PowerSGDRef  # noqa: E402
from tfring.compression.powersgd_step import reduce_step  # noqa: E402

SHAPES = [(24, 20), (20,), (16, 3, 3, 4), (30, 2)]


def draw(seed):
    """The fresh Q tfring documents: stateless normal, seeded by
    (seed * 65536 + position, step), float32."""
    def fn(m, r, index, step):
        s = tf.constant([seed * 65536 + index, step], tf.int64)
        return tf.random.stateless_normal([m, r], seed=s).numpy()
    return fn


def grads_of(rank, step, salt=0, shapes=SHAPES, dtype=np.float32):
    rng = np.random.default_rng(100000 * salt + 1000 * step + rank)
    return [rng.standard_normal(s).astype(dtype) for s in shapes]


def all_grads(step, salt=0, **kw):
    return [grads_of(k, step, salt, **kw) for k in range(tfring.size())]


class Track:
    """Worst relative error against the reference, and a digest of every
    output (equal on every rank when they all got the same results)."""

    def __init__(self):
        self.err = 0.0
        self.digest = hashlib.sha256()
        self.steps = 0

    def add(self, got, want):
        for g, w in zip(got, want):
            g = np.asarray(g, np.float64)
            scale = max(1.0, float(np.max(np.abs(w))))
            self.err = max(self.err, float(np.max(np.abs(g - w))) / scale)
            self.digest.update(np.ascontiguousarray(g).tobytes())
        self.steps += 1

    def out(self):
        return {"err": self.err, "digest": self.digest.hexdigest(),
                "steps": self.steps}


def numpys(ts):
    return [np.asarray(t) for t in ts]


def main():
    tfring.init()
    size = tfring.size()
    rank = tfring.rank()
    results = {}
    run_check = checker(results)

    def check(name):
        """A check that also reports its seconds."""
        def deco(fn):
            def timed():
                start = time.monotonic()
                out = fn() or {}
                out["secs"] = round(time.monotonic() - start, 2)
                return out
            return run_check(name)(timed)
        return deco
    variables = [tf.Variable(tf.zeros(s)) for s in SHAPES]

    @check("eager")
    def _():
        # Warm-up, then compression with warm start and error feedback.
        c = tfring.Compression.powersgd(rank=4, start_iter=2)
        ref = PowerSGDRef(size, draw(0), rank=4, start_iter=2)
        t = Track()
        for s in range(6):
            got = reduce_step(c, grads_of(rank, s), variables)
            t.add(numpys(got), ref.step(all_grads(s)))
        return dict(t.out(), counts=c.step_counts(), slots=len(c.slots))

    @check("function")
    def _():
        # Fresh Q each step, no error feedback, op=Sum, an epsilon (P is
        # summed, not averaged, before it is orthogonalized).
        c = tfring.Compression.powersgd(
            rank=2, start_iter=1, warm_start=False, use_error_feedback=False,
            seed=3, orthogonalization_epsilon=1e-3)
        ref = PowerSGDRef(size, draw(3), rank=2, start_iter=1,
                          warm_start=False, error_feedback=False, eps=1e-3)

        @tf.function
        def fn(gs):
            return reduce_step(c, gs, variables, op="sum")

        t = Track()
        for s in range(4):
            got = fn([tf.constant(g) for g in grads_of(rank, s, 1)])
            t.add(numpys(got), ref.step(all_grads(s, 1), op="sum"))
        return t.out()

    @check("tape")
    def _():
        # DistributedGradientTape in a tf.function training step.
        c = tfring.Compression.powersgd(rank=3, start_iter=1)
        ref = PowerSGDRef(size, draw(0), rank=3, start_iter=1)
        init = np.random.default_rng(7)
        ws = [tf.Variable(init.standard_normal(s).astype(np.float32) * 0.3)
              for s in [(20, 24), (24,), (24, 16)]]

        def loss_of(x, y):
            h = tf.tanh(x @ ws[0] + ws[1])
            return tf.reduce_sum((h @ ws[2]) * y)

        @tf.function
        def local(x, y):
            with tf.GradientTape() as tape:
                loss = loss_of(x, y)
            return tape.gradient(loss, ws)

        @tf.function
        def train(x, y):
            with tf.GradientTape() as tape:
                loss = loss_of(x, y)
            tape = tfring.DistributedGradientTape(tape, compression=c)
            grads = tape.gradient(loss, ws)
            for w, g in zip(ws, grads):
                w.assign_sub(0.05 * g)
            return grads

        def data(k, s):
            rng = np.random.default_rng(50 + 1000 * s + k)
            return (rng.standard_normal((8, 20)).astype(np.float32),
                    rng.standard_normal((8, 16)).astype(np.float32))

        t = Track()
        for s in range(5):
            want = ref.step([numpys(local(*data(k, s))) for k in range(size)])
            t.add(numpys(train(*data(rank, s))), want)
        return t.out()

    @check("keras_optimizer")
    def _():
        # tfring.keras.DistributedOptimizer: SGD(1) moves each variable by
        # minus its reduced gradient.
        import keras
        c = tfring.Compression.powersgd(rank=4, start_iter=1)
        ref = PowerSGDRef(size, draw(0), rank=4, start_iter=1)
        vs = [keras.Variable(np.zeros(s, np.float32)) for s in SHAPES]
        opt = tfring.keras.DistributedOptimizer(
            keras.optimizers.SGD(1.0), compression=c)

        @tf.function
        def apply(gs):
            opt.apply(gs, vs)

        t = Track()
        for s in range(4):
            before = [v.numpy() for v in vs]
            apply([tf.constant(g) for g in grads_of(rank, s, 2)])
            got = [b - v.numpy() for b, v in zip(before, vs)]
            t.add(got, ref.step(all_grads(s, 2)))
        return t.out()

    @check("fit")
    def _():
        # model.fit with RingAllreduceCallback: a linear model under MSE,
        # simulated in numpy (its gradients are 2/(B U) x^T r and the
        # column sums of r, r the residual).
        import keras
        B, D, U, steps, lr = 8, 20, 24, 4, 0.05
        c = tfring.Compression.powersgd(rank=2, start_iter=1)
        ref = PowerSGDRef(size, draw(0), rank=2, start_iter=1)
        model = keras.Sequential([keras.Input((D,)), keras.layers.Dense(
            U, kernel_initializer=keras.initializers.RandomNormal(seed=1))])
        model.compile(optimizer=keras.optimizers.SGD(lr), loss="mse")
        w = model.layers[0].kernel.numpy().astype(np.float64)
        b = model.layers[0].bias.numpy().astype(np.float64)
        data = [np.random.default_rng(300 + k) for k in range(size)]
        xs = [d.standard_normal((B * steps, D)).astype(np.float32) for d in data]
        ys = [d.standard_normal((B * steps, U)).astype(np.float32) for d in data]
        model.fit(xs[rank], ys[rank], batch_size=B, epochs=1, shuffle=False,
                  verbose=0, callbacks=[
                      tfring.keras.callbacks.RingAllreduceCallback(
                          compression=c)])
        for s in range(steps):
            grads = []
            for k in range(size):
                x = xs[k][s * B:(s + 1) * B].astype(np.float64)
                r = x @ w + b - ys[k][s * B:(s + 1) * B]
                grads.append([2.0 / (B * U) * x.T @ r,
                              2.0 / (B * U) * r.sum(axis=0)])
            gw, gb = ref.step(grads)
            w, b = w - lr * gw, b - lr * gb
        t = Track()
        t.add([model.layers[0].kernel.numpy(), model.layers[0].bias.numpy()],
              [w, b])
        # ResumableCheckpointCallback's files carry the step counters to a
        # new compressor, which the callback gets only when fit starts.
        from tfring.keras.checkpoint import restore_checkpoint, save_checkpoint
        directory = tempfile.mkdtemp()
        save_checkpoint(model, directory, 1)
        again = keras.Sequential([keras.Input((D,)), keras.layers.Dense(U)])
        again.compile(optimizer=keras.optimizers.SGD(lr), loss="mse")
        epoch = restore_checkpoint(again, directory)
        c2 = tfring.Compression.powersgd(rank=2, start_iter=1)
        again.fit(xs[rank][:B], ys[rank][:B], batch_size=B, epochs=1,
                  verbose=0, callbacks=[
                      tfring.keras.callbacks.RingAllreduceCallback(
                          compression=c2)])
        return dict(t.out(), counts=c.step_counts(), resumed_epoch=epoch,
                    resumed_counts=c2.step_counts())

    @check("checkpoint")
    def _():
        # tf.train.Checkpoint of the compressor: a run restored after 3
        # steps continues as the uninterrupted run does, bit for bit.
        def run(c, steps):
            return [numpys(reduce_step(c, grads_of(rank, s, 3), variables))
                    for s in steps]

        c = tfring.Compression.powersgd(rank=4, start_iter=1)
        run(c, range(3))
        path = tf.train.Checkpoint(powersgd=c).save(
            os.path.join(tempfile.mkdtemp(), f"r{rank}", "ckpt"))
        straight = run(c, range(3, 6))
        c2 = tfring.Compression.powersgd(rank=4, start_iter=1)
        tf.train.Checkpoint(powersgd=c2).restore(path)
        resumed = run(c2, range(3, 6))
        same = all(np.array_equal(a, b) for x, y in zip(straight, resumed)
                   for a, b in zip(x, y))
        return {"same": same, "counts": c2.step_counts(),
                "restored_slots": len(c2.slots)}

    @check("checkpoint_optimizer")
    def _():
        # The Keras optimizer tracks its compressor: tf.train.Checkpoint of
        # the optimizer alone carries PowerSGD's state.
        import keras

        def make():
            c = tfring.Compression.powersgd(rank=4, start_iter=1)
            vs = [keras.Variable(np.zeros(s, np.float32)) for s in SHAPES]
            opt = tfring.keras.DistributedOptimizer(keras.optimizers.SGD(1.0),
                                                    compression=c)
            return c, vs, opt

        def run(vs, opt, steps):
            out = []
            for s in steps:
                before = [v.numpy() for v in vs]
                opt.apply([tf.constant(g) for g in grads_of(rank, s, 4)], vs)
                out.append([b - v.numpy() for b, v in zip(before, vs)])
            return out

        c, vs, opt = make()
        run(vs, opt, range(3))
        path = tf.train.Checkpoint(optimizer=opt, vs=vs).save(
            os.path.join(tempfile.mkdtemp(), f"r{rank}", "ckpt"))
        straight = run(vs, opt, range(3, 5))
        c2, vs2, opt2 = make()
        opt2.build(vs2)
        tf.train.Checkpoint(optimizer=opt2, vs=vs2).restore(path)
        resumed = run(vs2, opt2, range(3, 5))
        same = all(np.allclose(a, b, rtol=0, atol=0) for x, y in
                   zip(straight, resumed) for a, b in zip(x, y))
        return {"same": same, "counts": c2.step_counts()}

    @check("v1_graph")
    def _():
        # tf.compat.v1 graphs in a session: tfring.DistributedOptimizer and
        # the graph rewrite. loss = sum(v * g) makes g the gradient, and
        # GradientDescent(1) moves v by minus its reduced gradient.
        out = {}
        ref = PowerSGDRef(size, draw(0), rank=4, start_iter=1)
        wants = [ref.step(all_grads(s, 7)) for s in range(4)]
        for how in ("optimizer", "rewrite"):
            graph = tf.Graph()
            with graph.as_default():
                c = tfring.Compression.powersgd(rank=4, start_iter=1)
                vs = [tf.compat.v1.get_variable(
                    f"v{i}", shape=s, use_resource=True,
                    initializer=tf.compat.v1.zeros_initializer())
                    for i, s in enumerate(SHAPES)]
                phs = [tf.compat.v1.placeholder(tf.float32, s) for s in SHAPES]
                loss = tf.add_n([tf.reduce_sum(v * p) for v, p in zip(vs, phs)])
                opt = tf.compat.v1.train.GradientDescentOptimizer(1.0)
                if how == "optimizer":
                    train = tfring.DistributedOptimizer(
                        opt, compression=c).minimize(loss)
                else:
                    train = opt.minimize(loss)
                    tfring.rewrite(compression=c)
                init = tf.compat.v1.global_variables_initializer()
            t = Track()
            with tf.compat.v1.Session(graph=graph) as sess:
                sess.run(init)
                for s in range(4):
                    before = sess.run(vs)
                    sess.run(train, dict(zip(phs, grads_of(rank, s, 7))))
                    got = [b - a for b, a in zip(before, sess.run(vs))]
                    t.add(got, wants[s])
                counts = [int(sess.run(g.step)) for g in c.groups]
            out[how] = dict(t.out(), counts=counts)
        return out

    @check("errors")
    def _():
        c = tfring.Compression.powersgd()
        out = {}
        for label, fn in [
            ("min", lambda: tfring.DistributedGradientTape(
                tf.GradientTape(), op=tfring.Min, compression=c)),
            ("min_step", lambda: reduce_step(c, [tf.ones([40, 40])],
                                             op=tfring.Min)),
            ("int", lambda: reduce_step(c, [tf.ones([40, 40], tf.int32)])),
            ("allreduce", lambda: tfring.allreduce(tf.ones([40, 40]),
                                                   compression=c)),
        ]:
            try:
                fn()
                out[label] = "no error"
            except (ValueError, TypeError) as e:
                out[label] = f"{type(e).__name__}: {e}"
        return out

    @check("sparse")
    def _():
        # tf.IndexedSlices: allgathered uncompressed (rows of every rank,
        # averaged), or with sparse_as_dense densified and compressed.
        c = tfring.Compression.powersgd(rank=4, start_iter=0, seed=5)
        ref = PowerSGDRef(size, draw(5), rank=4, start_iter=0)
        rows = [np.random.default_rng(900 + k).standard_normal((3, 20))
                .astype(np.float32) for k in range(size)]
        indices = [np.array([k, k + 5, 23], np.int64) for k in range(size)]

        def slices(k):
            return tf.IndexedSlices(tf.constant(rows[k]),
                                    tf.constant(indices[k]),
                                    tf.constant([24, 20], tf.int64))

        got = reduce_step(c, [slices(rank)])[0]
        gathered_ok = (isinstance(got, tf.IndexedSlices) and np.allclose(
            got.values.numpy(), np.concatenate(rows) / size) and np.array_equal(
            got.indices.numpy(), np.concatenate(indices)))
        dense = []
        for k in range(size):
            d = np.zeros((24, 20))
            np.add.at(d, indices[k], rows[k])
            dense.append([d])
        ref.step_count = 1  # the allgather above was this reduction's step 0
        t = Track()
        t.add(numpys(reduce_step(c, [slices(rank)], sparse_as_dense=True)),
              ref.step(dense))
        return dict(t.out(), gathered_ok=bool(gathered_ok),
                    slots=len(c.slots))

    @check("half")
    def _():
        # float16 gradients are compressed in float32, returned as float16.
        c = tfring.Compression.powersgd(rank=4, start_iter=0)
        ref = PowerSGDRef(size, draw(0), rank=4, start_iter=0)
        shapes = [(24, 20)]
        t = Track()
        dtypes = []
        for s in range(3):
            gs = [g.astype(np.float16) for g in grads_of(rank, s, 5, shapes)]
            got = reduce_step(c, [tf.constant(g) for g in gs])
            dtypes.append(got[0].dtype.name)
            want = ref.step([[g.astype(np.float16) for g in grads_of(
                k, s, 5, shapes)] for k in range(size)])
            t.add(numpys(got), want)
        return dict(t.out(), dtypes=dtypes)

    @check("elastic")
    def _():
        # sync() keeps errors when nothing changed; a rank joining without
        # state makes every rank drop errors and Q's and take rank 0's
        # step counter, and the next step is the reference's from there.
        from tfring.elastic import TensorFlowState
        c = tfring.Compression.powersgd(rank=4, start_iter=1)
        ref = PowerSGDRef(size, draw(0), rank=4, start_iter=1)
        t = Track()
        for s in range(3):
            t.add(numpys(reduce_step(c, grads_of(rank, s, 6), variables)),
                  ref.step(all_grads(s, 6)))
        state = TensorFlowState(variables, compression=c)
        state.sync()
        kept = float(np.max(np.abs(c.slots[0].error.numpy())))
        t.add(numpys(reduce_step(c, grads_of(rank, 3, 6), variables)),
              ref.step(all_grads(3, 6)))
        if rank == size - 1:  # the "new worker"
            c = tfring.Compression.powersgd(rank=4, start_iter=1)
        state = TensorFlowState(variables, compression=c)
        state.sync()
        ref.reset()
        for s in range(4, 6):
            t.add(numpys(reduce_step(c, grads_of(rank, s, 6), variables)),
                  ref.step(all_grads(s, 6)))
        return dict(t.out(), kept_error=kept, counts=c.step_counts())

    tfring.shutdown()
    report(results)


if __name__ == "__main__":
    main()
