"""Horovod's TensorFlow API on each rank, through `import tfring as hvd`:
every collective called with Horovod's keyword arguments, the object
collectives, broadcast_, barrier, the grouped collectives, 16-bit integers,
integer IndexedSlices averaging, the allgather/broadcast gradients, Adasum,
the topology ops, the build queries and the run-time timeline. Every value
is checked against a numpy float64 (or exact integer) reference built from
every rank's inputs, which each rank can recompute from the seed.

argv[1]: a directory shared by the ranks (barrier and timeline files);
argv[2], optional: the checks to run, comma-separated (default: all).
"""

import json
import os
import sys
import time
import warnings

import numpy as np
import tensorflow as tf

from common import adasum_ref, checker, report

tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(2)

import tfring as hvd  # noqa: E402

hvd.init()
rank, size = hvd.rank(), hvd.size()
shared = sys.argv[1]
results = {}
_only = set(sys.argv[2].split(",")) if len(sys.argv) > 2 else None
_check = checker(results)


def check(name):
    if _only is not None and name not in _only:
        return lambda fn: fn
    return _check(name)



def data(r, shape, dtype, salt):
    """Rank r's input: small integers every dtype holds exactly."""
    rng = np.random.default_rng(1000 * salt + r)
    return rng.integers(-20 if np.dtype(dtype).kind != "u" else 0, 20,
                        size=shape).astype(dtype)


def close(what, got, want, tol=1e-6):
    got = np.asarray(got)
    want = np.asarray(want)
    if got.shape != want.shape or not np.allclose(got, want, rtol=tol, atol=tol):
        raise AssertionError(f"{what}: got {got!r}, want {want!r}")


def exact(what, got, want):
    got = np.asarray(got)
    want = np.asarray(want)
    if got.shape != want.shape or got.dtype != want.dtype or not np.array_equal(got, want):
        raise AssertionError(f"{what}: got {got!r} ({got.dtype}), want {want!r} ({want.dtype})")


def modes(fn):
    """fn's result eagerly and inside tf.function."""
    return {"eager": fn(), "function": tf.function(fn, autograph=False)()}


# -------------------------------------------------- Horovod's keywords ----

@check("allreduce_horovod_keywords")
def _():
    xs = [data(r, (3, 4), np.float32, 1) for r in range(size)]
    x = tf.constant(xs[rank])
    total = np.sum(np.asarray(xs, np.float64), axis=0)
    for label, kw, want in [
        ("op=Sum", dict(op=hvd.Sum), total),
        ("average=True", dict(average=True), total / size),
        ("average=False", dict(average=False), total),
        ("scaled", dict(op=hvd.Average, prescale_factor=2.0,
                        postscale_factor=0.5), total / size),
    ]:
        def fn(kw=kw, label=label):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                return hvd.allreduce(
                    x, device_dense="", device_sparse="",
                    compression=hvd.Compression.none, name=f"ar.{label}",
                    process_set=hvd.global_process_set, ignore_name_scope=False, **kw)
        for mode, got in modes(fn).items():
            close(f"{label} {mode}", got.numpy(), want)
    # The global set may also be given as None.
    close("process_set=None", hvd.allreduce(x, op=hvd.Sum, process_set=None), total)


@check("average_keyword_rules")
def _():
    x = tf.ones([2])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        hvd.allreduce(x, average=True, name="avg_warn")
    assert any(issubclass(w.category, DeprecationWarning) for w in caught), caught
    try:
        hvd.allreduce(x, average=True, op=hvd.Sum)
    except ValueError as e:
        assert "op" in str(e) and "average" in str(e), e
    else:
        raise AssertionError("average= with op= was accepted")


@check("process_set_rejects_other_sets")
def _():
    # A set never added (nor given to init) is refused by every collective
    # with an error that says so; the set's own collectives are tested in
    # tests/core/test_process_sets.py.
    unregistered = hvd.ProcessSet([0])
    for fn in (lambda: hvd.allreduce(tf.ones([1]), process_set=unregistered),
               lambda: hvd.allgather(tf.ones([1]), process_set=unregistered),
               lambda: hvd.broadcast_object(1, process_set=unregistered),
               lambda: hvd.barrier(process_set=unregistered)):
        try:
            fn()
        except ValueError as e:
            assert "not registered" in str(e), e
        else:
            raise AssertionError("an unregistered process set was accepted")


@check("grouped_allreduce_horovod_keywords")
def _():
    xs = [data(r, (5,), np.float64, 2) for r in range(size)]
    ys = [data(r, (2, 2), np.int32, 3) for r in range(size)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        got = hvd.grouped_allreduce(
            [tf.constant(xs[rank]), tf.constant(ys[rank])], average=False,
            device_dense="", device_sparse="", compression=hvd.Compression.none,
            prescale_factor=1.0, postscale_factor=1.0, process_set=None,
            ignore_name_scope=False, name="grouped_kw")
    close("float64", got[0].numpy(), np.sum(xs, axis=0))
    exact("int32", got[1].numpy(), np.sum(ys, axis=0).astype(np.int32))


@check("allgather_broadcast_reducescatter_horovod_keywords")
def _():
    xs = [data(r, (r + 1, 3), np.float32, 4) for r in range(size)]
    got = hvd.allgather(tf.constant(xs[rank]), name="ag_kw",
                        ignore_name_scope=False, process_set=None)
    exact("allgather", got.numpy(), np.concatenate(xs))
    root = size - 1
    got = hvd.broadcast(tf.constant(xs[rank][:1]), root, name="bc_kw",
                        ignore_name_scope=False, process_set=None)
    exact("broadcast", got.numpy(), xs[root][:1])
    rows = 2 * size + 1
    zs = [data(r, (rows, 2), np.float64, 5) for r in range(size)]
    got = hvd.reducescatter(tf.constant(zs[rank]), device_dense="",
                            compression=hvd.Compression.none, op=hvd.Sum,
                            name="rs_kw", process_set=None,
                            ignore_name_scope=False, prescale_factor=1.0,
                            postscale_factor=2.0)
    full = 2.0 * np.sum(zs, axis=0)
    begin = sum(rows // size + (r < rows % size) for r in range(rank))
    mine = rows // size + (rank < rows % size)
    close("reducescatter", got.numpy(), full[begin:begin + mine])


@check("ignore_name_scope")
def _():
    with tf.Graph().as_default():
        x = tf.ones([2])
        with tf.name_scope("outer"):
            kept = hvd.allreduce(x, name="kept")
            dropped = hvd.allreduce(x, name="dropped", ignore_name_scope=True)
        assert kept.op.name.startswith("outer/"), kept.op.name
        assert not dropped.op.name.startswith("outer"), dropped.op.name
        with tf.compat.v1.Session() as sess:
            a, b = sess.run([kept, dropped])
    close("kept", a, np.ones(2))
    close("dropped", b, np.ones(2))


# -------------------------------------------------- object collectives ----

def _obj(r):
    # Pickles of very different sizes per rank.
    return {"rank": r, "blob": "x" * (1000 * r + 1), "arr": np.arange(r + 1)}


def _same_obj(got, want):
    assert got["rank"] == want["rank"] and got["blob"] == want["blob"], got
    assert np.array_equal(got["arr"], want["arr"]), got


@check("allgather_object")
def _():
    got = hvd.allgather_object(_obj(rank))
    assert len(got) == size, got
    for r in range(size):
        _same_obj(got[r], _obj(r))
    # Inside a tf.compat.v1 graph too (no session needed).
    with tf.Graph().as_default():
        got = hvd.allgather_object(rank * 10, name="ints")
    assert got == [r * 10 for r in range(size)], got


@check("broadcast_object")
def _():
    for root in sorted({0, size - 1}):
        mine = _obj(rank) if rank == root else None
        _same_obj(hvd.broadcast_object(mine, root_rank=root), _obj(root))
    fn = hvd.broadcast_object_fn(root_rank=size - 1, name="bfn")
    for step in range(2):
        got = fn(("step", step, rank))
        assert got == ("step", step, size - 1), got
    # A root outside the job on every rank, then on the last rank only:
    # every rank fails, and the job goes on.
    for bad, label in ((lambda r: size, "bad_all"),
                       (lambda r: size if r == size - 1 else 0, "bad_last")):
        try:
            hvd.broadcast_object(1, root_rank=bad(rank), name=label)
        except ValueError as e:
            assert "root_rank" in str(e) and label in str(e), e
        else:
            raise AssertionError(f"{label}: a root_rank outside the job was accepted")
    _same_obj(hvd.broadcast_object(_obj(0) if rank == 0 else None, root_rank=0,
                                   name="after_bad"), _obj(0))


# ------------------------------------------- broadcast_, barrier, grouped ----

@check("broadcast_inplace")
def _():
    root = size - 1
    vs = [tf.Variable(data(rank, (3,), np.float32, 6)),
          tf.Variable(data(rank, (2, 2), np.int64, 7))]
    out = hvd.broadcast_(vs, root, name="inplace")
    exact("value 0", vs[0].numpy(), data(root, (3,), np.float32, 6))
    exact("value 1", vs[1].numpy(), data(root, (2, 2), np.int64, 7))
    exact("returned 0", out[0].numpy(), vs[0].numpy())
    exact("returned 1", out[1].numpy(), vs[1].numpy())
    w = tf.Variable(data(rank, (4,), np.float64, 8))

    @tf.function(autograph=False)
    def step():
        return hvd.broadcast_([w], 0, process_set=None)

    got = step()
    exact("tf.function", w.numpy(), data(0, (4,), np.float64, 8))
    exact("tf.function returned", got[0].numpy(), w.numpy())
    u = tf.Variable(data(rank, (2,), np.float32, 9))
    hvd.broadcast_variables([u], root_rank=root, process_set=None, inplace=True)
    exact("broadcast_variables(inplace=True)", u.numpy(), data(root, (2,), np.float32, 9))


@check("broadcast_global_variables_and_hook")
def _():
    root = size - 1
    with tf.Graph().as_default():
        v = tf.compat.v1.Variable(data(rank, (3,), np.float32, 14))
        hook = hvd.BroadcastGlobalVariablesHook(root, device="")
        hook.begin()
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            hook.after_create_session(sess, None)
            exact("hook", sess.run(v), data(root, (3,), np.float32, 14))
            sess.run(v.assign(data(rank, (3,), np.float32, 15)))
            sess.run(hvd.broadcast_global_variables(0))
            exact("broadcast_global_variables", sess.run(v), data(0, (3,), np.float32, 15))
    try:
        hvd.broadcast_global_variables(0)
    except RuntimeError as e:
        assert "broadcast_variables" in str(e), e
    else:
        raise AssertionError("broadcast_global_variables ran eagerly")


@check("barrier")
def _():
    # Ranks arrive at different times; after the barrier every rank's mark
    # made before it must exist.
    time.sleep(0.3 * rank)
    open(os.path.join(shared, f"before_barrier.{rank}"), "w").close()
    hvd.barrier()
    missing = [r for r in range(size)
               if not os.path.exists(os.path.join(shared, f"before_barrier.{r}"))]
    assert not missing, f"ranks {missing} had not reached the barrier"
    hvd.barrier(process_set=hvd.global_process_set)


@check("grouped_allgather")
def _():
    a = [data(r, (r + 2, 3), np.float64, 10) for r in range(size)]
    b = [data(r, (2 * r,), np.int16, 11) for r in range(size)]
    c = [np.array([r % 2 == 0] * (r + 1)) for r in range(size)]

    def fn():
        return hvd.grouped_allgather([tf.constant(a[rank]), tf.constant(b[rank]),
                                      tf.constant(c[rank])], name="gag",
                                     ignore_name_scope=False, process_set=None)
    for mode, got in modes(fn).items():
        exact(f"float64 {mode}", got[0].numpy(), np.concatenate(a))
        exact(f"int16 {mode}", got[1].numpy(), np.concatenate(b))
        exact(f"bool {mode}", got[2].numpy(), np.concatenate(c))


@check("grouped_reducescatter")
def _():
    rows = [size + 1, 3 * size]
    xs = [[data(r, (n, 2), np.float64, 12 + i) for r in range(size)]
          for i, n in enumerate(rows)]

    def share(full, n):
        begin = sum(n // size + (r < n % size) for r in range(rank))
        return full[begin:begin + n // size + (rank < n % size)]

    for op, scale in ((hvd.Average, 1.0 / size), (hvd.Sum, 1.0)):
        def fn(op=op):
            return hvd.grouped_reducescatter(
                [tf.constant(x[rank]) for x in xs], device_dense="",
                compression=hvd.Compression.none, op=op, process_set=None,
                prescale_factor=1.0, postscale_factor=3.0)
        for mode, got in modes(fn).items():
            for i, n in enumerate(rows):
                want = 3.0 * scale * np.sum(xs[i], axis=0)
                close(f"op {op} tensor {i} {mode}", got[i].numpy(), share(want, n))


# ------------------------------------------------------ 16-bit integers ----

@check("int16_uint16")
def _():
    for dt in (np.int16, np.uint16):
        xs = [data(r, (7, 3), dt, 20) + (1 if dt == np.uint16 else 0) for r in range(size)]
        x = tf.constant(xs[rank])
        wide = np.asarray(xs, np.int64)
        wants = {
            hvd.Sum: np.sum(wide, axis=0),
            hvd.Average: np.trunc(np.sum(wide, axis=0) / size),
            hvd.Min: np.min(wide, axis=0),
            hvd.Max: np.max(wide, axis=0),
            hvd.Product: np.prod(wide, axis=0),
        }
        for op, want in wants.items():
            # Sums and products wrap, as numpy's do in the same dtype.
            want = want.astype(np.int64).astype(dt)
            exact(f"{dt.__name__} allreduce op {op}", hvd.allreduce(x, op=op).numpy(), want)
        got = hvd.grouped_allreduce([x, x], op=hvd.Max)
        exact(f"{dt.__name__} grouped", got[1].numpy(), np.max(wide, axis=0).astype(dt))
        exact(f"{dt.__name__} allgather", hvd.allgather(x).numpy(), np.concatenate(xs))
        exact(f"{dt.__name__} broadcast", hvd.broadcast(x, size - 1).numpy(), xs[size - 1])
        got = hvd.reducescatter(x, op=hvd.Sum).numpy()
        full = np.sum(wide, axis=0).astype(dt)
        begin = sum(7 // size + (r < 7 % size) for r in range(rank))
        exact(f"{dt.__name__} reducescatter", got,
              full[begin:begin + 7 // size + (rank < 7 % size)])
    # Wrap-around: the extreme values, summed and multiplied in 16 bits.
    big = np.array([32767, -32768, 300], np.int16)
    got = hvd.allreduce(tf.constant(big), op=hvd.Sum).numpy()
    exact("int16 wraps", got, (big.astype(np.int64) * size).astype(np.int16))
    big = np.array([65535, 40000, 2], np.uint16)
    got = hvd.allreduce(tf.constant(big), op=hvd.Product).numpy()
    exact("uint16 wraps", got, (big.astype(np.uint64) ** size).astype(np.uint16))
    # The numpy-level core path takes them too.
    from tfring import _core
    got = _core.allreduce(np.array([1, 2, 3], np.uint16), "sum", name="u16core")
    exact("core uint16", got, np.array([1, 2, 3], np.uint16) * size)


@check("indexed_slices_integer_average")
def _():
    for dt in (np.uint8, np.int8, np.int16, np.uint16, np.int32, np.int64):
        vals = [data(r, (r + 1, 2), dt, 30) for r in range(size)]
        idx = [np.arange(r + 1, dtype=np.int64) for r in range(size)]
        s = tf.IndexedSlices(tf.constant(vals[rank]), tf.constant(idx[rank]),
                             dense_shape=tf.constant([size + 1, 2], tf.int64))
        avg = hvd.allreduce(s, op=hvd.Average)
        # Horovod's true division: 8/16-bit integers become float32, 32/64-bit
        # float64.
        want_dt = np.float32 if np.dtype(dt).itemsize <= 2 else np.float64
        assert avg.values.dtype.as_numpy_dtype == want_dt, (dt, avg.values.dtype)
        close(f"{np.dtype(dt).name} average", avg.values.numpy(),
              np.concatenate(vals).astype(np.float64) / size)
        exact(f"{np.dtype(dt).name} indices", avg.indices.numpy(), np.concatenate(idx))
        summed = hvd.allreduce(s, op=hvd.Sum)
        exact(f"{np.dtype(dt).name} sum", summed.values.numpy(), np.concatenate(vals))
        grouped = hvd.grouped_allreduce([s], op=hvd.Average)[0]
        close(f"{np.dtype(dt).name} grouped average", grouped.values.numpy(),
              np.concatenate(vals).astype(np.float64) / size)


# ------------------------------------------------------------ gradients ----

def _grad(fn, x_np, w_np, mode):
    x = tf.constant(x_np)
    w = tf.constant(w_np)

    def g(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            loss = tf.reduce_sum(w * fn(x))
        return tape.gradient(loss, x)
    return (g(x) if mode == "eager" else tf.function(g, autograph=False)(x)).numpy()


@check("allgather_gradient_is_averaged")
def _():
    rows = [r + 1 for r in range(size)]
    ws = [np.random.default_rng(40 + r).normal(size=(sum(rows), 3)) for r in range(size)]
    x = np.random.default_rng(50 + rank).normal(size=(rows[rank], 3))
    begin = sum(rows[:rank])
    want = np.mean(ws, axis=0)[begin:begin + rows[rank]]
    for mode in ("eager", "function"):
        close(f"allgather {mode}", _grad(hvd.allgather, x, ws[rank], mode), want, 1e-12)


@check("broadcast_gradient_is_averaged")
def _():
    ws = [np.random.default_rng(60 + r).normal(size=(4,)) for r in range(size)]
    x = np.random.default_rng(70 + rank).normal(size=(4,))
    for root in sorted({0, size - 1}):
        want = np.mean(ws, axis=0) if rank == root else np.zeros(4)
        for mode in ("eager", "function"):
            got = _grad(lambda t, root=root: hvd.broadcast(t, root), x, ws[rank], mode)
            close(f"broadcast root {root} {mode}", got, want, 1e-12)


# --------------------------------------------------------------- Adasum ----

@check("adasum")
def _():
    xs = [np.random.default_rng(80 + r).normal(size=(6, 5)) for r in range(size)]
    if size & (size - 1):
        try:
            hvd.allreduce(tf.constant(xs[rank]), op=hvd.Adasum)
        except NotImplementedError as e:
            assert "power-of-two" in str(e), e
            return {"skipped": "not a power of two"}
        raise AssertionError("Adasum ran on a non-power-of-two job")
    want = adasum_ref(xs)
    for mode, got in modes(lambda: hvd.allreduce(tf.constant(xs[rank]), op=hvd.Adasum,
                                                 name="ada")).items():
        close(f"float64 {mode}", got.numpy(), want, 1e-12)
    got = hvd.allreduce(tf.constant(xs[rank], tf.float32), op=hvd.Adasum,
                        prescale_factor=2.0, postscale_factor=0.25)
    close("float32 scaled", got.numpy(), 0.25 * adasum_ref([2.0 * x for x in xs]), 1e-4)
    # Parallel vectors average, orthogonal ones add (the formula's purpose).
    same = hvd.allreduce(tf.constant([1.0, 2.0]), op=hvd.Adasum).numpy()
    close("parallel", same, [1.0, 2.0])
    # A zero vector keeps its partner's coefficient at 1.
    zero = np.zeros(3) if rank % 2 else np.arange(3.0) + rank
    got = hvd.allreduce(tf.constant(zero), op=hvd.Adasum).numpy()
    close("zero vector", got, adasum_ref([np.zeros(3) if r % 2 else np.arange(3.0) + r
                                          for r in range(size)]), 1e-12)
    ys = [np.random.default_rng(90 + r).normal(size=(4,)) for r in range(size)]
    got = hvd.grouped_allreduce([tf.constant(xs[rank]), tf.constant(ys[rank])],
                                op=hvd.Adasum)
    close("grouped 0", got[0].numpy(), want, 1e-12)
    close("grouped 1", got[1].numpy(), adasum_ref(ys), 1e-12)
    try:
        hvd.allreduce(tf.constant([1, 2]), op=hvd.Adasum)
    except ValueError as e:
        assert "floating" in str(e), e
    else:
        raise AssertionError("Adasum of an integer tensor was accepted")


# ---------------------------------------------- topology, build queries ----

@check("topology_ops")
def _():
    want = {"rank": rank, "size": size, "local_rank": hvd.local_rank(),
            "local_size": hvd.local_size(), "included": 1}

    def fn():
        return {"rank": hvd.rank_op(), "size": hvd.size_op(),
                "local_rank": hvd.local_rank_op(name="lr"),
                "local_size": hvd.local_size_op(),
                "included": hvd.process_set_included_op(0)}
    for mode, got in modes(fn).items():
        got = {k: int(v.numpy()) for k, v in got.items()}
        assert got == want, (mode, got, want)
    assert int(hvd.process_set_included_op(process_set_id=7)) == -3
    try:
        hvd.size_op(process_set_id=7).numpy()
    except tf.errors.InvalidArgumentError as e:
        assert "7" in str(e), e
    else:
        raise AssertionError("size_op of an unknown process set returned a value")
    # Built into a graph, evaluated when the session runs it.
    with tf.Graph().as_default():
        r = hvd.rank_op()
        with tf.compat.v1.Session() as sess:
            assert sess.run(r) == rank


@check("build_queries")
def _():
    assert hvd.is_homogeneous() is True
    assert hvd.mpi_threads_supported() is True
    for name in ("mpi_enabled", "mpi_built", "gloo_enabled", "gloo_built",
                 "ddl_built", "ccl_built", "rocm_built"):
        assert getattr(hvd, name)() is False, name
    assert isinstance(hvd.cuda_built(), bool)
    assert isinstance(hvd.nccl_built(), int)
    if not hvd.cuda_built():
        assert hvd.nccl_built() == 0


@check("timeline_start_stop")
def _():
    first = os.path.join(shared, "timeline1.{rank}.json")
    second = os.path.join(shared, "timeline2.{rank}.json")
    hvd.start_timeline(first)
    hvd.allreduce(tf.ones([8]), name="traced_one")
    hvd.stop_timeline()
    hvd.allreduce(tf.ones([8]), name="after_stop")
    hvd.start_timeline(second, mark_cycles=False)
    hvd.allgather(tf.ones([2, 2]), name="traced_two")
    hvd.stop_timeline()
    names = []
    for path in (first, second):
        with open(path.replace("{rank}", str(rank))) as f:
            events = json.load(f)  # a complete JSON array once stopped
        names.append({e["args"]["name"] for e in events if e.get("ph") == "M"})
    assert "traced_one" in names[0] and "after_stop" not in names[0], names
    assert "traced_two" in names[1] and "after_stop" not in names[1], names
    phases = {e.get("name") for e in events}
    assert "allgather" in phases, phases


report(results)
hvd.shutdown()
