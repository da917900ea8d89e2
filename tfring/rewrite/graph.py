"""The tf.compat.v1 graph rewrite: walks a built training graph, reroutes the
gradients that reach optimizer updates through RingGroupedAllreduce (dense)
and RingAllgather (sparse) ops, and makes variable initializers broadcast
root_rank's values.

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
"""

import re

import tensorflow as tf

from tfring import basics
from tfring import _collectives
from tfring import ops as _ops
from tfring.compression import Compression
from tfring.compression.powersgd import is_powersgd
from tfring.compression.powersgd_step import reduce_step
from tfring.rewrite.collectives import _buckets, _fusion_bytes, _nbytes
from tfring.rewrite.report import RewriteReport, RewrittenGradient

# Name scope of every op the rewrite adds to a graph: ops there are
# recognized as already rewritten (idempotency).
SCOPE = "tfring_rewrite"
# Graph collection holding the broadcast op of a rewritten graph.
_BROADCAST_COLLECTION = "tfring_rewrite_broadcast"

_NUMERIC = (tf.float16, tf.bfloat16, tf.float32, tf.float64, tf.int32,
            tf.int64, tf.uint8, tf.int8)


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
    compression = cfg.compression
    if is_powersgd(compression):
        # In the optimizer's update order (the order the gradients were
        # found in), which positions PowerSGD's random Q's.
        _reroute_powersgd([r for r in found.values() if r["kind"] == "dense"],
                          cfg, report)
        dense, compression = [], Compression.none
    for run in _buckets([r["tensor"] for r in dense], limit):
        consumers = [_consumers(t) for t in run]
        reduced = _ops.grouped_allreduce(run, cfg.op,
                                         compression=compression)
        report.allreduce_ops.append(reduced[0].op.name)
        for t, r, cons in zip(run, reduced, consumers):
            _reroute(t, r, cons)
            rec = by_name[t.name]
            report.gradients.append(RewrittenGradient(
                t.name, rec["update"], "dense", _nbytes(t)))
    average = _collectives.reduce_op_name(cfg.op) == "average"
    for rec in recs:
        if rec["kind"] == "dense":
            continue
        t = rec["tensor"]
        consumers = _consumers(t)
        if rec["kind"] == "sparse_values":
            values, ctx = compression.compress(t)
            raw = _ops.allgather(values)
            gathered = compression.decompress(raw, ctx)
            if average:
                gathered = gathered * tf.cast(1.0 / basics.size(), t.dtype)
        else:
            raw = gathered = _ops.allgather(t)
        report.allgather_ops.append(raw.op.name)
        _reroute(t, gathered, consumers)
        report.gradients.append(RewrittenGradient(
            t.name, rec["update"], rec["kind"], _nbytes(t)))


def _reroute_powersgd(dense, cfg, report):
    """Every dense gradient through Compression.powersgd at once, its state
    keyed by the name of the optimizer update the gradient feeds. The
    compressor's variables join the graph's global variables, so the
    initializer the program runs creates them."""
    if not dense:
        return
    tensors = [r["tensor"] for r in dense]
    consumers = [_consumers(t) for t in tensors]
    reduced = reduce_step(cfg.compression, tensors,
                          [r["update"] for r in dense], cfg.op,
                          name="powersgd")
    for t, r, cons, rec in zip(tensors, reduced, consumers, dense):
        _reroute(t, r, cons)
        report.gradients.append(RewrittenGradient(
            t.name, rec["update"], "dense", _nbytes(t)))
    report.allreduce_ops.append(reduced[0].op.name)


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
