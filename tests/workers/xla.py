"""Rank worker for tests/tf/test_xla.py: tfring's collectives inside functions
compiled with tf.function(jit_compile=True), against the same functions
without XLA and numpy float64 references.

argv[1]: "main" runs every check below; "late_import" compiles a function
with XLA before importing tfring (a process of its own). Results go back as
{check: {"ok": bool, "error": str, ...}}.
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import re

import numpy as np
import tensorflow as tf
from common import checker, report

tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(2)

results = {}
check = checker(results, announce=True)

if sys.argv[1] == "late_import":
    @tf.function(jit_compile=True)
    def plain(x):
        return x * 2

    plain(tf.ones([2]))
    import tfring

    tfring.init()

    @check("late_import")
    def _():
        @tf.function(jit_compile=True)
        def f(x):
            return tfring.allreduce(x)

        try:
            f.get_concrete_function(tf.TensorSpec([2], tf.float32))
        except NotImplementedError as e:
            msg = str(e)
            assert "RingAllreduce" in msg and "before tracing the first" in msg, msg
            return {"message": msg}
        raise AssertionError("no trace-time error after a late import")

    report(results)
    sys.exit(0)

import tfring  # noqa: E402

tfring.init()
RANK, SIZE = tfring.rank(), tfring.size()
# XLA may fuse the model's arithmetic (FMA, reassociated reductions): a
# trained model is compared with its non-XLA twin within this tolerance.
# The collectives themselves move and sum the same bytes in the same
# order, so on exactly representable data their results are compared
# bit for bit.
TOL = 1e-5
if tf.config.list_physical_devices("GPU"):
    # On Ampere and later GPUs TensorFlow runs float32 matmuls in TF32 (10
    # mantissa bits) by default, and XLA and the graph executor pick
    # different kernels: compare the XLA and non-XLA models in full float32.
    tf.config.experimental.enable_tensor_float_32_execution(False)


def values(shape, salt, dtype=np.float32):
    """Per-rank data of multiples of 1/4: every sum and product below is
    exact in float32, so XLA's fusions cannot change a bit."""
    rng = np.random.default_rng(1000 * salt + RANK)
    return (rng.integers(-8, 9, shape) / 4).astype(dtype)


def every(shape, salt, dtype=np.float32):
    """What values() gives on each rank, in rank order (the references)."""
    out = []
    for r in range(SIZE):
        rng = np.random.default_rng(1000 * salt + r)
        out.append((rng.integers(-8, 9, shape) / 4).astype(dtype))
    return out


def equal(what, got, want):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} != {want.dtype}"
    assert np.array_equal(got, want), f"{what}: {got.ravel()[:6]} != {want.ravel()[:6]}"


STEP_CALLS = 8  # the collectives step() calls


def step(x, y, z, w):
    """Arithmetic around every supported collective."""
    a = tfring.allreduce(x * 2 + 1, op=tfring.Sum, name="sum")
    b = tfring.allreduce(x, op=tfring.Average, name="avg", prescale_factor=0.5,
                         postscale_factor=4.0)
    c = tfring.allreduce(x, op=tfring.Max, name="max")
    g = tfring.grouped_allreduce([x, y, z], op=tfring.Sum, name="group")
    # One dtype: one request with a part per tensor, with and without XLA.
    h = tfring.grouped_allreduce([x, w, x[0, 0]], op=tfring.Average, name="group1",
                                 prescale_factor=0.5, postscale_factor=4.0)
    br = tfring.broadcast(w * 3, root_rank=SIZE - 1, name="bcast")
    ag = tfring.allgather(w - 1, name="gather")
    rs = tfring.reducescatter(w, op=tfring.Sum, name="scatter")
    return [a * 3, b, c, *g, *h, br, ag, rs]


def inputs(salt):
    return [tf.constant(values([5, 3], salt)),
            tf.constant(values([4], salt + 1, np.float64)),
            tf.constant(np.arange(6, dtype=np.int32).reshape(2, 3) * (RANK + 1)),
            tf.constant(values([3, 2], salt + 2))]


def references(salt):
    xs, ys, ws = every([5, 3], salt), every([4], salt + 1, np.float64), every([3, 2], salt + 2)
    zs = [np.arange(6, dtype=np.int32).reshape(2, 3) * (r + 1) for r in range(SIZE)]
    f64 = [x.astype(np.float64) for x in xs]
    rows = 3 // SIZE + (1 if RANK < 3 % SIZE else 0)
    start = sum(3 // SIZE + (1 if r < 3 % SIZE else 0) for r in range(RANK))
    wsum = np.sum(ws, axis=0)
    return [
        (np.sum([x * 2 + 1 for x in f64], axis=0) * 3).astype(np.float32),
        (np.sum([x * 0.5 for x in f64], axis=0) / SIZE * 4).astype(np.float32),
        np.max(xs, axis=0),
        np.sum(f64, axis=0).astype(np.float32), np.sum(ys, axis=0),
        np.sum(zs, axis=0).astype(np.int32),
        (np.sum(f64, axis=0) * 2 / SIZE).astype(np.float32),
        (np.sum(ws, axis=0, dtype=np.float64) * 2 / SIZE).astype(np.float32),
        (np.sum(f64, axis=0)[0, 0] * 2 / SIZE).astype(np.float32),
        ws[SIZE - 1] * 3,
        np.concatenate([w - 1 for w in ws]),
        wsum[start:start + rows],
    ]


@check("ops_match_numpy_and_no_xla")
def _():
    jit = tf.function(step, jit_compile=True)
    nojit = tf.function(step)
    for salt in (1, 7):  # a second call takes the engine's cached path
        args = inputs(salt)
        got, base = jit(*args), nojit(*args)
        for i, (g, b, want) in enumerate(zip(got, base, references(salt))):
            equal(f"output {i} vs numpy", g.numpy(), want)
            equal(f"output {i} vs no XLA", g.numpy(), b.numpy())
    graph = jit.get_concrete_function(*inputs(1)).graph
    names = sorted(op.get_attr("tensor_name").decode() for op in graph.get_operations()
                   if op.type.startswith("Ring"))
    return {"names": names}


@check("while_loop")
def _():
    @tf.function(jit_compile=True)
    def loop(x):
        def body(i, acc):
            return i + 1, tfring.allreduce(acc, op=tfring.Sum, name="loop_sum") / SIZE + 1

        return tf.while_loop(lambda i, _: i < 3, body, [tf.constant(0), x])[1]

    x = tf.constant(values([4], 3))
    want = np.mean(every([4], 3), axis=0).astype(np.float32)
    for _ in range(3):
        want = (want * SIZE / SIZE + 1).astype(np.float32)
    equal("while_loop", loop(x).numpy(), want)


@check("mismatch_same_error_as_without_xla")
def _():
    def bad(x):
        return tfring.allreduce(x, name="bad_shape")

    def bad_group(x):
        return tfring.grouped_allreduce([x * 2, x], name="bad_group")

    x = tf.ones([3 + RANK])
    msgs = {}
    for label, f in (("", bad), ("group ", bad_group)):
        for mode, fn in (("xla", tf.function(f, jit_compile=True)), ("graph", tf.function(f))):
            try:
                fn(x)
            except tf.errors.FailedPreconditionError as e:
                msgs[label + mode] = e.message
            else:
                raise AssertionError(f"{label}{mode}: a shape mismatch should raise")
    for label, msg in msgs.items():
        want = ("bad_group.0' (the group's tensor 0) [3] on rank 0 vs [4]"
                if label.startswith("group") else "shape [3] on rank 0 vs [4] on rank 1")
        assert want in msg, (label, msg)
    # Later collectives still work, with and without XLA.
    after = tf.function(lambda v: tfring.allreduce(v, op=tfring.Sum, name="after"),
                        jit_compile=True)(tf.ones([2]))
    equal("after", after.numpy(), np.full(2, SIZE, np.float32))
    return {"messages": msgs}


@check("allgather_needs_equal_rows_under_xla")
def _():
    f = tf.function(lambda v: tfring.allgather(v, name="ragged"), jit_compile=True)
    try:
        out = f(tf.ones([2 + RANK, 3]))
    except tf.errors.FailedPreconditionError as e:
        assert "/ragged'" in e.message and "same first dimension" in e.message, e.message
        return {"message": e.message}
    assert SIZE == 1, "ragged allgather under XLA should fail on every rank"
    equal("one rank", out.numpy(), np.ones([2, 3], np.float32))


@check("dynamic_shape_names_the_op")
def _():
    @tf.function(jit_compile=True)
    def f(x):
        return tfring.allreduce(tf.boolean_mask(x, x > 0), name="masked")

    try:
        f(tf.constant([1.0, -1.0, 2.0]))
    except (tf.errors.InvalidArgumentError, tf.errors.UnimplementedError) as e:
        assert "masked" in e.message and "dynamic shape" in e.message, e.message
        return {"message": e.message}
    raise AssertionError("a dynamic shape under XLA should raise")


@check("outputs_written_over_inputs")
def _():
    # An allreduce or broadcast writes its result over its operand's buffer
    # (output_to_operand_aliasing), except over an argument or a variable's
    # value: XLA must still copy an operand that is read again, or passed
    # twice, and leave arguments and variables as they were.
    var = tf.Variable(values([4], 31))

    @tf.function(jit_compile=True)
    def f(x):
        t = x * 2 + 1
        r = tfring.grouped_allreduce([t, t, x], op=tfring.Sum, name="alias_group")
        a = tfring.allreduce(var.read_value(), op=tfring.Sum, name="alias_var")
        b = tfring.broadcast(t * 3, root_rank=SIZE - 1, name="alias_bcast")
        return [*r, t - 1, x, a, var.read_value(), b]

    x = tf.constant(values([3], 32))
    got = [g.numpy() for g in f(x)]
    xs = [v.astype(np.float64) for v in every([3], 32)]
    ts = [v * 2 + 1 for v in xs]
    mine_t = values([3], 32).astype(np.float64) * 2 + 1
    want = [np.sum(ts, axis=0), np.sum(ts, axis=0), np.sum(xs, axis=0), mine_t - 1,
            xs[RANK], np.sum(every([4], 31), axis=0, dtype=np.float64),
            values([4], 31), ts[SIZE - 1] * 3]
    for i, (g, w) in enumerate(zip(got, want)):
        equal(f"output {i}", g, np.asarray(w, np.float32))
    equal("variable after", var.numpy(), values([4], 31))
    hlo = f.experimental_get_compiler_ir(x)(stage="optimized_hlo")
    aliasing = {}
    for line in hlo.splitlines():
        m = re.search(r'custom_call_target="tfring_\w+".*tensor_name = "[^"]*/(alias_\w+)"', line)
        if m:
            a = re.search(r"output_to_operand_aliasing=\{(.*?)\}, api_version", line)
            aliasing[m.group(1)] = a.group(1) if a else ""
    # The temporaries are written over, the argument and the variable not.
    assert aliasing.get("alias_group", "").count(": (") == 2, aliasing
    assert "(2, {})" not in aliasing["alias_group"], aliasing
    assert aliasing.get("alias_var") == "", aliasing
    assert aliasing.get("alias_bcast", "").count(": (") == 1, aliasing
    return {"aliasing": aliasing}


@check("placement")
def _():
    gpus = [g.name for g in tf.config.list_physical_devices("GPU")]
    f = tf.function(lambda v: tfring.allreduce(v * 2, op=tfring.Sum, name="placed"),
                    jit_compile=True)
    out = f(tf.constant(values([8], 21)))
    want = np.sum([2 * v.astype(np.float64) for v in every([8], 21)], axis=0)
    equal("placed allreduce", out.numpy(), want.astype(np.float32))
    return {"gpus": gpus, "device": out.device}


@check("tape_training_matches_no_xla")
def _():
    import keras

    features, batch, steps = 6, 8, 5
    rng = np.random.default_rng(0)
    data_x = rng.normal(size=(steps, batch * SIZE, features)).astype(np.float32)
    data_y = data_x.sum(axis=2, keepdims=True).astype(np.float32)

    def train(jit):
        keras.utils.set_random_seed(1)
        model = keras.Sequential([keras.Input((features,)), keras.layers.Dense(16, "tanh"),
                                  keras.layers.Dense(1)])
        opt = keras.optimizers.SGD(0.05)
        tfring.broadcast_variables(model.variables, root_rank=0)

        @tf.function(jit_compile=jit)
        def train_step(xb, yb):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(model(xb) - yb))
            tape = tfring.DistributedGradientTape(tape)
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables))
            return loss

        for s in range(steps):
            part = slice(RANK * batch, (RANK + 1) * batch)
            train_step(tf.constant(data_x[s, part]), tf.constant(data_y[s, part]))
        return [v.numpy() for v in model.trainable_variables]

    with_xla, without = train(True), train(False)
    diff = max(float(np.max(np.abs(a - b))) for a, b in zip(with_xla, without))
    assert diff <= TOL, f"XLA and non-XLA weights differ by {diff}"
    # Every rank holds the same weights.
    flat = np.concatenate([w.ravel() for w in with_xla])
    spread = tfring.allreduce(flat, op=tfring.Max) - tfring.allreduce(flat, op=tfring.Min)
    assert float(np.max(spread)) == 0.0, "ranks' weights differ"
    return {"max_diff": diff}


@check("keras_fit_jit_matches_no_xla")
def _():
    import keras

    import tfring.keras as tk

    features, batch, steps = 6, 8, 4
    rng = np.random.default_rng(5)
    x = rng.normal(size=(steps * batch * SIZE, features)).astype(np.float32)
    y = np.sin(x).sum(axis=1, keepdims=True).astype(np.float32)
    # Rank r's part of every global batch.
    blocks = x.reshape(steps, SIZE, batch, features)[:, RANK].reshape(-1, features)
    yblocks = y.reshape(steps, SIZE, batch, 1)[:, RANK].reshape(-1, 1)

    def fit(jit):
        keras.utils.set_random_seed(3 + RANK)  # rank 0's weights are broadcast
        # 1.4 MB of gradients: more than the first bucket's 1 MiB, so the
        # step has two buckets without XLA, one grouped op with it.
        model = keras.Sequential([keras.Input((features,)), keras.layers.Dense(8, "tanh"),
                                  keras.layers.Dense(600, "tanh"),
                                  keras.layers.Dense(600, "tanh"), keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse", jit_compile=jit)
        model.fit(blocks, yblocks, batch_size=batch, epochs=1, shuffle=False, verbose=0,
                  callbacks=[tk.callbacks.RingAllreduceCallback()])
        assert bool(model.jit_compile) == jit, "the callback changed jit_compile"
        return [v.numpy() for v in model.trainable_variables]

    # Count the grouped ops each fit's step is traced with: one under XLA
    # (every gradient in one custom call), buckets without.
    from tfring import ops as tops

    orig, groups = tops.grouped_allreduce, []

    def counting(tensors, *args, **kwargs):
        groups.append(len(tensors))
        return orig(tensors, *args, **kwargs)

    tops.grouped_allreduce = counting
    try:
        with_xla = fit(True)
        xla_groups = list(groups)
        groups.clear()
        without = fit(False)
    finally:
        tops.grouped_allreduce = orig
    assert xla_groups == [8], f"under XLA the step reduced in groups {xla_groups}"
    assert len(groups) == 2 and sum(groups) == 8, f"without XLA: groups {groups}"
    diff = max(float(np.max(np.abs(a - b))) for a, b in zip(with_xla, without))
    assert diff <= TOL, f"XLA and non-XLA fit differ by {diff}"
    return {"max_diff": diff}


def tfring_calls(hlo):
    """{call: (ordered, last operand, tensor name)} of the tfring custom
    calls in HLO text, and {get-tuple-element: the call it reads}."""
    import re

    calls, gtes = {}, {}
    for line in hlo.splitlines():
        m = re.match(r"\s*(?:ROOT )?%([\w.-]+) = .*? custom-call\(([^)]*)\).*"
                     r'custom_call_target="tfring_', line)
        if m:
            operands = [o.strip().split()[-1].lstrip("%") for o in m.group(2).split(",")]
            name = re.search(r'tensor_name = "([^"]*)"', line)
            calls[m.group(1)] = ("ordered = 1 " in line, operands[-1],
                                 name.group(1) if name else None)
            continue
        m = re.match(r"\s*%([\w.-]+) = s32\[\] get-tuple-element\(.*?%([\w.-]+)\)", line)
        if m:
            gtes[m.group(1)] = m.group(2)
    return calls, gtes


def chained():
    """Whether this process's XLA calls should be chained (docs/xla.md)."""
    order = os.environ.get("TFRING_XLA_ORDER", "auto")
    return order == "chain" or (order != "free"
                                and bool(tf.config.list_physical_devices("GPU")))


def call_chain(hlo, count):
    """The tensor names of `count` chained tfring calls in chain order;
    fails unless each call's last operand reads the previous call's order
    value and following them visits every call once."""
    calls, gtes = tfring_calls(hlo)
    assert len(calls) == count, f"{len(calls)} tfring custom calls in:\n{hlo}"
    flags = {c: o for c, (o, _, _) in calls.items()}
    assert all(flags.values()), f"not every call is ordered: {flags}"
    prev = {c: gtes.get(last) for c, (_, last, _) in calls.items()}
    assert all(p is None or p in calls for p in prev.values()), (prev, gtes)
    heads = [c for c, p in prev.items() if p is None]
    assert len(heads) == 1, f"chain heads {heads}: {prev}"
    nxt = {p: c for c, p in prev.items() if p is not None}
    assert len(nxt) == len(calls) - 1, f"a call has two successors: {prev}"
    seen, c = [], heads[0]
    while c is not None:
        seen.append(c)
        c = nxt.get(c)
    assert len(seen) == len(calls), f"chain {seen} misses calls of {list(calls)}"
    return [calls[c][2] for c in seen]


@check("calls_chained_where_they_block")
def _():
    # Where the custom calls block (XLA:GPU, or TFRING_XLA_ORDER=chain),
    # each takes the previous call's order value, so XLA runs them in one
    # order on every rank whatever its schedule; on the CPU they stay free.
    jit = tf.function(step, jit_compile=True)
    hlo = jit.experimental_get_compiler_ir(*inputs(1))(stage="optimized_hlo")
    if not chained():
        calls, _ = tfring_calls(hlo)
        assert len(calls) == STEP_CALLS, f"{len(calls)} tfring custom calls in:\n{hlo}"
        assert not any(o for o, _, _ in calls.values()), f"chained although free: {calls}"
        return {"chained": False}
    return {"chained": True, "chain": call_chain(hlo, STEP_CALLS)}


@check("free_calls_run_in_any_order")
def _():
    # Ranks build three independent collectives in opposite orders (the
    # same names). The CPU target's calls are asynchronous, so unchained
    # they meet whatever order each rank reaches them in. Chained calls go
    # in the order tf2xla compiles the ops, which follows the order they
    # were built: those need every rank to build them in the same order
    # (the same code does), so the check does not apply there.
    # XLA:CPU runs a program one thunk after another when it has at most 8
    # thunks or only buffers of at most 512 bytes, waiting for each call
    # to finish; its calls then go in the schedule's order, which the same
    # code gives every rank (docs/xla.md). So six calls of 1 KiB: XLA runs
    # them as they become ready.
    if chained():
        return {"skipped": "chained calls need one build order on every rank"}
    names = ["o_first", "o_second", "o_third", "o_fourth", "o_fifth", "o_sixth"]

    def fn(x):
        out = {}
        for n in names if RANK % 2 == 0 else names[::-1]:
            out[n] = tfring.allreduce(x * (names.index(n) + 1), op=tfring.Sum, name=n)
        return [out[n] for n in names]

    x = tf.constant(values([16, 16], 21))
    got = tf.function(fn, jit_compile=True)(x)
    xs = every([16, 16], 21)
    for k, g in enumerate(got):
        equal(names[k], g.numpy(),
              np.sum([v.astype(np.float64) * (k + 1) for v in xs], axis=0).astype(np.float32))


@check("gradients_match_no_xla")
def _():
    def grads(x, w):
        with tf.GradientTape() as tape:
            tape.watch(w)
            a = tfring.allreduce(x * w, op=tfring.Sum, name="g_sum")
            g = tfring.allgather(w * 2, name="g_gather")
            b = tfring.broadcast(w, root_rank=0, name="g_bcast")
            loss = tf.reduce_sum(a * a) + tf.reduce_sum(g) * 3 + tf.reduce_sum(b * x)
        return tape.gradient(loss, w)

    x, w = tf.constant(values([4, 2], 11)), tf.constant(values([4, 2], 12))
    got = tf.function(grads, jit_compile=True)(x, w).numpy()
    base = tf.function(grads)(x, w).numpy()
    equal("gradient vs no XLA", got, base)
    # d/dw: 2 * sum_r(a) * x (a is the same on every rank and the loss is
    # summed over ranks), + 6 from the allgather and, on the root only, the
    # mean of every rank's x from the broadcast (Horovod averages the
    # upstream gradients of allgather and broadcast over ranks).
    xs, ws = every([4, 2], 11), every([4, 2], 12)
    a = np.sum([xr.astype(np.float64) * wr for xr, wr in zip(xs, ws)], axis=0)
    want = (2 * a * SIZE * xs[RANK] + 6
            + (np.mean(np.asarray(xs, np.float64), axis=0) if RANK == 0 else 0))
    equal("gradient vs numpy", got, want.astype(np.float32))


report(results)
