"""Rank body for tests/core/test_alltoall_join.py: alltoall with ragged splits and
join with uneven data. Every rank computes every rank's inputs from shared
seeds, so it can build the expected result itself with numpy.

argv[1]: alltoall | alltoall_tf | badsplits | join_core | join_tf | join_one,
or several of them separated by commas: they run in that order in one job
(one launch), and the report maps each mode to its checks.
"""

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import checker, compare, report  # noqa: E402

MODES = sys.argv[1].split(",")
MODE = MODES[0]
results = {}
check = checker(results)


def splits_matrix(n, seed):
    """Rows rank s sends rank d; zero blocks included on purpose."""
    rng = np.random.default_rng(seed)
    m = rng.integers(0, 4, size=(n, n))
    m[rng.random((n, n)) < 0.3] = 0
    m[0, n - 1] = 0  # always at least one empty block
    return m


def rank_input(r, rows, trail, dtype, seed):
    rng = np.random.default_rng(seed * 100 + r)
    x = rng.integers(-50, 50, size=(rows,) + trail)
    if np.dtype(dtype) == np.bool_:
        return (x > 0)
    return x.astype(dtype)


def expected_alltoall(me, n, m, inputs):
    """Rank me's output: rank s's rows for me, in source rank order."""
    parts = []
    for s in range(n):
        off = int(m[s, :me].sum())
        parts.append(inputs[s][off:off + int(m[s, me])])
    return np.concatenate(parts, axis=0)


def main():
    global MODE, results, check
    import tfring
    tfring.init()
    by_mode = {}
    for MODE in MODES:
        results = {}
        check = checker(results)
        run_mode()
        by_mode[MODE] = results
    report(by_mode if len(MODES) > 1 else results)
    tfring.shutdown()


def run_mode():
    import tfring
    from tfring import _core
    me, n = tfring.rank(), tfring.size()

    if MODE == "alltoall":
        for i, (dtype, trail) in enumerate([(np.float32, (3,)), (np.float64, ()),
                                            (np.int32, (2, 2)), (np.int64, (1,)),
                                            (np.uint8, (4,)), (np.int8, ()),
                                            (np.float16, (2,)), (np.bool_, (3,))]):
            name = f"core.{np.dtype(dtype).name}"

            @check(name)
            def _(i=i, dtype=dtype, trail=trail):
                m = splits_matrix(n, seed=i)
                inputs = [rank_input(r, int(m[r].sum()), trail, dtype, i) for r in range(n)]
                out, recv = _core.alltoall(inputs[me], splits=m[me].tolist(),
                                           name=f"a2a.{i}")
                fails = []
                compare(fails, "output", out, expected_alltoall(me, n, m, inputs), 0)
                compare(fails, "received_splits", recv, m[:, me].astype(np.int64), 0)
                return {"ok": not fails, "fails": fails}

        @check("core.even_default")
        def _():
            x = np.arange(n * 2 * 3, dtype=np.float32).reshape(n * 2, 3) + 100 * me
            out, recv = _core.alltoall(x, name="even")
            want = np.concatenate([(np.arange(n * 2 * 3, dtype=np.float32).reshape(n * 2, 3)
                                    + 100 * s)[2 * me:2 * me + 2] for s in range(n)])
            fails = []
            compare(fails, "output", out, want, 0)
            compare(fails, "received_splits", recv, np.full(n, 2, np.int64), 0)
            return {"ok": not fails, "fails": fails}

        @check("core.repeat_changing_splits")
        def _():
            # Same name, splits changing every call: the fast path must not
            # reuse a stale matrix.
            fails = []
            for step in range(6):
                m = splits_matrix(n, seed=50 + step % 3)
                inputs = [rank_input(r, int(m[r].sum()), (2,), np.float32, step)
                          for r in range(n)]
                out, _ = _core.alltoall(inputs[me], splits=m[me].tolist(), name="rep")
                compare(fails, f"step {step}", out, expected_alltoall(me, n, m, inputs), 0)
            return {"ok": not fails, "fails": fails}

    elif MODE == "alltoall_tf":
        import tensorflow as tf

        def case(seed, dtype, trail):
            m = splits_matrix(n, seed)
            inputs = [rank_input(r, int(m[r].sum()), trail, dtype, seed) for r in range(n)]
            return m, inputs

        for i, dtype in enumerate([np.float32, np.float64, np.int32, np.int64]):
            @check(f"eager.{np.dtype(dtype).name}")
            def _(i=i, dtype=dtype):
                m, inputs = case(10 + i, dtype, (2,))
                out, recv = tfring.alltoall(tf.constant(inputs[me]), splits=m[me],
                                            name=f"tfa2a.{i}")
                fails = []
                compare(fails, "output", out.numpy(), expected_alltoall(me, n, m, inputs), 0)
                compare(fails, "received_splits", recv.numpy(), m[:, me].astype(np.int32), 0)
                return {"ok": not fails, "fails": fails}

        @check("eager.no_splits_returns_tensor")
        def _():
            x = tf.reshape(tf.range(n * 3, dtype=tf.float32), (n * 3, 1)) + 10.0 * me
            out = tfring.alltoall(x, name="nosplit")
            assert not isinstance(out, tuple), type(out)
            want = np.concatenate([(np.arange(n * 3, dtype=np.float32).reshape(n * 3, 1)
                                    + 10.0 * s)[3 * me:3 * me + 3] for s in range(n)])
            fails = []
            compare(fails, "output", out.numpy(), want, 0)
            return {"ok": not fails, "fails": fails}

        @tf.function
        def fn(x, splits):
            return tfring.alltoall(x, splits=splits)

        @check("function.ragged")
        def _():
            fails = []
            for step in range(3):
                m, inputs = case(20 + step, np.float32, (3,))
                out, recv = fn(tf.constant(inputs[me]), tf.constant(m[me], tf.int32))
                compare(fails, f"output {step}", out.numpy(),
                        expected_alltoall(me, n, m, inputs), 0)
                compare(fails, f"recv {step}", recv.numpy(), m[:, me].astype(np.int32), 0)
            return {"ok": not fails, "fails": fails}

        def weights(d, rows):
            return np.random.default_rng(900 + d).normal(size=(rows, 2))

        def grad_reference(m):
            # loss = sum_d sum(out_d * w_d); rank me's rows for d land in
            # out_d at rank me's offset there, so their gradient is that
            # slice of w_d.
            parts = []
            for d in range(n):
                w = weights(d, int(m[:, d].sum()))
                off = int(m[:me, d].sum())
                parts.append(w[off:off + int(m[me, d])])
            return np.concatenate(parts, axis=0)

        @check("eager.gradient")
        def _():
            m, inputs = case(30, np.float64, (2,))
            x = tf.constant(inputs[me])
            w = tf.constant(weights(me, int(m[:, me].sum())))
            with tf.GradientTape() as tape:
                tape.watch(x)
                out, _ = tfring.alltoall(x, splits=m[me], name="gradfwd")
                loss = tf.reduce_sum(out * w)
            g = tape.gradient(loss, x)
            fails = []
            compare(fails, "gradient", g.numpy(), grad_reference(m), 1e-12)
            return {"ok": not fails, "fails": fails}

        @tf.function
        def grad_fn(x, splits, w):
            with tf.GradientTape() as tape:
                tape.watch(x)
                out, _ = tfring.alltoall(x, splits=splits)
                loss = tf.reduce_sum(out * w)
            return tape.gradient(loss, x)

        @check("function.gradient")
        def _():
            m, inputs = case(31, np.float64, (2,))
            g = grad_fn(tf.constant(inputs[me]), tf.constant(m[me], tf.int32),
                        tf.constant(weights(me, int(m[:, me].sum()))))
            fails = []
            compare(fails, "gradient", g.numpy(), grad_reference(m), 1e-12)
            return {"ok": not fails, "fails": fails}

    elif MODE == "badsplits":
        import tensorflow as tf
        x = np.ones((6, 2), np.float32)

        def expect_error(fn, *needles):
            try:
                fn()
            except Exception as e:  # noqa: BLE001 - the message is checked
                msg = str(e)
                missing = [s for s in needles if s not in msg]
                return {"ok": not missing, "message": msg, "missing": missing}
            return {"ok": False, "message": "no error"}

        @check("wrong_length")
        def _():
            splits = [2, 2, 2] if me != 1 else [3, 3]
            return expect_error(lambda: _core.alltoall(x, splits=splits, name="bad.len"),
                                "bad.len", "rank 1", "2 entries")

        @check("wrong_sum")
        def _():
            splits = [2, 2, 2] if me != 2 else [2, 2, 1]
            return expect_error(lambda: _core.alltoall(x, splits=splits, name="bad.sum"),
                                "bad.sum", "rank 2", "sum to 5")

        @check("indivisible_default")
        def _():
            y = np.ones((4 if me == 0 else 6, 2), np.float32)
            return expect_error(lambda: _core.alltoall(y, name="bad.even"),
                                "bad.even", "rank 0", "divide evenly")

        @check("trailing_dims")
        def _():
            y = np.ones((3, 2 if me != 2 else 3), np.float32)
            return expect_error(lambda: _core.alltoall(y, splits=[1, 1, 1], name="bad.dims"),
                                "bad.dims", "rank 2")

        @check("tf_wrong_sum")
        def _():
            splits = [2, 2, 2] if me != 0 else [1, 1, 1]
            return expect_error(
                lambda: tfring.alltoall(tf.constant(x), splits=splits, name="bad.tf"),
                "bad.tf", "rank 0", "sum to 3")

        @check("healthy_after")
        def _():
            out, recv = _core.alltoall(x, splits=[2, 2, 2], name="good")
            return {"ok": out.shape == (6, 2) and list(recv) == [2, 2, 2]}

    elif MODE in ("join_core", "join_tf"):
        # Rank r runs STEPS[r] steps, then joins. Step k: an Average of a
        # float vector and a Sum of an int vector (fused). Horovod: joined
        # ranks contribute zeros and Average divides by size().
        steps = [3, 5, 4][:n] if n == 3 else [2 + r for r in range(n)]

        def vec(r, k):
            return (np.arange(5, dtype=np.float64) + 1) * (r + 1) + 10 * k

        def ivec(r, k):
            return np.arange(3, dtype=np.int64) * (r + 2) + k

        @check("steps")
        def _():
            fails = []
            for k in range(steps[me]):
                active = [r for r in range(n) if steps[r] > k]
                want_avg = sum(vec(r, k) for r in active) / n
                want_sum = sum(ivec(r, k) for r in active)
                if MODE == "join_core":
                    got_avg = _core.allreduce(vec(me, k).astype(np.float32), op="average",
                                              name="avg")
                    got_sum = _core.allreduce(ivec(me, k), op="sum", name="sum")
                else:
                    import tensorflow as tf
                    got_avg, got_sum = tfring.grouped_allreduce(
                        [tf.constant(vec(me, k), tf.float32), tf.constant(ivec(me, k))],
                        op=tfring.Average, name="step")
                    got_sum = tfring.allreduce(tf.constant(ivec(me, k)), op=tfring.Sum,
                                               name="sum")
                    got_avg, got_sum = got_avg.numpy(), got_sum.numpy()
                compare(fails, f"avg step {k}", got_avg, want_avg.astype(np.float32), 1e-6)
                compare(fails, f"sum step {k}", got_sum, want_sum, 0)
            if MODE == "join_core":
                last = _core.join()
            else:
                last = int(tfring.join().numpy())
            want_last = int(np.argmax(steps))
            if last != want_last:
                fails.append(f"join returned {last}, want {want_last}")
            return {"ok": not fails, "fails": fails, "last": last}

        if MODE == "join_core":
            @check("unsupported_while_joined")
            def _():
                # Rank 0 joins at once; the others' allgather must fail,
                # naming the tensor; then they join too.
                msg = ""
                if me != 0:
                    try:
                        _core.allgather(np.ones((2,), np.float32), name="ag.joined")
                        msg = "no error"
                    except Exception as e:  # noqa: BLE001
                        msg = str(e)
                last = _core.join()
                ok = me == 0 or ("ag.joined" in msg and "joined" in msg)
                return {"ok": ok, "message": msg, "last": last}

            @check("again_after_join")
            def _():
                # A second epoch works as before.
                got = _core.allreduce(np.full(3, me + 1.0), op="sum", name="after")
                return {"ok": bool(np.all(got == n * (n + 1) / 2))}

    elif MODE == "join_one":
        import tensorflow as tf

        @check("join")
        def _():
            a = _core.join()
            got = _core.allreduce(np.ones(2), op="average", name="x")
            b = int(tfring.join().numpy())
            out, recv = _core.alltoall(np.arange(4.0).reshape(2, 2), splits=[2], name="one")
            return {"ok": a == 0 and b == 0 and bool(np.all(got == 1.0))
                    and np.array_equal(out, np.arange(4.0).reshape(2, 2))
                    and list(recv) == [2], "a": a, "b": b}


if __name__ == "__main__":
    main()
