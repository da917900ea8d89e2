"""The gradient checks of tests/workers/tf_ops.py."""

from tf_ops_cases import REDUCE_OPS, _rs_rows, _values

# ------------------------------------------------------- gradient checks --
# Every rank's loss is sum(w_r * y_r) with its own weights w_r; the gradient
# each rank gets for its input is compared with the analytic gradient of the
# sum of all ranks' losses.

def _gradient(tf, mode, forward, x_np, w_np):
    """d(sum(w * forward(x)))/dx in the given mode."""
    x = tf.constant(x_np)
    w = tf.constant(w_np)

    def grad(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = forward(x)
            loss = tf.reduce_sum(w * tf.cast(y, w.dtype))
        return tape.gradient(loss, x)

    if mode == "eager":
        return grad(x).numpy()
    if mode == "function":
        return tf.function(grad)(x).numpy()
    with tf.Graph().as_default():
        x = tf.constant(x_np)
        w = tf.constant(w_np)
        y = forward(x)
        g = tf.gradients(tf.reduce_sum(w * y), x)[0]
        with tf.compat.v1.Session() as sess:
            return sess.run(g)


def _assert_close(label, got, exp, tol=1e-9):
    import numpy as np

    if not (np.shape(got) == np.shape(exp) and np.allclose(got, exp, rtol=tol, atol=tol)):
        raise AssertionError(f"{label}: got {got!r}, expected {exp!r}")


def _grad_allreduce(mode):
    def check(tf, tfring, rank, size):
        import numpy as np

        shape = (3, 4)
        ws = [np.random.default_rng(600 + r).normal(size=shape) for r in range(size)]
        w_sum = np.sum(ws, axis=0)
        for op in REDUCE_OPS:
            xs = [_values("float64", shape, r, 610, op) for r in range(size)]
            if op in ("min", "max"):
                for r in range(size):
                    xs[r][0, 0] = 1.0  # a tie on every rank
            for pre, post in ((1.0, 1.0), (0.5, 3.0)):
                const = getattr(tfring, op.capitalize())
                got = _gradient(tf, mode, lambda x, o=const, pre=pre, post=post:
                                tfring.allreduce(x, op=o, prescale_factor=pre,
                                                 postscale_factor=post),
                    xs[rank], ws[rank])
                if op in ("sum", "average"):
                    exp = w_sum * pre * post / (size if op == "average" else 1)
                elif op in ("min", "max"):
                    best = (np.min if op == "min" else np.max)(xs, axis=0)
                    hits = [np.equal(x, best).astype(float) for x in xs]
                    exp = w_sum * pre * post * hits[rank] / np.sum(hits, axis=0)
                else:
                    others = np.prod([x for r, x in enumerate(xs) if r != rank], axis=0)
                    exp = w_sum * others * post * pre ** size
                _assert_close(f"allreduce {op} pre {pre} post {post}", got, exp)
    return check


def _grad_grouped_allreduce(mode):
    def check(tf, tfring, rank, size):
        import numpy as np

        ws = [np.random.default_rng(620 + r).normal(size=(2, 3)) for r in range(size)]
        xs = [_values("float64", (2, 3), r, 621) for r in range(size)]

        def forward(x):
            a, b = tfring.grouped_allreduce([x, 2.0 * x], op=tfring.Sum)
            return a + b

        got = _gradient(tf, mode, forward, xs[rank], ws[rank])
        _assert_close("grouped_allreduce sum", got, 3.0 * np.sum(ws, axis=0))

        def forward_avg(x):
            return tfring.grouped_allreduce([x], op=tfring.Average,
                                            postscale_factor=2.0)[0]

        got = _gradient(tf, mode, forward_avg, xs[rank], ws[rank])
        _assert_close("grouped_allreduce average", got,
                      2.0 * np.sum(ws, axis=0) / size)
    return check


def _grad_allgather(mode):
    def check(tf, tfring, rank, size):
        import numpy as np

        rows = [r + 1 for r in range(size)]
        total = sum(rows)
        ws = [np.random.default_rng(630 + r).normal(size=(total, 3)) for r in range(size)]
        x = _values("float64", (rows[rank], 3), rank, 631)
        got = _gradient(tf, mode, tfring.allgather, x, ws[rank])
        begin = sum(rows[:rank])
        # Horovod's gradient: the upstream gradients averaged over ranks.
        exp = np.mean(ws, axis=0)[begin:begin + rows[rank]]
        _assert_close("allgather", got, exp)
    return check


def _grad_broadcast(mode):
    def check(tf, tfring, rank, size):
        import numpy as np

        ws = [np.random.default_rng(640 + r).normal(size=(4,)) for r in range(size)]
        x = _values("float64", (4,), rank, 641)
        for root in (0, size - 1):
            got = _gradient(tf, mode, lambda t, root=root: tfring.broadcast(t, root),
                            x, ws[rank])
            # Horovod's gradient: averaged over ranks, to the root only.
            exp = np.mean(ws, axis=0) if rank == root else np.zeros(4)
            _assert_close(f"broadcast root {root}", got, exp)
    return check


def _grad_reducescatter(mode):
    def check(tf, tfring, rank, size):
        import numpy as np

        rows = 2 * size + 1
        my_rows = _rs_rows(rows, rank, size)
        ws = [np.random.default_rng(650 + r).normal(size=(_rs_rows(rows, r, size), 3))
              for r in range(size)]
        w_full = np.concatenate(ws)
        for op in ("sum", "average", "max"):
            xs = [_values("float64", (rows, 3), r, 651) for r in range(size)]
            const = getattr(tfring, op.capitalize())
            got = _gradient(tf, mode, lambda t, o=const: tfring.reducescatter(
                t, op=o, postscale_factor=2.0), xs[rank], ws[rank])
            if op == "max":
                best = np.max(xs, axis=0)
                hits = [np.equal(x, best).astype(float) for x in xs]
                exp = 2.0 * w_full * hits[rank] / np.sum(hits, axis=0)
            else:
                exp = 2.0 * w_full / (size if op == "average" else 1)
            assert got.shape == (rows, 3) and ws[rank].shape[0] == my_rows
            _assert_close(f"reducescatter {op}", got, exp)
    return check


_GRAD_CHECKS = {
    "allreduce": _grad_allreduce,
    "grouped_allreduce": _grad_grouped_allreduce,
    "allgather": _grad_allgather,
    "broadcast": _grad_broadcast,
    "reducescatter": _grad_reducescatter,
}
