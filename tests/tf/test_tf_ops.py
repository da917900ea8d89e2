"""The TensorFlow ops on 2 and 4 ranks: every op in eager, tf.function and
tf.compat.v1 session modes against numpy references, for every dtype TF
allows for it; gradients of every op; and the op-level contracts (not merged
or folded, not chained inside tf.function, deterministic names, compiled by
XLA (tests/tf/test_xla.py has the rest), clear errors on mismatches and on a TF
version mismatch).

Importing TensorFlow costs seconds per rank, so each world size is one job
whose ranks run every check (this file is also the worker script: run with
--worker); the tests below report the checks one by one.
"""

import functools
import importlib.util
import os
import sys

import pytest

TESTS = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
SIZES = [2, 4]
JOB_TIMEOUT = 300

# Quiet, thread-limited ranks: the test box may have 2 cores for 4 ranks.
RANK_ENV = {"TF_CPP_MIN_LOG_LEVEL": "2", "TF_NUM_INTRAOP_THREADS": "1",
            "TF_NUM_INTEROP_THREADS": "2", "CUDA_VISIBLE_DEVICES": "",
            "TFRING_TIMEOUT": "60"}

MODES = ["eager", "function", "session"]
CHECKS = (
    [f"{op}_{mode}" for op in ("allreduce", "grouped_allreduce", "allgather",
                               "broadcast", "reducescatter")
     for mode in MODES]
    + [f"grad_{op}_{mode}" for op in ("allreduce", "grouped_allreduce",
                                      "allgather", "broadcast",
                                      "reducescatter")
       for mode in ("eager", "function")]
    + ["grad_allreduce_session",
       "indexed_slices", "compression_fp16", "broadcast_variables",
       "not_merged_or_folded", "function_ops_run_independently",
       "function_names", "out_of_order_single_thread",
       "xla_compiles", "mismatch_error", "grouped_rides_vote",
       "grouped_outputs_independent",
       "version_mismatch", "api_surface"]
)

# Run by their own tests, with their own environment.
EXTRA_CHECKS = ["grouped_under_packing_algorithms"]


def _tf_available():
    if importlib.util.find_spec("tensorflow") is None:
        return False
    spec = importlib.util.find_spec("tfring")
    return spec is not None and os.path.exists(
        os.path.join(os.path.dirname(spec.origin), "_tfring_ops.so"))


# ------------------------------------------------------------- pytest side --

if __name__ != "__main__":
    pytestmark = pytest.mark.skipif(
        not _tf_available(),
        reason="TensorFlow or tfring's op library (_tfring_ops.so) missing")

    _jobs = {}

    def job(size):
        """Runs every check on `size` ranks once; returns per-rank results."""
        if size not in _jobs:
            sys.path.insert(0, TESTS)
            from multiproc import run_ranks

            results = run_ranks(size, os.path.abspath(__file__), ["--worker"],
                                env=RANK_ENV, timeout=JOB_TIMEOUT)
            _jobs[size] = results
        return _jobs[size]

    def _outcome(size, check):
        from multiproc import rank_results

        return rank_results(job(size), check)

    @pytest.mark.parametrize("check", CHECKS)
    @pytest.mark.parametrize("size", SIZES)
    def test_check(size, check):
        outs = _outcome(size, check)
        failed = [(r, o["error"]) for r, o in enumerate(outs) if o["error"]]
        assert not failed, "\n".join(f"rank {r}:\n{e}" for r, e in failed)

    @pytest.mark.parametrize("size", SIZES)
    def test_function_names_agree_across_ranks(size):
        names = [o["value"] for o in _outcome(size, "function_names")]
        assert all(n == names[0] for n in names), names
        assert len(set(names[0])) == len(names[0]), names[0]

    PACKING_ALGOS = ["oneshot", "hier"]
    _packing_job = {}

    def packing_job():
        """{algo: each rank's results}: the packing algorithms one after
        the other on the ranks of one launch (a pass each: set
        TFRING_ALLREDUCE_ALGO, init, run the check, shutdown)."""
        if not _packing_job:
            sys.path.insert(0, TESTS)
            from multiproc import run_passes

            env = dict(RANK_ENV, TFRING_FUSION_THRESHOLD="4K")
            passes = [{"TFRING_ALLREDUCE_ALGO": algo} for algo in PACKING_ALGOS]
            res = run_passes(3, os.path.abspath(__file__),
                             passes, ["--worker", "--only", "grouped_under_packing_algorithms"],
                             env=env, timeout=JOB_TIMEOUT)
            _packing_job.update(zip(PACKING_ALGOS, res))
        return _packing_job

    @pytest.mark.parametrize("algo", PACKING_ALGOS)
    def test_grouped_allreduce_under_packing_algorithms(algo):
        """The algorithms that pack fused tensors get a grouped request in
        pieces of at most the fusion threshold (4 KiB here), a larger part
        alone in place, with and without a prescale."""
        for r, results in enumerate(packing_job()[algo]):
            o = results["grouped_under_packing_algorithms"]
            assert not o["error"], f"rank {r}:\n{o['error']}"
            assert set(o["value"]) == {algo}, o["value"]

    @pytest.mark.parametrize("size", SIZES)
    def test_ranks_exit_cleanly(size):
        for r in job(size):
            assert r.returncode == 0, (
                f"rank {r.rank} exited {r.returncode}\n{r.stderr[-3000:]}")


# ------------------------------------------------------------- worker side --
# Everything below runs inside the ranks.

FLOATS = ["float16", "bfloat16", "float32", "float64"]
INTS = ["int32", "int64", "uint8", "int8", "int16", "uint16"]
REDUCE_DTYPES = FLOATS + INTS
ALL_DTYPES = REDUCE_DTYPES + ["bool"]
REDUCE_OPS = ["sum", "average", "min", "max", "product"]


def _values(dtype, shape, rank, salt, op=None):
    """Deterministic per-rank data every dtype holds exactly and no op
    overflows with on 4 ranks (floats are multiples of 1/4)."""
    import numpy as np

    rng = np.random.default_rng(7919 * rank + 104729 * salt + 13)
    if dtype == "bool":
        return rng.integers(0, 2, shape).astype(bool)
    if op == "product":
        if dtype in FLOATS:
            return rng.choice([0.5, 1.0, 1.5, 2.0], shape)
        return rng.integers(1, 3, shape)
    if dtype in FLOATS:
        return rng.integers(-16, 17, shape) / 4.0
    if dtype in ("uint8", "uint16"):
        return rng.integers(0, 30, shape)
    return rng.integers(-15, 16, shape)


def _reduce_ref(xs, op, is_int):
    import numpy as np

    xs = [np.asarray(x, np.float64) for x in xs]
    if op == "sum":
        return np.sum(xs, axis=0)
    if op == "average":
        r = np.sum(xs, axis=0) / len(xs)
        return np.trunc(r) if is_int else r
    if op == "min":
        return np.min(xs, axis=0)
    if op == "max":
        return np.max(xs, axis=0)
    return np.prod(xs, axis=0)


def _tol(dtype):
    return {"float16": 2e-3, "bfloat16": 1e-2, "float32": 1e-6,
            "float64": 1e-12}.get(dtype, 0.0)


class Case:
    """One collective call: a builder from input tensors to an output, numpy
    inputs for this rank, and the expected output."""

    def __init__(self, label, build, inputs, expected, dtype):
        self.label = label
        self.build = build          # list of tf.Tensor -> tf.Tensor
        self.inputs = inputs        # list of (numpy array, dtype name)
        self.expected = expected    # numpy array (float64 or bool)
        self.dtype = dtype


def _tensor(tf, arr, dtype):
    import numpy as np

    if dtype == "bfloat16":
        return tf.cast(tf.constant(np.asarray(arr, np.float32)), tf.bfloat16)
    return tf.constant(np.asarray(arr).astype(dtype))


def _placeholder(tf, arr, dtype):
    return tf.compat.v1.placeholder(getattr(tf, dtype), arr.shape)


def _feed_value(arr, dtype):
    import numpy as np

    if dtype == "bfloat16":
        import ml_dtypes

        return np.asarray(arr, np.float32).astype(ml_dtypes.bfloat16)
    return np.asarray(arr).astype(dtype)


def _run_cases(tf, cases, mode):
    """Runs the cases in one mode; returns their outputs as numpy arrays."""
    if mode == "eager":
        return [c.build([_tensor(tf, a, d) for a, d in c.inputs]).numpy()
                for c in cases]
    if mode == "function":
        # One function holding every case: all collectives in flight at once.
        @tf.function
        def run_all(*flat):
            it = iter(flat)
            return [c.build([next(it) for _ in c.inputs]) for c in cases]

        flat = [_tensor(tf, a, d) for c in cases for a, d in c.inputs]
        return [o.numpy() for o in run_all(*flat)]
    with tf.Graph().as_default():
        feeds, outputs = {}, []
        for c in cases:
            phs = []
            for a, d in c.inputs:
                ph = _placeholder(tf, a, d)
                feeds[ph] = _feed_value(a, d)
                phs.append(ph)
            outputs.append(c.build(phs))
        with tf.compat.v1.Session() as sess:
            return sess.run(outputs, feeds)


def _compare(cases, outputs):
    import numpy as np

    errors = []
    for c, out in zip(cases, outputs):
        exp = np.asarray(c.expected)
        if c.dtype == "bool":
            got = np.asarray(out)
            ok = got.dtype == bool and got.shape == exp.shape and (got == exp).all()
        else:
            got = np.asarray(out).astype(np.float64)
            tol = _tol(c.dtype)
            ok = got.shape == exp.shape and np.allclose(
                got, exp, rtol=tol, atol=tol)
        if not ok:
            errors.append(f"{c.label}: got {np.asarray(out)!r}, "
                          f"expected {exp!r}")
    if errors:
        raise AssertionError("\n".join(errors))


# -------------------------------------------------------- numeric checks --

def _allreduce_cases(tf, tfring, rank, size):
    cases = []
    shape = (3, 5)
    for salt, dtype in enumerate(REDUCE_DTYPES):
        for op_i, op in enumerate(REDUCE_OPS):
            xs = [_values(dtype, shape, r, 100 * salt + op_i, op)
                  for r in range(size)]
            exp = _reduce_ref(xs, op, dtype in INTS)
            const = getattr(tfring, op.capitalize())
            cases.append(Case(f"allreduce {dtype} {op}",
                              lambda t, o=const: tfring.allreduce(t[0], op=o),
                              [(xs[rank], dtype)], exp, dtype))
        if dtype in FLOATS:
            xs = [_values(dtype, shape, r, 100 * salt + 50) for r in range(size)]
            exp = 3.0 * _reduce_ref([x * 0.5 for x in xs], "average", False)
            cases.append(Case(
                f"allreduce {dtype} average prescale 0.5 postscale 3",
                lambda t: tfring.allreduce(t[0], prescale_factor=0.5,
                                           postscale_factor=3.0),
                [(xs[rank], dtype)], exp, dtype))
    # Edge shapes: a scalar and an empty tensor.
    xs = [_values("float32", (), r, 901) for r in range(size)]
    cases.append(Case("allreduce scalar", lambda t: tfring.allreduce(
        t[0], op=tfring.Sum), [(xs[rank], "float32")],
        _reduce_ref(xs, "sum", False), "float32"))
    empty = _values("float32", (0, 4), rank, 902)
    cases.append(Case("allreduce empty", lambda t: tfring.allreduce(
        t[0], op=tfring.Sum), [(empty, "float32")], empty, "float32"))
    return cases


def _grouped_cases(tf, tfring, rank, size):

    dtypes = REDUCE_DTYPES
    shapes = [(2, 3), (7,), (), (1, 1, 4), (5,), (3,), (4, 2), (0,), (2, 2), (6,)]
    xs = {d: [_values(d, s, r, 200 + i) for r in range(size)]
          for i, (d, s) in enumerate(zip(dtypes, shapes))}
    cases = []
    for op in ("sum", "average", "max"):
        const = getattr(tfring, op.capitalize())
        for i, d in enumerate(dtypes):
            def build(t, i=i, o=const):
                # The whole group again per output keeps Case one-output; the
                # group is still one op with every dtype.
                return tfring.grouped_allreduce(t, op=o)[i]
            inputs = [(xs[dd][rank], dd) for dd in dtypes]
            cases.append(Case(f"grouped_allreduce {op} [{i}] {d}", build,
                              inputs, _reduce_ref(xs[d], op, d in INTS), d))
    # One dtype: the group is one request with a part per tensor
    # (runtime::Request::parts), scalars and empty tensors among them; with
    # scale factors it is packed (executor.cc).
    one = [(2, 3), (), (0,), (1, 1, 4), (7,)]
    for d in ("float32", "int32", "float16"):
        ys = [[_values(d, s, r, 250 + i) for r in range(size)] for i, s in enumerate(one)]
        scaled = [] if d in INTS else [("sum", 0.5, 4.0)]
        for op, pre, post in [("sum", 1.0, 1.0), ("average", 1.0, 1.0),
                              ("max", 1.0, 1.0)] + scaled:
            const = getattr(tfring, op.capitalize())
            for i in (0, 1, 3):
                def build(t, i=i, o=const, pre=pre, post=post):
                    return tfring.grouped_allreduce(t, op=o, prescale_factor=pre,
                                                    postscale_factor=post)[i]
                ref = _reduce_ref(ys[i], op, d in INTS) * (pre * post)
                cases.append(Case(f"grouped_allreduce one dtype {op} x{pre * post} [{i}] {d}",
                                  build, [(y[rank], d) for y in ys], ref, d))
    return cases


def _allgather_cases(tf, tfring, rank, size):
    import numpy as np

    cases = []
    for salt, dtype in enumerate(ALL_DTYPES):
        # Rank r contributes r + 1 rows: first dimensions differ by rank.
        xs = [_values(dtype, (r + 1, 2, 3), r, 300 + salt) for r in range(size)]
        cases.append(Case(f"allgather {dtype}", lambda t: tfring.allgather(t[0]),
                          [(xs[rank], dtype)], np.concatenate(xs), dtype))
    # Rank 0 contributes no rows at all; a 1-D tensor.
    xs = [_values("int64", (r,), r, 399) for r in range(size)]
    cases.append(Case("allgather with an empty rank",
                      lambda t: tfring.allgather(t[0]), [(xs[rank], "int64")],
                      np.concatenate(xs), "int64"))
    return cases


def _broadcast_cases(tf, tfring, rank, size):
    cases = []
    for salt, dtype in enumerate(ALL_DTYPES):
        for root in (0, size - 1):
            xs = [_values(dtype, (4, 3), r, 400 + salt) for r in range(size)]
            cases.append(Case(f"broadcast {dtype} root {root}",
                              lambda t, root=root: tfring.broadcast(t[0], root),
                              [(xs[rank], dtype)], xs[root], dtype))
    return cases


def _rs_rows(rows, rank, size):
    return rows // size + (1 if rank < rows % size else 0)


def _rs_slice(full, rank, size):
    begin = sum(_rs_rows(full.shape[0], r, size) for r in range(rank))
    return full[begin:begin + _rs_rows(full.shape[0], rank, size)]


def _reducescatter_cases(tf, tfring, rank, size):
    cases = []
    rows = 2 * size + 1  # uneven split: the first rank gets an extra row
    for salt, dtype in enumerate(REDUCE_DTYPES):
        for op_i, op in enumerate(REDUCE_OPS):
            xs = [_values(dtype, (rows, 3), r, 500 + 10 * salt + op_i, op)
                  for r in range(size)]
            full = _reduce_ref(xs, op, dtype in INTS)
            const = getattr(tfring, op.capitalize())
            cases.append(Case(
                f"reducescatter {dtype} {op}",
                lambda t, o=const: tfring.reducescatter(t[0], op=o),
                [(xs[rank], dtype)], _rs_slice(full, rank, size), dtype))
    xs = [_values("float32", (rows, 2), r, 599) for r in range(size)]
    full = 3.0 * _reduce_ref([x * 0.5 for x in xs], "sum", False)
    cases.append(Case(
        "reducescatter sum prescale 0.5 postscale 3",
        lambda t: tfring.reducescatter(t[0], op=tfring.Sum,
                                       prescale_factor=0.5,
                                       postscale_factor=3.0),
        [(xs[rank], "float32")], _rs_slice(full, rank, size), "float32"))
    return cases


_CASE_BUILDERS = {
    "allreduce": _allreduce_cases,
    "grouped_allreduce": _grouped_cases,
    "allgather": _allgather_cases,
    "broadcast": _broadcast_cases,
    "reducescatter": _reducescatter_cases,
}


def _numeric_check(op, mode):
    def check(tf, tfring, rank, size):
        cases = _CASE_BUILDERS[op](tf, tfring, rank, size)
        _compare(cases, _run_cases(tf, cases, mode))
    return check


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


# ---------------------------------------------------------- other checks --

def check_indexed_slices(tf, tfring, rank, size):
    import numpy as np

    table = tf.Variable(np.arange(12.0).reshape(6, 2))
    ids = [[r % 6, (2 * r + 1) % 6, r % 6] for r in range(size)]
    dense_grads = []
    for r in range(size):
        g = np.zeros((6, 2))
        for i in ids[r]:
            g[i] += 1.0
        dense_grads.append(g)
    for op, scale in ((tfring.Sum, 1.0), (tfring.Average, 1.0 / size)):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.gather(table, ids[rank]))
        grad = tape.gradient(loss, table)
        assert isinstance(grad, tf.IndexedSlices), type(grad)
        reduced = tfring.allreduce(grad, op=op)
        assert isinstance(reduced, tf.IndexedSlices), type(reduced)
        _assert_close(f"allreduce(IndexedSlices) op {op}",
                      tf.convert_to_tensor(reduced).numpy(),
                      scale * np.sum(dense_grads, axis=0))
        for sparse_as_dense in (False, True):
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(tf.gather(table, ids[rank]))
            dtape = tfring.DistributedGradientTape(
                tape, op=op, sparse_as_dense=sparse_as_dense)
            grad = dtape.gradient(loss, table)
            want = tf.Tensor if sparse_as_dense else tf.IndexedSlices
            assert isinstance(grad, want), (sparse_as_dense, type(grad))
            _assert_close(f"tape sparse_as_dense={sparse_as_dense} op {op}",
                          tf.convert_to_tensor(grad).numpy(),
                          scale * np.sum(dense_grads, axis=0))
    try:
        tfring.allreduce(grad if isinstance(grad, tf.IndexedSlices) else
                         tf.IndexedSlices(tf.ones([1, 2]), tf.constant([0])),
                         op=tfring.Max)
    except NotImplementedError:
        pass
    else:
        raise AssertionError("allreduce(IndexedSlices, Max) should raise")


def check_compression_fp16(tf, tfring, rank, size):
    import numpy as np

    xs = [np.random.default_rng(700 + r).normal(size=(50,)) for r in range(size)]
    x = tf.constant(xs[rank], tf.float32)
    y = tfring.allreduce(x, compression=tfring.Compression.fp16)
    assert y.dtype == tf.float32, y.dtype
    _assert_close("fp16 compression", y.numpy(), np.mean(xs, axis=0), tol=5e-3)
    i = tf.constant([rank, 1], tf.int32)  # not floating: sent as it is
    y = tfring.allreduce(i, op=tfring.Sum, compression=tfring.Compression.fp16)
    assert y.dtype == tf.int32
    _assert_close("fp16 compression int", y.numpy(),
                  [sum(range(size)), size])


def check_broadcast_variables(tf, tfring, rank, size):
    import numpy as np

    a = tf.Variable(np.full((3,), float(rank)))
    b = tf.Variable(np.full((2, 2), rank, np.int32))
    c = tf.Variable(rank % 2 == 0)
    tfring.broadcast_variables([a, b, c], root_rank=size - 1)
    _assert_close("eager a", a.numpy(), np.full((3,), size - 1.0))
    _assert_close("eager b", b.numpy(), np.full((2, 2), size - 1))
    assert bool(c.numpy()) == ((size - 1) % 2 == 0)
    with tf.Graph().as_default():
        v = tf.compat.v1.Variable(np.full((4,), float(rank)))
        op = tfring.broadcast_variables([v], root_rank=0)
        with tf.compat.v1.Session() as sess:
            sess.run(v.initializer)
            sess.run(op)
            _assert_close("graph", sess.run(v), np.zeros(4))


def check_not_merged_or_folded(tf, tfring, rank, size):
    """Two identical allreduces stay two collectives and an allreduce of a
    constant is not folded away by grappler."""
    from tensorflow.core.protobuf import config_pb2

    with tf.Graph().as_default():
        x = tf.compat.v1.placeholder(tf.float32, [3])
        a = tfring.allreduce(x, op=tfring.Sum)
        b = tfring.allreduce(x, op=tfring.Sum)
        c = tfring.allreduce(tf.constant([1.0, 2.0]), op=tfring.Sum)
        opts = config_pb2.RunOptions(output_partition_graphs=True)
        meta = config_pb2.RunMetadata()
        with tf.compat.v1.Session() as sess:
            out = sess.run([a, b, c], {x: [1.0, 2.0, float(rank)]},
                           options=opts, run_metadata=meta)
    nodes = [n for g in meta.partition_graphs for n in g.node
             if n.op == "RingAllreduce"]
    assert len(nodes) == 3, [n.name for n in nodes]
    exp = [size, 2.0 * size, sum(range(size))]
    _assert_close("a", out[0], exp)
    _assert_close("b", out[1], exp)
    _assert_close("c", out[2], [size, 2.0 * size])


def check_function_ops_run_independently(tf, tfring, rank, size):
    """Inside tf.function, TF would chain stateful ops in program order; ours
    carry no control inputs, so all of them can be in flight together."""

    @tf.function
    def many(x):
        return [tfring.allreduce(x * float(i), op=tfring.Sum) for i in range(20)]

    x = tf.constant([1.0, float(rank)])
    graph = many.get_concrete_function(x).graph
    ring = [op for op in graph.get_operations() if op.type == "RingAllreduce"]
    assert len(ring) == 20
    chained = [op.name for op in ring if op.control_inputs]
    assert not chained, f"chained: {chained}"
    outs = many(x)
    for i, o in enumerate(outs):
        _assert_close(f"many[{i}]", o.numpy(),
                      [i * size, i * sum(range(size))])


def check_function_names(tf, tfring, rank, size):
    """Tensor names in tf.function are deterministic and unique, including
    across nested cond graphs; ranks compare them (see the pytest side)."""

    @tf.function
    def step(x):
        a = tfring.allreduce(x)
        b = tf.cond(x[0] > -1e9, lambda: tfring.allreduce(x), lambda: x)
        c = tf.cond(x[0] > -1e9, lambda: tfring.allreduce(x), lambda: x)
        d = tfring.allreduce(x, name="mine")
        return a + b + c + d

    from tfring import _collectives

    x = tf.constant([1.0])
    graph = step.get_concrete_function(x).graph
    names = sorted(_collectives._names_in_function[graph])
    top = [op.get_attr("tensor_name").decode() for op in graph.get_operations()
           if op.type == "RingAllreduce"]
    assert len(names) == 4 and set(top) <= set(names), (names, top)
    _assert_close("step", step(x).numpy(), [4.0])
    assert all(n.startswith("step/") for n in names), names
    return names


def check_grouped_rides_vote(tf, tfring, rank, size):
    """A steady small group of one dtype is one request, so it rides the
    agreement round's vote (TFRING_VOTE_DATA): every part is reduced, scaled
    and unpacked right there, step after step."""
    import numpy as np

    from tfring import _core

    shapes = [(3,), (2, 2), (), (0,), (5,)]
    algos = []
    for step in range(8):
        xs = [[_values("float32", s, r, 700 + 10 * step + i) for r in range(size)]
              for i, s in enumerate(shapes)]
        got = tfring.grouped_allreduce([tf.constant(x[rank]) for x in xs], op=tfring.Average,
                                       prescale_factor=0.5, postscale_factor=4.0,
                                       name="small_group")
        algos.append(_core.last_collective_stats()["algo"])
        for i, (g, x) in enumerate(zip(got, xs)):
            _assert_close(f"step {step} tensor {i}", g.numpy(),
                          np.sum(np.asarray(x, np.float64), axis=0) * 2.0 / size)
    # The room is agreed a round ahead: the first calls run as usual.
    assert algos[-4:] == ["vote"] * 4, algos


def check_grouped_outputs_independent(tf, tfring, rank, size):
    """A grouped allreduce's outputs that cannot reuse their inputs share one
    allocation (kernels.cc): each still behaves as a tensor of its own.
    In-place consumers, variables assigned from them and then updated, and
    outputs kept across steps never see another output's writes."""
    import numpy as np

    shapes = [(5,), (2, 3), (7,), (1,)]
    xs = [[_values("float32", s, r, 800 + i) for r in range(size)] for i, s in enumerate(shapes)]
    want = [np.sum(np.asarray(x, np.float64), axis=0) for x in xs]
    src = [tf.Variable(np.asarray(x[rank], np.float32)) for x in xs]
    dst = [tf.Variable(tf.zeros(s)) for s in shapes]

    @tf.function
    def step(k):
        outs = tfring.grouped_allreduce([v.read_value() for v in src], op=tfring.Sum,
                                        name="independent")
        bumped = outs[0] + k            # may run in place where TF allows it
        for v, o in zip(dst, outs):
            v.assign(o)
        dst[1].assign_add(tf.ones(shapes[1]) * k)
        return bumped, outs

    kept = []
    for k in range(3):
        bumped, outs = step(tf.constant(float(k + 1)))
        kept.append(outs)
        _assert_close(f"step {k} bumped", bumped.numpy(), want[0] + k + 1)
        _assert_close(f"step {k} dst[1]", dst[1].numpy(), want[1] + k + 1)
        for i in (0, 2, 3):
            _assert_close(f"step {k} dst[{i}]", dst[i].numpy(), want[i])
    for k, outs in enumerate(kept):
        for i, o in enumerate(outs):
            _assert_close(f"kept step {k} output {i}", o.numpy(), want[i])


def check_grouped_under_packing_algorithms(tf, tfring, rank, size):
    """See test_grouped_allreduce_under_packing_algorithms; returns the
    algorithms the steps ran."""
    import numpy as np

    from tfring import _core

    counts = [3000, 100, 200, 2000, 50, 700, 1024]  # float32: 12 KB, 8 KB alone
    algos = set()
    for step, (pre, post) in enumerate(((1.0, 1.0), (0.5, 4.0), (1.0, 1.0))):
        xs = [[_values("float32", (c,), r, 900 + 10 * step + i) for r in range(size)]
              for i, c in enumerate(counts)]
        got = tfring.grouped_allreduce([tf.constant(x[rank]) for x in xs], op=tfring.Sum,
                                       prescale_factor=pre, postscale_factor=post,
                                       name="packed")
        algos.add(_core.last_collective_stats()["algo"])
        for i, (g, x) in enumerate(zip(got, xs)):
            _assert_close(f"step {step} tensor {i}", g.numpy(),
                          np.sum(np.asarray(x, np.float64), axis=0) * pre * post)
    return sorted(algos)


def check_out_of_order_single_thread(tf, tfring, rank, size):
    """Ranks build the same collectives in opposite orders and run them on
    one inter-op thread: blocking kernels would deadlock here; ours hand the
    tensors to the engine and return, and the engine matches them by name."""
    import numpy as np

    names = [f"ooo_{i}" for i in range(6)]
    order = names if rank % 2 == 0 else names[::-1]
    base = np.array([1.0, 2.0], np.float32)
    exp = {n: size * base * (i + 1) for i, n in enumerate(names)}
    config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=1,
                                      intra_op_parallelism_threads=1,
                                      use_per_session_threads=True)
    with tf.Graph().as_default():
        x = tf.constant(base)
        outs = {n: tfring.allreduce(x * float(names.index(n) + 1),
                                    op=tfring.Sum, name=n) for n in order}
        with tf.compat.v1.Session(config=config) as sess:
            got = sess.run(outs)
    for n in names:
        _assert_close(f"session {n}", got[n], exp[n])

    @tf.function
    def run(x):
        return {n: tfring.allreduce(x * float(names.index(n) + 1),
                                    op=tfring.Sum, name=n) for n in order}

    got = run(tf.constant(base))
    for n in names:
        _assert_close(f"function {n}", got[n].numpy(), exp[n])


def check_xla_compiles(tf, tfring, rank, size):
    """Under jit_compile the ops compile to XLA custom calls (tests/tf/test_xla.py
    covers them); a build without XLA kernels refuses at trace time."""
    from tfring import _op_lib

    @tf.function(jit_compile=True)
    def f(x):
        return tfring.allreduce(x, op=tfring.Sum)

    if _op_lib.xla_build_state()[0]:
        _assert_close("xla", f(tf.ones([2])).numpy(), [size, size])
        return
    try:
        f.get_concrete_function(tf.TensorSpec([2], tf.float32))
    except NotImplementedError as e:
        assert "XLA" in str(e) and "RingAllreduce" in str(e), str(e)
    else:
        raise AssertionError("jit_compile=True should fail at trace time")


def check_mismatch_error(tf, tfring, rank, size):
    """A shape that differs by rank is a clear TF error naming the tensor,
    on every rank, and later collectives still work."""
    import numpy as np

    x = tf.ones([3 + rank])
    try:
        tfring.allreduce(x, name="bad_shape")
    except tf.errors.FailedPreconditionError as e:
        assert "bad_shape" in e.message, e.message
    else:
        raise AssertionError("a shape mismatch should raise")
    _assert_close("after", tfring.allreduce(tf.ones([2]), op=tfring.Sum).numpy(),
                  [size, size])
    # A grouped allreduce of one dtype is one request: a tensor whose shape
    # differs by rank is still named, with its place in the group, on every
    # rank; so is a group of another length (even of the same total size).
    for bad, label in (([tf.ones([4]), tf.ones([2 + rank]), tf.ones([3])],
                        "'bad_group.1' (the group's tensor 1)"),
                       ([tf.ones([6])] if rank == 0 else [tf.ones([2]), tf.ones([4])],
                        "number of tensors in the group")):
        try:
            tfring.grouped_allreduce(bad, name="bad_group")
        except tf.errors.FailedPreconditionError as e:
            assert "bad_group" in e.message and label in e.message, e.message
        else:
            raise AssertionError("a grouped shape mismatch should raise")
    got = tfring.grouped_allreduce([tf.ones([2]), tf.ones([3])], op=tfring.Sum)
    _assert_close("after group", np.concatenate([g.numpy() for g in got]), [size] * 5)


def check_version_mismatch(tf, tfring, rank, size):
    """Loading refuses an op library stamped with another TF version."""
    import importlib.util
    import tempfile

    from tfring import _op_lib

    try:
        _op_lib.check_version("2.0.0", tf.__version__)
    except ImportError as e:
        msg = str(e)
        assert "built against TensorFlow 2.0.0" in msg and tf.__version__ in msg
        assert "reinstall tfring" in msg and "--no-build-isolation" in msg
    else:
        raise AssertionError("no error for a version mismatch")
    # The same through loading: a copy of the loader beside a stamp of 2.0.0.
    pkg = os.path.dirname(_op_lib.__file__)
    with tempfile.TemporaryDirectory() as d:
        os.symlink(os.path.join(pkg, "_op_lib.py"), os.path.join(d, "_op_lib.py"))
        os.symlink(os.path.join(pkg, "_tfring_ops.so"),
                   os.path.join(d, "_tfring_ops.so"))
        with open(os.path.join(d, "_tfring_ops.so.tfversion"), "w") as f:
            f.write("2.0.0\n")
        spec = importlib.util.spec_from_file_location(
            "tfring_ops_copy", os.path.join(d, "_op_lib.py"))
        try:
            spec.loader.exec_module(importlib.util.module_from_spec(spec))
        except ImportError as e:
            assert "built against TensorFlow 2.0.0" in str(e), str(e)
        else:
            raise AssertionError("loading a mismatched library should fail")


def check_api_surface(tf, tfring, rank, size):
    for name in ("init", "shutdown", "is_initialized", "size", "rank",
                 "local_rank", "local_size", "cross_rank", "cross_size",
                 "allreduce", "grouped_allreduce", "allgather", "broadcast",
                 "broadcast_variables", "reducescatter", "Compression",
                 "DistributedGradientTape", "DistributedOptimizer"):
        assert callable(getattr(tfring, name)) or name == "Compression", name
    assert [tfring.Sum, tfring.Average, tfring.Min, tfring.Max,
            tfring.Product] == [0, 1, 2, 3, 4]
    assert tfring.Compression.none is not tfring.Compression.fp16
    assert tfring.size() == size and tfring.rank() == rank
    for op_type in ("RingAllreduce", "RingAllgather", "RingBroadcast",
                    "RingReducescatter", "RingGroupedAllreduce"):
        from tensorflow.python.framework import op_def_registry

        op_def = op_def_registry.get(op_type)
        assert op_def is not None and op_def.is_stateful, op_type


def _all_checks():
    checks = {}
    for op in _CASE_BUILDERS:
        for mode in MODES:
            checks[f"{op}_{mode}"] = _numeric_check(op, mode)
    for op, make in _GRAD_CHECKS.items():
        for mode in ("eager", "function"):
            checks[f"grad_{op}_{mode}"] = make(mode)
    checks["grad_allreduce_session"] = _grad_session
    for name in CHECKS + EXTRA_CHECKS:
        fn = globals().get(f"check_{name}")
        if fn is not None:
            checks[name] = fn
    return checks


def _grad_session(tf, tfring, rank, size):
    """tf.gradients in a tf.compat.v1 graph, for each op."""
    import numpy as np

    w = np.random.default_rng(660 + rank).normal(size=(4, 2))
    ws = [np.random.default_rng(660 + r).normal(size=(4, 2)) for r in range(size)]
    x = _values("float64", (4, 2), rank, 661)
    got = _gradient(tf, "session", lambda t: tfring.allreduce(t), x, w)
    _assert_close("allreduce", got, np.sum(ws, axis=0) / size)
    got = _gradient(tf, "session", lambda t: tfring.broadcast(t, 0), x, w)
    _assert_close("broadcast", got, np.mean(ws, axis=0) if rank == 0 else 0 * w)


def _worker():
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(2)
    import tfring

    checks = _all_checks()
    missing = [c for c in CHECKS if c not in checks]
    assert not missing, missing
    sys.path.insert(0, os.path.join(TESTS, "workers"))
    from common import run_checks, run_passes

    only = sys.argv[sys.argv.index("--only") + 1].split(",") if "--only" in sys.argv else CHECKS

    def body():
        rank, size = tfring.rank(), tfring.size()
        return run_checks({name: functools.partial(checks[name], tf, tfring, rank, size)
                           for name in only})

    # Once (init, checks, report, shutdown), or once per pass of TEST_PASSES.
    run_passes(body)


if __name__ == "__main__" and "--worker" in sys.argv:
    _worker()
