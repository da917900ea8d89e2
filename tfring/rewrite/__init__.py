"""Graph rewrite: one call makes an existing training program data-parallel.

tf.compat.v1 graphs. Call it once the training graph is built, before the
session starts:

    train_op = tf.compat.v1.train.AdamOptimizer(1e-3).minimize(loss)
    report = tfring.rewrite()          # the one added line
    with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())  # + broadcast
        ...

Every gradient that reaches an optimizer's update is rerouted through
RingAllreduce (averaged over ranks by default), dense gradients fused into
few RingGroupedAllreduce ops by size; sparse gradients (tf.IndexedSlices:
embedding lookups, tf.gather) go through RingAllgather, values and indices,
so no rank densifies them. Each global variable's initializer is changed to
assign root_rank's initial value, so running the initializer (however the
program runs it) starts every rank from the same weights; after restoring a
checkpoint instead, run `report.broadcast_op`. Nothing else in the graph
changes: summaries, metrics, evaluation and gradient clipping keep their
local inputs. A second call rewrites only what was added since.

How gradients are found. tf.compat.v1.train optimizers build every update
under a name scope `update_<variable>` (Optimizer.apply_gradients); call
the ops there the optimizer's side. Each training kernel
(ApplyAdam, ResourceSparseApplyAdagrad, ...) names its gradient inputs
(`grad`, `delta`, `indices` in its op definition); optimizers without a
sparse kernel (Adam, GradientDescent) update slots with scatter ops, whose
`indices` and `updates` are the sinks there. From every sink input we walk
back through the optimizer's side (deduplication, scaling) to the tensors it
takes from the rest of the graph: those are the gradients the optimizer was
given (after any tower AddN or clipping the user did). Where the walk passes
through arithmetic, the learning rate and other hyperparameters are told
apart from gradients by whether they depend on the output of tf.gradients.

tf.function training steps (TF2). `tfring.rewrite(step)` or `@tfring.rewrite`
returns a function whose optimizer updates receive ring-allreduced
gradients: while the step is traced (or runs eagerly) every Keras 3
optimizer `apply`/`apply_gradients`, tf_keras and tf.compat.v1 optimizer
`apply_gradients` it makes allreduces its gradients first (or, with
`on="tape"`, every GradientTape.gradient result). On the first call the
variables it updates and the optimizer's state are broadcast from
root_rank before the step runs.
"""

import contextlib
import dataclasses
import functools
import re
import sys
import threading
import types
import warnings

import numpy as np
import tensorflow as tf

from tfring import Average, _core, basics
from tfring import ops as _ops
from tfring.compression import Compression

__all__ = [
    "RewriteReport",
    "RewrittenFunction",
    "RewrittenGradient",
    "broadcast_values",
    "reduce_gradients",
    "rewrite",
]

# Name scope of every op the rewrite adds to a graph: ops there are
# recognized as already rewritten (idempotency).
SCOPE = "tfring_rewrite"
# Graph collection holding the broadcast op of a rewritten graph.
_BROADCAST_COLLECTION = "tfring_rewrite_broadcast"

_NUMERIC = (tf.float16, tf.bfloat16, tf.float32, tf.float64, tf.int32,
            tf.int64, tf.uint8, tf.int8)


def _fusion_bytes(fusion_threshold):
    """Bucket size for fused gradient ops: the argument, else the engine's
    fusion threshold (TFRING_FUSION_THRESHOLD, default 64 MiB)."""
    if fusion_threshold is not None:
        return int(fusion_threshold)
    if _core.is_initialized():
        return int(_core.config()["fusion_threshold"])
    return 64 << 20


def _nbytes(tensor):
    shape = tensor.shape
    if shape.rank is None or not shape.is_fully_defined():
        return None
    return int(np.prod(shape.as_list(), dtype=np.int64)) * tensor.dtype.size


def _buckets(tensors, limit):
    """Splits `tensors` (in order) into consecutive runs of at most `limit`
    bytes (a larger tensor forms its own run; unknown sizes count 0)."""
    runs, run, run_bytes = [], [], 0
    for t in tensors:
        n = _nbytes(t) or 0
        if run and run_bytes + n > limit:
            runs.append(run)
            run, run_bytes = [], 0
        run.append(t)
        run_bytes += n
    if run:
        runs.append(run)
    return runs


# -------------------------------------------------------------- report ----

@dataclasses.dataclass
class RewrittenGradient:
    """One gradient tensor the rewrite rerouted."""
    tensor: str        # the gradient's name in the graph, before the rewrite
    update: str        # the optimizer update that consumed it
    kind: str          # "dense" (allreduced), "sparse_values", "sparse_indices" (allgathered)
    bytes: object      # static size in bytes, None when the shape is dynamic


@dataclasses.dataclass
class RewriteReport:
    """What `tfring.rewrite(graph)` changed."""
    gradients: list = dataclasses.field(default_factory=list)
    allreduce_ops: list = dataclasses.field(default_factory=list)
    allgather_ops: list = dataclasses.field(default_factory=list)
    broadcast_variables: list = dataclasses.field(default_factory=list)
    # Assigns root_rank's current value to every global variable: run it
    # after restoring a checkpoint (initializers already broadcast).
    broadcast_op: object = None
    # Gradients found already rerouted by an earlier call.
    already_rewritten: int = 0

    @property
    def count(self):
        """Gradients rerouted (a sparse gradient's values and indices count
        once)."""
        return sum(g.kind != "sparse_indices" for g in self.gradients)

    @property
    def dense_count(self):
        return sum(g.kind == "dense" for g in self.gradients)

    @property
    def sparse_count(self):
        return sum(g.kind == "sparse_values" for g in self.gradients)

    @property
    def bytes(self):
        """Static bytes of the dense gradients allreduced per step."""
        return sum(g.bytes or 0 for g in self.gradients if g.kind == "dense")

    def __str__(self):
        lines = [f"tfring.rewrite: {self.dense_count} dense gradients "
                 f"({self.bytes / 2**20:.2f} MiB) in "
                 f"{len(self.allreduce_ops)} allreduce ops, "
                 f"{self.sparse_count} sparse gradients in "
                 f"{len(self.allgather_ops)} allgather ops, "
                 f"{len(self.broadcast_variables)} variable initializers "
                 f"broadcast"
                 + (f", {self.already_rewritten} gradients already rewritten"
                    if self.already_rewritten else "")]
        for g in self.gradients:
            size = "?" if g.bytes is None else g.bytes
            lines.append(f"  {g.kind:15s} {g.tensor} -> {g.update} ({size} B)")
        return "\n".join(lines)


# --------------------------------------------------- tf.compat.v1 graph ----

# Training kernels: their op definitions name the gradient inputs.
_APPLY_OP = re.compile(r"^(Resource)?(Sparse)?Apply[A-Z]\w*$")
_APPLY_GRAD_ARGS = ("grad", "delta", "indices")
# Scatter updates optimizers use where no sparse kernel exists.
_SCATTER_OP = re.compile(r"^(Resource)?Scatter(Nd)?(Add|Sub|Update|Mul|Div|Min|Max)$")
_SCATTER_ARGS = ("indices", "updates")
# Name scope components: an optimizer's per-variable update, and the ops
# tf.gradients builds (its scope and the per-op "<op>_grad" scopes).
_UPDATE_SCOPE = re.compile(r"(^|/)update_")
_GRADIENT_SCOPE = re.compile(r"(^|/)(gradients(_\d+)?|[^/]+_grad)/")
# Where the search for a gradient op stops: sources of the forward graph.
_SOURCE_TYPES = frozenset({
    "Const", "Placeholder", "PlaceholderWithDefault", "VarHandleOp",
    "VariableV2", "Variable", "ReadVariableOp", "IteratorGetNext",
    "IteratorV2", "Iterator"})


def _optimizer_side(op):
    return bool(_UPDATE_SCOPE.search(op.name)) and not op.name.startswith(SCOPE + "/")


def _is_ours(op):
    return op.name.startswith(SCOPE + "/")


_RING_OPS = ("RingAllreduce", "RingGroupedAllreduce", "RingAllgather")


def _already_reduced(tensor):
    """Made by an earlier rewrite, or by a tfring collective already (e.g.
    tfring.DistributedOptimizer): possibly through the scaling or cast that
    follows an allgather or compression."""
    op = tensor.op
    if _is_ours(op) or op.type in _RING_OPS:
        return True
    return op.type in ("Mul", "Cast", "Identity") and any(
        x.op.type in _RING_OPS for x in op.inputs)


def _input_indices(op, arg_names):
    """Indices into op.inputs of the named (single-tensor) input args."""
    args = op.op_def.input_arg
    if any(a.number_attr or a.type_list_attr for a in args):
        return []  # list inputs: never a training kernel
    return [i for i, a in enumerate(args) if a.name in arg_names]


def _find_sinks(graph):
    """[(op, input indices, sparse)] of optimizer updates' gradient inputs."""
    sinks = []
    for op in graph.get_operations():
        if _APPLY_OP.match(op.type):
            idx = _input_indices(op, _APPLY_GRAD_ARGS)
            if idx:
                sinks.append((op, idx, "Sparse" in op.type))
        elif _SCATTER_OP.match(op.type) and _optimizer_side(op):
            idx = _input_indices(op, _SCATTER_ARGS)
            if idx:
                sinks.append((op, idx, True))
    return sinks


class _GradientOracle:
    """Whether a tensor depends on an op built by tf.gradients (memoized)."""

    def __init__(self):
        self.memo = {}

    def __call__(self, tensor):
        start = tensor.op
        if start.name in self.memo:
            return self.memo[start.name]
        seen, stack, found = {start.name}, [start], False
        while stack:
            op = stack.pop()
            if op.name in self.memo:
                if self.memo[op.name]:
                    found = True
                    break
                continue
            if _GRADIENT_SCOPE.search(op.name + "/"):
                found = True
                break
            if op.type in _SOURCE_TYPES:
                continue
            for t in op.inputs:
                if t.op.name not in seen:
                    seen.add(t.op.name)
                    stack.append(t.op)
        self.memo[start.name] = found
        return found


def _boundary(sink, index):
    """Tensors the optimizer's side takes from the rest of the graph on the
    way to sink.inputs[index]: [(tensor, direct)] where direct means the sink
    consumes it as is."""
    t = sink.inputs[index]
    if not _optimizer_side(t.op):
        return [(t, True)]
    out, seen, stack = [], {t.op.name}, [t.op]
    while stack:
        op = stack.pop()
        for x in op.inputs:
            if _optimizer_side(x.op):
                if x.op.name not in seen:
                    seen.add(x.op.name)
                    stack.append(x.op)
            else:
                out.append((x, False))
    return out


def _gradient_like(tensor):
    dtype = tensor.dtype
    return not dtype._is_ref_dtype and dtype.base_dtype in _NUMERIC


def _update_name(sink):
    """The optimizer update scope of a sink ("Adam/update_dense/kernel")."""
    return sink.name.rsplit("/", 1)[0] if _UPDATE_SCOPE.search(sink.name) \
        else sink.name


def _reroute(tensor, new_tensor, consumers):
    for op, index in consumers:
        try:
            op._update_input(index, new_tensor)
        except AttributeError as e:  # pragma: no cover - TF internals moved
            raise RuntimeError(
                "tfring.rewrite: this TensorFlow cannot rewire graph edges "
                "(Operation._update_input); wrap the optimizer with "
                "tfring.DistributedOptimizer instead") from e


def _rewrite_graph(graph, cfg):
    """Reroutes the gradients of `graph` in place; returns a RewriteReport.
    Editing edges of a built graph needs Operation._update_input, the one
    TensorFlow-internal call here (the mechanism of TF's own graph editor)."""
    if graph.finalized:
        raise RuntimeError(
            "tfring.rewrite: the graph is finalized (a MonitoredSession or "
            "Supervisor was created); call tfring.rewrite() before creating "
            "the session")
    report = RewriteReport()
    order = {op.name: i for i, op in enumerate(graph.get_operations())}
    is_gradient = _GradientOracle()
    # Gradient tensor name -> record, in discovery order.
    found = {}
    for sink, indices, sparse in _find_sinks(graph):
        for index in indices:
            for t, direct in _boundary(sink, index):
                if _already_reduced(t):
                    continue
                if not _gradient_like(t) or (not direct and not is_gradient(t)):
                    continue
                if not sparse:
                    kind = "dense"
                elif t.dtype.is_integer:
                    kind = "sparse_indices"
                else:
                    kind = "sparse_values"
                rec = found.get(t.name)
                if rec is None:
                    found[t.name] = rec = {"tensor": t, "kind": kind,
                                           "update": _update_name(sink)}
                elif rec["kind"] != kind:
                    raise RuntimeError(
                        f"tfring.rewrite: {t.name} reaches optimizer updates "
                        f"both as a {rec['kind']} and a {kind} gradient")
    # Gradients rerouted by an earlier call (a sparse one counted once).
    report.already_rewritten = len({
        t.name for sink, indices, _ in _find_sinks(graph)
        for index in indices for t, _ in _boundary(sink, index)
        if _already_reduced(t) and not t.dtype.is_integer})

    with graph.as_default(), graph.name_scope(SCOPE + "/"), \
            tf.control_dependencies(None):
        _reroute_gradients(found, order, cfg, report)
        if cfg.broadcast:
            _broadcast_initializers(graph, cfg.root_rank, report)
    return report


def _consumers(tensor):
    """The optimizer-side (and training kernel) inputs fed by `tensor`."""
    out = []
    for op in tensor.consumers():
        if not (_optimizer_side(op) or _APPLY_OP.match(op.type)):
            continue
        for i, x in enumerate(op.inputs):
            if x is tensor or x.name == tensor.name:
                out.append((op, i))
    return out


def _reroute_gradients(found, order, cfg, report):
    # Fuse in the order backprop produces gradients (op creation order), so
    # the first buckets can go on the wire while backprop continues.
    recs = sorted(found.values(), key=lambda r: order[r["tensor"].op.name])
    dense = [r for r in recs if r["kind"] == "dense"]
    limit = _fusion_bytes(cfg.fusion_threshold)
    by_name = {r["tensor"].name: r for r in dense}
    for run in _buckets([r["tensor"] for r in dense], limit):
        consumers = [_consumers(t) for t in run]
        reduced = _ops.grouped_allreduce(run, cfg.op,
                                         compression=cfg.compression)
        report.allreduce_ops.append(reduced[0].op.name)
        for t, r, cons in zip(run, reduced, consumers):
            _reroute(t, r, cons)
            rec = by_name[t.name]
            report.gradients.append(RewrittenGradient(
                t.name, rec["update"], "dense", _nbytes(t)))
    average = _ops._reduce_op_name(cfg.op) == "average"
    for rec in recs:
        if rec["kind"] == "dense":
            continue
        t = rec["tensor"]
        consumers = _consumers(t)
        if rec["kind"] == "sparse_values":
            values, ctx = cfg.compression.compress(t)
            raw = _ops.allgather(values)
            gathered = cfg.compression.decompress(raw, ctx)
            if average:
                gathered = gathered * tf.cast(1.0 / basics.size(), t.dtype)
        else:
            raw = gathered = _ops.allgather(t)
        report.allgather_ops.append(raw.op.name)
        _reroute(t, gathered, consumers)
        report.gradients.append(RewrittenGradient(
            t.name, rec["update"], rec["kind"], _nbytes(t)))


def _broadcast_initializers(graph, root_rank, report):
    """Makes each global variable's initializer assign root_rank's initial
    value, and builds (once per graph) the op broadcasting current values."""
    variables = graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)
    for v in variables:
        init = getattr(v, "initializer", None)
        if init is None or init.type not in (
                "AssignVariableOp", "Assign"):
            continue
        index = _input_indices(init, ("value",))
        if not index:
            continue
        value = init.inputs[index[0]]
        if _is_ours(value.op):
            continue
        if value.dtype.base_dtype not in _NUMERIC + (tf.bool,):
            continue
        b = _ops.broadcast(value, root_rank)
        _reroute(value, b, [(init, index[0])])
        report.broadcast_variables.append(v.op.name)
    existing = graph.get_collection(_BROADCAST_COLLECTION)
    if existing:
        report.broadcast_op = existing[0]
    elif variables:
        report.broadcast_op = _ops.broadcast_variables(
            [v for v in variables
             if v.dtype.base_dtype in _NUMERIC + (tf.bool,)], root_rank)
        graph.add_to_collection(_BROADCAST_COLLECTION, report.broadcast_op)


# ---------------------------------------------------- gradient reduction ----

def reduce_gradients(grads, op=Average, compression=Compression.none,
                     fusion_threshold=None, sparse_as_dense=False,
                     prescale_factor=1.0, postscale_factor=1.0):
    """Allreduces a list of gradients (None entries stay None), fused into
    RingGroupedAllreduce ops of at most `fusion_threshold` bytes. The list
    is bucketed from its end, since backprop produces the gradients of the
    last layers first. tf.IndexedSlices are allgathered (see
    tfring.allreduce) unless sparse_as_dense."""
    grads = list(grads)
    out = [None] * len(grads)
    dense = []
    scales = {"prescale_factor": prescale_factor,
              "postscale_factor": postscale_factor}
    for i, g in enumerate(grads):
        if g is None:
            continue
        if isinstance(g, tf.IndexedSlices) and not sparse_as_dense:
            out[i] = _ops.allreduce(g, op, compression=compression, **scales)
        else:
            dense.append((i, tf.convert_to_tensor(g)))
    dense.reverse()
    limit = _fusion_bytes(fusion_threshold)
    start = 0
    for run in _buckets([t for _, t in dense], limit):
        indices = [i for i, _ in dense[start:start + len(run)]]
        start += len(run)
        reduced = _ops.grouped_allreduce(run, op, compression=compression,
                                         **scales)
        for i, r in zip(indices, reduced):
            out[i] = r
    return out


def _numpy_of(value):
    if hasattr(value, "numpy"):
        return np.asarray(value.numpy())
    return np.asarray(value)


def broadcast_values(variables, root_rank=0, name="tfring.broadcast_values"):
    """Assigns root_rank's value to each variable (tf.Variable or Keras
    variable), eagerly and whatever the dtype: values travel as bytes,
    all in flight together. Every rank must pass variables of the same
    shapes and dtypes in the same order."""
    variables = list(variables)
    if not variables or basics.size() == 1:
        return
    pending = []
    for i, v in enumerate(variables):
        value = np.array(_numpy_of(v), order="C")  # keeps 0-d shapes
        raw = value.reshape(-1).view(np.uint8)
        handle = _core.broadcast_async(raw, name=f"{name}.{i}",
                                       root=int(root_rank))
        pending.append((v, value, handle))
    for v, value, handle in pending:
        raw = handle.wait()
        if basics.rank() != root_rank:
            v.assign(np.asarray(raw).view(value.dtype).reshape(value.shape))


def average_scalars(values, name="tfring.average_scalars"):
    """Averages a dict of Python numbers over ranks (same keys on every
    rank); returns a new dict of floats."""
    keys = sorted(values)
    if not keys or basics.size() == 1:
        return {k: float(values[k]) for k in keys}
    arr = np.array([float(values[k]) for k in keys], np.float64)
    avg = _core.allreduce(arr, op="average", name=name)
    return dict(zip(keys, (float(x) for x in avg)))


# -------------------------------------------------- tf.function rewrite ----

@dataclasses.dataclass
class _Config:
    op: object = Average
    compression: object = Compression.none
    fusion_threshold: object = None
    sparse_as_dense: bool = False
    root_rank: int = 0
    broadcast: bool = True
    on: str = "apply"


class _Context:
    """What one rewritten function saw while it was traced or run."""

    def __init__(self, cfg):
        self.cfg = cfg
        self.variables = []      # variables whose gradients were reduced
        self.optimizers = []     # optimizers whose apply was intercepted
        self.reduced = 0
        self.tape_calls = 0

    def note(self, optimizer, variables):
        if optimizer is not None and all(o is not optimizer
                                         for o in self.optimizers):
            self.optimizers.append(optimizer)
        known = {id(v) for v in self.variables}
        for v in variables:
            if v is not None and id(v) not in known:
                self.variables.append(v)
                known.add(id(v))


_local = threading.local()


def _active():
    stack = getattr(_local, "stack", None)
    return stack[-1] if stack else None


def _depth():
    return getattr(_local, "depth", 0)


@contextlib.contextmanager
def _activated(ctx):
    stack = _local.__dict__.setdefault("stack", [])
    stack.append(ctx)
    try:
        yield ctx
    finally:
        stack.pop()


@contextlib.contextmanager
def _nested():
    _local.depth = _depth() + 1
    try:
        yield
    finally:
        _local.depth -= 1


def _intercept_apply(orig, unpack):
    """Wraps an optimizer apply method: inside an active rewrite context,
    the outermost call reduces its gradients before the original runs."""

    @functools.wraps(orig)
    def apply(self, *args, **kwargs):
        ctx = _active()
        if ctx is None:
            return orig(self, *args, **kwargs)
        if _depth() > 0 or ctx.cfg.on != "apply":
            with _nested():
                return orig(self, *args, **kwargs)
        grads, variables, rebuild = unpack(*args, **kwargs)
        grads = reduce_gradients(grads, ctx.cfg.op, ctx.cfg.compression,
                                 ctx.cfg.fusion_threshold,
                                 ctx.cfg.sparse_as_dense)
        ctx.reduced += sum(g is not None for g in grads)
        ctx.note(self, variables)
        new_args, new_kwargs = rebuild(grads)
        with _nested():
            return orig(self, *new_args, **new_kwargs)

    apply._tfring_original = orig
    return apply


def _unpack_grads_and_vars(grads_and_vars, *args, **kwargs):
    pairs = list(grads_and_vars)
    grads = [g for g, _ in pairs]
    variables = [v for _, v in pairs]

    def rebuild(new):
        return (list(zip(new, variables)), *args), kwargs
    return grads, variables, rebuild


def _unpack_grads_vars(grads, trainable_variables=None, *args, **kwargs):
    grads = list(grads)
    variables = (list(trainable_variables)
                 if trainable_variables is not None else [])

    def rebuild(new):
        return (new, trainable_variables, *args), kwargs
    return grads, variables, rebuild


def _patch(cls, name, unpack):
    orig = getattr(cls, name, None)
    if orig is None or getattr(orig, "_tfring_original", None) is not None:
        return
    setattr(cls, name, _intercept_apply(orig, unpack))


def _intercept_gradient(orig):
    @functools.wraps(orig)
    def gradient(self, target, sources, *args, **kwargs):
        result = orig(self, target, sources, *args, **kwargs)
        ctx = _active()
        if ctx is None or _depth() > 0:
            return result
        ctx.tape_calls += 1
        if ctx.cfg.on != "tape":
            return result
        flat = tf.nest.flatten(result)
        reduced = reduce_gradients(flat, ctx.cfg.op, ctx.cfg.compression,
                                   ctx.cfg.fusion_threshold,
                                   ctx.cfg.sparse_as_dense)
        ctx.reduced += sum(g is not None for g in reduced)
        ctx.note(None, [s for s, g in zip(tf.nest.flatten(sources), reduced)
                        if g is not None])
        return tf.nest.pack_sequence_as(result, reduced)

    gradient._tfring_original = orig
    return gradient


def _install_interceptors():
    """Patches optimizer apply methods once per class (idempotent; the
    patched methods behave as before outside a rewritten function)."""
    if getattr(tf.GradientTape.gradient, "_tfring_original", None) is None:
        tf.GradientTape.gradient = _intercept_gradient(tf.GradientTape.gradient)
    _patch(tf.compat.v1.train.Optimizer, "apply_gradients",
           _unpack_grads_and_vars)
    keras = sys.modules.get("keras")
    if keras is None:
        try:
            import keras
        except ImportError:
            keras = None
    if keras is not None and hasattr(keras, "optimizers"):
        base = keras.optimizers.Optimizer
        _patch(base, "apply_gradients", _unpack_grads_and_vars)
        _patch(base, "apply", _unpack_grads_vars)
        lso = getattr(keras.optimizers, "LossScaleOptimizer", None)
        if lso is not None and "apply" in vars(lso):
            _patch(lso, "apply", _unpack_grads_vars)
    tf_keras = sys.modules.get("tf_keras")
    if tf_keras is not None:
        for cls in (getattr(tf_keras.optimizers, "Optimizer", None),
                    getattr(getattr(tf_keras.optimizers, "legacy", None),
                            "Optimizer", None)):
            if cls is not None:
                _patch(cls, "apply_gradients", _unpack_grads_and_vars)


def _optimizer_variables(opt):
    variables = getattr(opt, "variables", None)
    if callable(variables):  # tf.compat.v1 and tf_keras legacy optimizers
        variables = variables()
    return list(variables or [])


class RewrittenFunction:
    """A training step whose optimizer updates get ring-allreduced
    gradients (see tfring.rewrite). Calls like the function it wraps."""

    def __init__(self, fn, cfg):
        self._cfg = cfg
        self._ctx = _Context(cfg)
        self._synced = False
        python_fn = getattr(fn, "python_function", None)
        self._is_tf_function = python_fn is not None
        if python_fn is None:
            python_fn = fn
        self.python_function = python_fn
        functools.update_wrapper(self, python_fn)
        if self._is_tf_function:
            if getattr(fn, "_jit_compile", None):
                raise NotImplementedError(
                    "tfring.rewrite: the step is compiled with XLA "
                    "(jit_compile=True), which cannot run tfring's "
                    "collectives; jit-compile a function called from the "
                    "step instead")
            autograph = getattr(fn, "_autograph", True)
            body = python_fn
            if autograph:
                try:
                    body = tf.autograph.to_graph(python_fn)
                except Exception:  # noqa: BLE001 - fall back to tracing as is
                    body = python_fn
            kwargs = {"input_signature": fn.input_signature,
                      "autograph": False,
                      "reduce_retracing": getattr(fn, "_reduce_retracing",
                                                  False)}
            self._fn = tf.function(self._wrap(body), **kwargs)
        else:
            self._fn = self._wrap(python_fn)

    def _wrap(self, body):
        ctx = self._ctx

        @tf.autograph.experimental.do_not_convert
        def step(*args, **kwargs):
            _install_interceptors()
            with _activated(ctx):
                result = body(*args, **kwargs)
            if ctx.reduced == 0 and ctx.tape_calls and ctx.cfg.on == "apply":
                warnings.warn(
                    "tfring.rewrite: the step computed gradients but no "
                    "optimizer apply was seen, so nothing was allreduced; "
                    "if it updates variables by hand, use "
                    "tfring.rewrite(step, on='tape')", stacklevel=2)
            return result

        return step

    @property
    def report(self):
        """(variables whose gradients are reduced, optimizers seen)."""
        return list(self._ctx.variables), list(self._ctx.optimizers)

    def _state(self):
        variables = list(self._ctx.variables)
        for opt in self._ctx.optimizers:
            variables += _optimizer_variables(opt)
        return variables

    def _broadcast_ready(self):
        """Broadcasts the state that has values now; returns the rest
        (variables a trace created, initialized when the step first runs)."""
        ready, later = [], []
        for v in self._state():
            try:
                ok = np.shape(_numpy_of(v)) == tuple(v.shape)
            except Exception:  # noqa: BLE001 - not initialized yet
                ok = False
            (ready if ok else later).append(v)
        # Every rank must submit the same broadcasts: agree on the split.
        n = len(ready)
        most, least = _core.allreduce(np.array([n, -n], np.int64), op="max",
                                      name="tfring.rewrite.ready")
        if most != -least:
            later, ready = self._state(), []
        broadcast_values(ready, self._cfg.root_rank,
                         name="tfring.rewrite.broadcast")
        return later

    def _first_call(self, args, kwargs):
        """Broadcasts the step's state from root_rank around its first run:
        before it when the state exists after tracing, else right after."""
        if not tf.executing_eagerly():
            # Traced by an enclosing tf.function: broadcast now, at trace
            # time, which is before the enclosing function first runs.
            result = self._fn(*args, **kwargs)
            with tf.init_scope():
                later = self._broadcast_ready()
            # Optimizer state created by the trace starts equal everywhere.
            model = {id(v) for v in self._ctx.variables}
            later = [v for v in later if id(v) in model]
            if later:
                warnings.warn(
                    f"tfring.rewrite: {len(later)} variables are created "
                    f"inside the step and were not broadcast; build the "
                    f"model before the first step", stacklevel=3)
            return result
        if self._is_tf_function:
            self._fn.get_concrete_function(*args, **kwargs)  # traces
            later = self._broadcast_ready()
            result = self._fn(*args, **kwargs)
        else:
            # An eager step: what it updates is known after one run.
            result = self._fn(*args, **kwargs)
            later = self._state()
        broadcast_values(later, self._cfg.root_rank,
                         name="tfring.rewrite.broadcast_late")
        return result

    def get_concrete_function(self, *args, **kwargs):
        if not self._is_tf_function:
            raise TypeError("tfring.rewrite: the wrapped step is not a "
                            "tf.function")
        return self._fn.get_concrete_function(*args, **kwargs)

    @tf.autograph.experimental.do_not_convert
    def __call__(self, *args, **kwargs):
        if self._synced:
            return self._fn(*args, **kwargs)
        if not self._cfg.broadcast or basics.size() == 1:
            self._synced = True
            return self._fn(*args, **kwargs)
        result = self._first_call(args, kwargs)
        self._synced = True
        return result

    def __get__(self, instance, owner):
        if instance is None:
            return self
        return functools.partial(self.__call__, instance)


# ------------------------------------------------------------ entry point ----

def rewrite(target=None, *, op=Average, compression=Compression.none,
            fusion_threshold=None, sparse_as_dense=False, root_rank=0,
            broadcast=True, on="apply"):
    """Makes an existing training program data-parallel.

    target:
      * None or a tf.Graph (tf.compat.v1): rewrites the graph (default: the
        default graph) in place and returns a RewriteReport. Call it after
        building the training ops and before creating the session.
      * a tf.function or Python function (a TF2 training step; also usable
        as a decorator, `@tfring.rewrite` above or below `@tf.function`):
        returns a RewrittenFunction whose optimizer updates receive
        allreduced gradients; its first call broadcasts the updated
        variables and optimizer state from root_rank.

    op: tfring.Average (default) or tfring.Sum over ranks.
    compression: tfring.Compression.none or .fp16 on the wire.
    fusion_threshold: bytes per fused allreduce op (default: the engine's
        TFRING_FUSION_THRESHOLD, 64 MiB).
    sparse_as_dense (functions only): densify tf.IndexedSlices gradients
        and allreduce them instead of allgathering.
    broadcast: graphs: make variable initializers assign root_rank's
        values; functions: broadcast state before the first step.
    on (functions only): "apply" reduces gradients where an optimizer
        applies them; "tape" reduces every GradientTape.gradient result
        (for steps that update variables by hand).
    """
    if _ops._reduce_op_name(op) not in ("sum", "average"):
        raise ValueError("tfring.rewrite: gradients are averaged or summed "
                         "over ranks (op=tfring.Average or tfring.Sum)")
    if on not in ("apply", "tape"):
        raise ValueError(f"tfring.rewrite: on must be 'apply' or 'tape', "
                         f"got {on!r}")
    cfg = _Config(op=op, compression=compression,
                  fusion_threshold=fusion_threshold,
                  sparse_as_dense=sparse_as_dense, root_rank=int(root_rank),
                  broadcast=broadcast, on=on)
    if not basics.is_initialized():
        basics.init()
    if target is None or isinstance(target, tf.Graph):
        if target is None:
            if tf.executing_eagerly():
                raise RuntimeError(
                    "tfring.rewrite(): no graph to rewrite (TensorFlow is "
                    "executing eagerly). For a TF2 training step, pass the "
                    "step: step = tfring.rewrite(step), or decorate it with "
                    "@tfring.rewrite; for a tf.compat.v1 graph, call it "
                    "after building the graph, inside graph mode")
            target = tf.compat.v1.get_default_graph()
        return _rewrite_graph(target, cfg)
    if isinstance(target, RewrittenFunction):
        return target
    if callable(target):
        return RewrittenFunction(target, cfg)
    raise TypeError(f"tfring.rewrite: expected a tf.Graph, a tf.function or "
                    f"a function, got {type(target).__name__}")


class _CallableModule(types.ModuleType):
    """`import tfring.rewrite` binds the name tfring.rewrite to this module;
    calling the module calls rewrite(), so `tfring.rewrite(...)` works
    however the name was bound."""

    def __call__(self, *args, **kwargs):
        return rewrite(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
