"""The numeric checks of tests/workers/tf_ops.py: per-rank data every dtype
holds exactly, numpy float64 references, and each collective's cases run in
eager, tf.function and tf.compat.v1 session modes."""

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
