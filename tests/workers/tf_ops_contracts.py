"""The op-level contracts checked by tests/workers/tf_ops.py: IndexedSlices,
compression, broadcast_variables, ops not merged or folded, ordering inside
tf.function, names, XLA, errors on mismatches and on a TF version mismatch,
the API surface."""

import os

from tf_ops_cases import _values
from tf_ops_grads import _assert_close

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
