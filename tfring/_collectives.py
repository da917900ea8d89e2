"""The layer under tfring/ops.py: reduce-op names, cross-rank naming, the
XLA checks, `run_op` (which creates one collective op), and the raw
collectives that tfring's op gradients (tfring/_op_grads.py) and Adasum
(tfring/adasum.py) are built from. These take a process-set id, not a
ProcessSet, and know nothing of Adasum; tfring/ops.py adds the public
arguments (process_set=, compression=, average=, ...) and Adasum on top.
See tfring/ops.py for how collectives are named and ordered.
"""

import re
import warnings
import weakref

import tensorflow as tf
from tensorflow.python.framework import func_graph as _func_graph
from tensorflow.python.ops import control_flow_util as _cf_util

from tfring import Adasum, Average, Max, Min, Product, Sum
from tfring._op_lib import lib, xla_build_state
from tfring.compression import Compression
from tfring.compression.wire import (
    from_wire_output,
    to_wire_input,
    wire_dtype_of,
)
from tfring.process_sets import _rank_size

# ------------------------------------------------------------ reduce ops ----

REDUCE_OP_NAMES = {Sum: "sum", Average: "average", Min: "min", Max: "max",
                    Product: "product", Adasum: "adasum"}


def reduce_op_name(op):
    """Sum/Average/... (ints), their names ("sum"), or None (Average)."""
    if op is None:
        return "average"
    if isinstance(op, bytes):
        op = op.decode()
    if isinstance(op, str):
        if op.lower() in REDUCE_OP_NAMES.values():
            return op.lower()
    elif not isinstance(op, bool) and op in REDUCE_OP_NAMES:
        return REDUCE_OP_NAMES[op]
    raise ValueError(f"tfring: unknown reduce op {op!r}; use tfring.Sum, "
                     f"Average, Min, Max, Product or Adasum")


def handle_average(op, average):
    """Horovod's deprecated `average=`: True is Average, False is Sum; it may
    not be combined with `op`."""
    if average is None:
        return Average if op is None else op
    if op is not None:
        raise ValueError("tfring: the op parameter supersedes average; "
                         "give only one of them")
    warnings.warn("Parameter `average` has been replaced with `op` and will "
                  "be removed in v1.0", DeprecationWarning, stacklevel=3)
    return Average if average else Sum


# ---------------------------------------------------------------- naming ----

_GRAPH_UID = re.compile(r"_\d+(?=_|$)")
# Outermost traced function graph -> tensor names taken in it.
_names_in_function = weakref.WeakKeyDictionary()
_INVALID_SCOPE_CHARS = re.compile(r"[^A-Za-z0-9_.\-/]")


def _func_graph_chain(graph):
    """The FuncGraphs from `graph` out to the outermost one (may be empty)."""
    chain = []
    while isinstance(graph, _func_graph.FuncGraph):
        chain.append(graph)
        graph = getattr(graph, "outer_graph", None)
    return chain


def _function_tensor_name(chain, node_name):
    """Name of an op built in a traced function: deterministic across ranks
    and unique across the outermost traced function and its nested graphs.
    A function built into a tf.compat.v1 graph (tf.cond there makes one per
    branch) is prefixed with that graph's name scope, which is unique in it
    ("cond_1")."""
    outermost = chain[-1]
    parts = []
    outer = getattr(outermost, "outer_graph", None)
    if outer is not None and outer.get_name_scope():
        parts.append(outer.get_name_scope())
    parts += [_GRAPH_UID.sub("", g.name) or "fn" for g in reversed(chain)]
    used = _names_in_function.setdefault(outermost, set())
    base = "/".join(parts + [node_name])
    name, i = base, 1
    while name in used:
        name, i = f"{base}_{i}", i + 1
    used.add(name)
    return name


def in_xla_context(graph):
    try:
        return _cf_util.GraphOrParentsInXlaContext(graph)
    except Exception:  # noqa: BLE001 - private API; never fail because of it
        return False


_xla_ready = set()  # op types checked compilable by XLA in this process
# The ops with XLA kernels (csrc/tf/xla_ops.cc).
_XLA_OPS = frozenset({"RingAllreduce", "RingGroupedAllreduce", "RingAllgather",
                      "RingBroadcast", "RingReducescatter"})
_XLA_GPU_VISIBLE = None  # set on first use: whether TF sees a GPU


def _xla_kernel_devices(op_type):
    from tensorflow.python.framework import kernels

    return {k.device_type
            for k in kernels.get_registered_kernels_for_op(op_type).kernel}


def check_xla(op_type, tensor):
    """Raises at trace time, naming the op and what to change, where XLA
    cannot compile it; see docs/xla.md. XLA registers its compilation
    kernels once per process, at the first XLA compilation: ops loaded
    later (tfring imported after it) never get any."""
    global _XLA_GPU_VISIBLE
    if op_type not in _XLA_OPS:
        raise NotImplementedError(
            f"tfring: {op_type} cannot be compiled by XLA "
            f"(tf.function(jit_compile=True)): only "
            f"{', '.join(sorted(_XLA_OPS))} have XLA kernels. Call it from a "
            f"function without jit_compile.")
    if _XLA_GPU_VISIBLE is None:
        _XLA_GPU_VISIBLE = bool(tf.config.list_logical_devices("GPU"))
    if op_type in _xla_ready and not _XLA_GPU_VISIBLE:
        return
    built, why = xla_build_state()
    if not built:
        raise NotImplementedError(
            f"tfring: {op_type} cannot be compiled by XLA "
            f"(tf.function(jit_compile=True)): tfring's op library was built "
            f"without XLA support ({why}). Rebuild tfring against a "
            f"TensorFlow that ships the tf2xla headers, or call the "
            f"collectives from a function without jit_compile.")
    devices = _xla_kernel_devices(op_type)
    if not any(d.endswith("_JIT") for d in devices):
        if any(d.endswith("_JIT") for d in _xla_kernel_devices("Identity")):
            raise NotImplementedError(
                f"tfring: {op_type} cannot be compiled by XLA in this "
                f"process: tfring's op library was loaded after XLA's first "
                f"compilation (which tracing any jit_compile function "
                f"starts), and XLA takes no new ops after it. Call "
                f"tfring.init() (or import tfring.ops) after importing "
                f"TensorFlow and before tracing the first jit-compiled "
                f"function.")
        return  # XLA's registry is still open: it will take our kernels
    device = getattr(tensor, "device", "") or ""
    if (_XLA_GPU_VISIBLE and "XLA_GPU_JIT" not in devices
            and "CPU" not in device.upper()):
        raise NotImplementedError(
            f"tfring: {op_type} cannot be compiled by XLA for the GPU: "
            f"tfring's op library has no GPU kernels (see "
            f"_tfring_ops.so.gpu next to it). Rebuild tfring with CUDA "
            f"(TFRING_TF_GPU), place the step on the CPU "
            f"(with tf.device('/CPU:0')), or compile without jit_compile.")
    _xla_ready.add(op_type)


def run_op(op_fn, op_type, name, ignore_name_scope=False, **attrs):
    """Creates one collective op with its cross-rank name; returns outputs."""
    if tf.executing_eagerly():
        return op_fn(tensor_name=name or "", **attrs)
    graph = tf.compat.v1.get_default_graph()
    if ignore_name_scope:
        with graph.name_scope(None):  # the root scope
            return run_op(op_fn, op_type, name, **attrs)
    if in_xla_context(graph):
        inputs = attrs.get("tensors") or [attrs.get("tensor")]
        check_xla(op_type, inputs[0])
        if attrs.get("process_set_id", 0):
            raise NotImplementedError(
                f"tfring: {op_type} on process set {attrs['process_set_id']} "
                f"cannot be compiled by XLA: under jit_compile collectives "
                f"run on every rank only. Call it from a function without "
                f"jit_compile.")
    # The user's name, made a valid node name ("grad:0" -> "grad_0").
    scope_name = _INVALID_SCOPE_CHARS.sub("_", name or "").lstrip("_-/") or op_type
    with tf.name_scope(scope_name) as scope:  # reserves a unique node name
        pass
    chain = _func_graph_chain(graph)
    tensor_name = _function_tensor_name(chain, scope[:-1]) if chain else ""
    outputs = op_fn(tensor_name=tensor_name, name=scope, **attrs)
    op = (outputs[0] if isinstance(outputs, (list, tuple)) else outputs).op
    acd = getattr(graph, "experimental_acd_manager", None)
    if chain and acd is not None and hasattr(acd, "run_independently"):
        acd.run_independently(op)
    return outputs


def _inline_consumers(outputs):
    """In a graph, passes a collective's outputs through RingOutputs (a
    synchronous, copy-free op; csrc/tf/outputs.cc) so that TF runs their
    consumers inline when the collective finishes, instead of scheduling
    each consumer on its thread pool. Eager mode and XLA: unchanged."""
    if tf.executing_eagerly() or len(outputs) < 2:
        return outputs
    if in_xla_context(tf.compat.v1.get_default_graph()):
        return outputs
    return lib.ring_outputs(outputs)



# ----------------------------------------------------------- collectives ----
# Raw collectives on process set `ps_id` (0: every rank).

def wire_of(compression):
    """The 16-bit wire `compression` asks the op for (wire.py), or None
    where the op cannot take it: under XLA the custom call has no wire, and
    the compressor casts around the collective instead."""
    wire = wire_dtype_of(compression)
    if wire and not tf.executing_eagerly() and in_xla_context(
            tf.compat.v1.get_default_graph()):
        return None
    return wire


def _wire_attrs(wire):
    return {"wire_dtype": wire} if wire else {}


def allreduce(tensor, op="average", name=None, prescale_factor=1.0,
              postscale_factor=1.0, ignore_name_scope=False, ps_id=0,
              wire=None):
    """A dense allreduce (no Adasum). `wire` ("float16", "bfloat16"):
    16-bit words between ranks, float32 sums (float64 goes as float32)."""
    tensor, back = to_wire_input(tf.convert_to_tensor(tensor), wire)
    out = run_op(lib.ring_allreduce, "RingAllreduce", name,
                 ignore_name_scope, tensor=tensor,
                 reduce_op=reduce_op_name(op),
                 prescale_factor=float(prescale_factor),
                 postscale_factor=float(postscale_factor),
                 process_set_id=ps_id, **_wire_attrs(wire))
    return from_wire_output(out, back)


def check_indexed_slices_op(op_name):
    if op_name not in ("sum", "average"):
        raise NotImplementedError(
            f"tfring: allreduce of a tf.IndexedSlices supports Sum and "
            f"Average only, not {op_name}; densify it first "
            f"(tf.convert_to_tensor) or use sparse_as_dense=True")


def _scale_gathered_values(values, op_name, scale, size):
    """Scales allgathered IndexedSlices values: Average divides by the number
    of ranks with true division (integers become floating, as in Horovod);
    an integer Sum with a scale other than 1 is scaled in float64 and
    truncated toward zero, as the dense integer collectives do."""
    if op_name == "average":
        if values.dtype.is_integer or values.dtype.is_bool:
            values = tf.math.truediv(values, tf.cast(size, values.dtype))
            return values * tf.constant(scale, values.dtype) if scale != 1.0 else values
        scale = scale / size
    if scale == 1.0:
        return values
    if values.dtype.is_integer:
        return tf.cast(tf.cast(values, tf.float64) * scale, values.dtype)
    return values * tf.constant(scale, values.dtype)



def allreduce_indexed_slices(slices, op_name, name, compression, scale,
                             ignore_name_scope=False, ps_id=0):
    """Allreduce of a tf.IndexedSlices: its values and indices are
    allgathered, not densified (see tfring.ops.allreduce)."""
    check_indexed_slices_op(op_name)
    values, ctx = compression.compress(slices.values)
    values = allgather(values, name=f"{name}.values" if name else None,
                       ignore_name_scope=ignore_name_scope, ps_id=ps_id)
    indices = allgather(slices.indices,
                        name=f"{name}.indices" if name else None,
                        ignore_name_scope=ignore_name_scope, ps_id=ps_id)
    size = _rank_size(ps_id)[1]
    values = _scale_gathered_values(compression.decompress(values, ctx),
                                    op_name, scale, size)
    return tf.IndexedSlices(values, indices, dense_shape=slices.dense_shape)


def grouped_allreduce(tensors, op_name, name=None, prescale_factor=1.0,
                      postscale_factor=1.0, ignore_name_scope=False, ps_id=0,
                      compression=Compression.none):
    """Allreduces a list of tensors as one op (tf.IndexedSlices entries are
    allgathered, each on its own); no Adasum."""
    results = [None] * len(tensors)
    dense, dense_idx, ctxs = [], [], []
    wire = wire_of(compression)
    for i, t in enumerate(tensors):
        if isinstance(t, tf.IndexedSlices):
            results[i] = allreduce_indexed_slices(
                t, op_name, f"{name}.{i}" if name else None, compression,
                prescale_factor * postscale_factor, ignore_name_scope, ps_id)
            continue
        if wire:  # narrowed in the ring; float64 travels as float32
            c, back = to_wire_input(tf.convert_to_tensor(t), wire)
            ctx = (from_wire_output, back)
        else:
            c, ctx = compression.compress(tf.convert_to_tensor(t))
            ctx = (compression.decompress, ctx)
        dense.append(c)
        dense_idx.append(i)
        ctxs.append(ctx)
    if dense:
        reduced = run_op(lib.ring_grouped_allreduce, "RingGroupedAllreduce",
                         name, ignore_name_scope, tensors=dense,
                         reduce_op=op_name,
                         prescale_factor=float(prescale_factor),
                         postscale_factor=float(postscale_factor),
                         process_set_id=ps_id, **_wire_attrs(wire))
        reduced = _inline_consumers(reduced)
        for i, r, (undo, ctx) in zip(dense_idx, reduced, ctxs):
            results[i] = undo(r, ctx)
    return results


def allgather(tensor, name=None, ignore_name_scope=False, ps_id=0):
    return run_op(lib.ring_allgather, "RingAllgather", name,
                  ignore_name_scope, tensor=tf.convert_to_tensor(tensor),
                  process_set_id=ps_id)


def alltoall(tensor, splits=None, name=None, ignore_name_scope=False, ps_id=0):
    """(output, received splits); `splits` None splits evenly."""
    tensor = tf.convert_to_tensor(tensor)
    splits_t = (tf.constant([], tf.int32) if splits is None
                else tf.cast(tf.convert_to_tensor(splits), tf.int32))
    with tf.device("/cpu:0"):
        return run_op(lib.ring_alltoall, "RingAlltoall", name,
                      ignore_name_scope, tensor=tensor, splits=splits_t,
                      process_set_id=ps_id)
