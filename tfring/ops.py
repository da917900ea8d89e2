"""TensorFlow collectives: loads the op library (_tfring_ops.so), wraps its
ops (RingAllreduce, RingGroupedAllreduce, RingAllgather, RingBroadcast,
RingReducescatter) and registers their gradients.

Naming. Ranks match tensors by name, so every collective gets one that is the
same on every rank:
  * eager: the user's `name`, else the op type (eager ops run one at a time
    per thread, so ranks issuing the same calls in the same order line up;
    a per-call counter would instead grow TF's eager kernel cache forever);
  * tf.compat.v1 graphs: the node name (unique in its graph);
  * tf.function: the traced function's name plus the node name, made unique
    across the function and every branch/body graph nested in it (node names
    repeat between such graphs; their uid suffixes are stripped because they
    count graphs built so far in this process, which may differ by rank).

Ordering. The ops are stateful (never merged, folded or pruned). Inside
tf.function TF would also chain every stateful op in program order; ours are
marked to run independently instead, so all of a step's collectives can be
in flight together and the engine fuses them.
"""

import os
import re
import weakref

import tensorflow as tf
from tensorflow.python.framework import func_graph as _func_graph
from tensorflow.python.ops import control_flow_util as _cf_util

from tfring import Average, Max, Min, Product, Sum, basics
from tfring.compression import Compression

__all__ = [
    "Average", "Compression", "Max", "Min", "Product", "Sum", "allgather",
    "allreduce", "broadcast", "broadcast_variables", "grouped_allreduce",
    "reducescatter",
]

_LIB_FILE = "_tfring_ops.so"
# Our Python runs as written inside tf.function, never rewritten by autograph.
_no_autograph = tf.autograph.experimental.do_not_convert
_VERSION_FILE = _LIB_FILE + ".tfversion"


# --------------------------------------------------------------- loading ----

def _version_mismatch_message(built, installed):
    return (
        f"tfring's op library was built against TensorFlow {built} but "
        f"{installed} is installed; reinstall tfring: pip install "
        f"--no-build-isolation --force-reinstall --no-deps tfring "
        f"(or from a checkout: pip install --no-build-isolation "
        f"--force-reinstall --no-deps .)")


def _check_version(built, installed):
    if built != installed:
        raise ImportError(_version_mismatch_message(built, installed))


def _load_library():
    here = os.path.dirname(os.path.abspath(__file__))
    path = os.path.join(here, _LIB_FILE)
    if not os.path.exists(path):
        raise ImportError(
            f"tfring was built without its TensorFlow op library ({path} is "
            f"missing): TensorFlow was not importable when tfring was built. "
            f"Install TensorFlow first, then reinstall tfring: pip install "
            f"--no-build-isolation --force-reinstall --no-deps tfring")
    try:
        with open(os.path.join(here, _VERSION_FILE)) as f:
            built = f.read().strip()
    except OSError:
        built = "an unknown version"
    # Checked before loading: a library built for another TensorFlow fails
    # with undefined symbols at best.
    _check_version(built, tf.__version__)
    return tf.load_op_library(path)


_lib = _load_library()


# ------------------------------------------------------------ reduce ops ----

_REDUCE_OP_NAMES = {Sum: "sum", Average: "average", Min: "min", Max: "max",
                    Product: "product"}


def _reduce_op_name(op):
    """Sum/Average/... (ints), their names ("sum"), or None (Average)."""
    if op is None:
        return "average"
    if isinstance(op, bytes):
        op = op.decode()
    if isinstance(op, str):
        if op.lower() in _REDUCE_OP_NAMES.values():
            return op.lower()
    elif not isinstance(op, bool) and op in _REDUCE_OP_NAMES:
        return _REDUCE_OP_NAMES[op]
    raise ValueError(f"tfring: unknown reduce op {op!r}; use tfring.Sum, "
                     f"Average, Min, Max or Product")


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


def _in_xla_context(graph):
    try:
        return _cf_util.GraphOrParentsInXlaContext(graph)
    except Exception:  # noqa: BLE001 - private API; never fail because of it
        return False


_XLA_FILE = _LIB_FILE + ".xla"
_xla_ready = set()  # op types checked compilable by XLA in this process
_XLA_GPU_VISIBLE = None  # set on first use: whether TF sees a GPU


def _xla_build_state():
    """(built with XLA kernels?, why) from the build's _tfring_ops.so.xla."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), _XLA_FILE)
    try:
        with open(path) as f:
            state = f.read().strip()
    except OSError:
        return False, "this build predates tfring's XLA support"
    on, _, why = state.partition(": ")
    return on == "on", why


def _xla_kernel_devices(op_type):
    from tensorflow.python.framework import kernels

    return {k.device_type
            for k in kernels.get_registered_kernels_for_op(op_type).kernel}


def _check_xla(op_type, tensor):
    """Raises at trace time, naming the op and what to change, where XLA
    cannot compile it; see docs/xla.md. XLA registers its compilation
    kernels once per process, at the first XLA compilation: ops loaded
    later (tfring imported after it) never get any."""
    global _XLA_GPU_VISIBLE
    if _XLA_GPU_VISIBLE is None:
        _XLA_GPU_VISIBLE = bool(tf.config.list_logical_devices("GPU"))
    if op_type in _xla_ready and not _XLA_GPU_VISIBLE:
        return
    built, why = _xla_build_state()
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


def _run_op(op_fn, op_type, name, **attrs):
    """Creates one collective op with its cross-rank name; returns outputs."""
    if tf.executing_eagerly():
        return op_fn(tensor_name=name or "", **attrs)
    graph = tf.compat.v1.get_default_graph()
    if _in_xla_context(graph):
        inputs = attrs.get("tensors") or [attrs.get("tensor")]
        _check_xla(op_type, inputs[0])
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


# ----------------------------------------------------------- collectives ----

def _allreduce(tensor, op="average", name=None, prescale_factor=1.0,
               postscale_factor=1.0):
    return _run_op(_lib.ring_allreduce, "RingAllreduce", name, tensor=tensor,
                   reduce_op=_reduce_op_name(op),
                   prescale_factor=float(prescale_factor),
                   postscale_factor=float(postscale_factor))


@_no_autograph
def allreduce(tensor, op=Average, name=None, compression=Compression.none,
              prescale_factor=1.0, postscale_factor=1.0):
    """Reduces `tensor` across all ranks; every rank gets
    `postscale_factor * op(prescale_factor * tensor)`. `op` is one of
    Sum, Average, Min, Max, Product.

    A tf.IndexedSlices is allgathered (values and indices), not densified:
    the result is an IndexedSlices holding every rank's rows (scaled by
    1/size for Average). Only Sum and Average apply to it.
    """
    op_name = _reduce_op_name(op)
    if isinstance(tensor, tf.IndexedSlices):
        return _allreduce_indexed_slices(tensor, op_name, name, compression,
                                         prescale_factor * postscale_factor)
    tensor = tf.convert_to_tensor(tensor)
    compressed, ctx = compression.compress(tensor)
    reduced = _allreduce(compressed, op_name, name, prescale_factor,
                         postscale_factor)
    return compression.decompress(reduced, ctx)


def _allreduce_indexed_slices(slices, op_name, name, compression, scale):
    if op_name not in ("sum", "average"):
        raise NotImplementedError(
            f"tfring: allreduce of a tf.IndexedSlices supports Sum and "
            f"Average only, not {op_name}; densify it first "
            f"(tf.convert_to_tensor) or use sparse_as_dense=True")
    values, ctx = compression.compress(slices.values)
    values = allgather(values, name=f"{name}.values" if name else None)
    indices = allgather(slices.indices,
                        name=f"{name}.indices" if name else None)
    values = compression.decompress(values, ctx)
    if op_name == "average":
        scale = scale / basics.size()
    if scale != 1.0:
        values = values * tf.cast(scale, values.dtype)
    return tf.IndexedSlices(values, indices, dense_shape=slices.dense_shape)


@_no_autograph
def grouped_allreduce(tensors, op=Average, name=None,
                      compression=Compression.none, prescale_factor=1.0,
                      postscale_factor=1.0):
    """Allreduces a list of tensors (any mix of dtypes) as one op: all are
    handed to the engine together, so they are fused and finish together.
    tf.IndexedSlices entries are allgathered as in `allreduce`."""
    tensors = list(tensors)
    if not tensors:
        return []
    op_name = _reduce_op_name(op)
    results = [None] * len(tensors)
    dense, dense_idx, ctxs = [], [], []
    for i, t in enumerate(tensors):
        if isinstance(t, tf.IndexedSlices):
            results[i] = _allreduce_indexed_slices(
                t, op_name, f"{name}.{i}" if name else None, compression,
                prescale_factor * postscale_factor)
            continue
        c, ctx = compression.compress(tf.convert_to_tensor(t))
        dense.append(c)
        dense_idx.append(i)
        ctxs.append(ctx)
    if dense:
        reduced = _run_op(_lib.ring_grouped_allreduce, "RingGroupedAllreduce",
                          name, tensors=dense, reduce_op=op_name,
                          prescale_factor=float(prescale_factor),
                          postscale_factor=float(postscale_factor))
        for i, r, ctx in zip(dense_idx, reduced, ctxs):
            results[i] = compression.decompress(r, ctx)
    return results


@_no_autograph
def allgather(tensor, name=None):
    """Concatenates every rank's `tensor` along dimension 0, in rank order.
    The first dimension may differ between ranks; the others must agree."""
    return _run_op(_lib.ring_allgather, "RingAllgather", name,
                   tensor=tf.convert_to_tensor(tensor))


@_no_autograph
def broadcast(tensor, root_rank=0, name=None):
    """Every rank gets `root_rank`'s `tensor`."""
    return _run_op(_lib.ring_broadcast, "RingBroadcast", name,
                   tensor=tf.convert_to_tensor(tensor),
                   root_rank=int(root_rank))


def _reducescatter_rows(rows, rank, size):
    return rows // size + (1 if rank < rows % size else 0)


@_no_autograph
def reducescatter(tensor, op=Average, name=None, compression=Compression.none,
                  prescale_factor=1.0, postscale_factor=1.0):
    """Reduces `tensor` across ranks like `allreduce` and returns this rank's
    rows of the result: dimension 0 is split as evenly as possible, the first
    (rows % size) ranks getting one extra row."""
    tensor = tf.convert_to_tensor(tensor)
    compressed, ctx = compression.compress(tensor)
    out = _run_op(_lib.ring_reducescatter, "RingReducescatter", name,
                  tensor=compressed, reduce_op=_reduce_op_name(op),
                  prescale_factor=float(prescale_factor),
                  postscale_factor=float(postscale_factor))
    rows = tensor.shape[0] if tensor.shape.rank else None
    if rows is not None and not tf.executing_eagerly() and basics.is_initialized():
        out.set_shape([_reducescatter_rows(rows, basics.rank(), basics.size())]
                      + tensor.shape[1:].as_list())
    return compression.decompress(out, ctx)


# tf.function used by broadcast_variables in eager mode, so all broadcasts
# are in flight together instead of one after another.
_broadcast_group_fn = None


def _broadcast_group(variables, root_rank):
    for var in variables:
        var.assign(broadcast(var, root_rank))


def _as_tf_variable(var):
    """Keras 3 variables wrap a tf.Variable (`.value`); tf.function needs the
    tf.Variable itself to assign to it."""
    if isinstance(var, tf.Variable):
        return var
    inner = getattr(var, "value", None)
    return inner if isinstance(inner, tf.Variable) else var


@_no_autograph
def broadcast_variables(variables, root_rank=0):
    """Assigns `root_rank`'s value to every variable on every rank
    (tf.Variable or Keras variables). Eager: runs at once, all broadcasts in
    flight together. Graph: returns the op to run."""
    global _broadcast_group_fn
    variables = list(variables)
    if tf.executing_eagerly():
        variables = [_as_tf_variable(v) for v in variables]
        if _broadcast_group_fn is None:
            _broadcast_group_fn = tf.function(_broadcast_group, autograph=False)
        if variables:
            _broadcast_group_fn(variables, int(root_rank))
        return None
    return tf.group(*[v.assign(broadcast(v, root_rank)) for v in variables])


# ------------------------------------------------------------- gradients ----
#
# With y = postscale * op_r(prescale * x_r) on every rank and a loss summed
# over ranks, dL/dx_r = sum over ranks r' of dL_r'/dy * dy/dx_r.

def _attr_str(op, name):
    v = op.get_attr(name)
    return v.decode() if isinstance(v, bytes) else v


def _reduce_grad(op_name, x, y_full, g_full, pre, post):
    """dL/dx for y_full = post * op_r(pre * x_r), given g_full = the sum over
    ranks of dL/dy_full (y_full: the whole reduced tensor)."""
    size = basics.size()
    if op_name in ("sum", "average"):
        scale = pre * post / (size if op_name == "average" else 1)
        return g_full * tf.cast(scale, g_full.dtype)
    if op_name in ("min", "max"):
        # The gradient goes to the ranks holding the extreme value, split
        # evenly on ties. The winners are found from unscaled inputs (a
        # negative prescale swaps min and max).
        if pre < 0:
            op_name = "max" if op_name == "min" else "min"
        best = _allreduce(x, op_name)
        mask = tf.cast(tf.equal(x, best), g_full.dtype)
        count = _allreduce(mask, "sum")
        return g_full * tf.cast(pre * post, g_full.dtype) * mask / count
    if op_name == "product":
        # dy/dx_r = post * pre^size * product of the other ranks' x, built
        # from exclusive cumulative products so zeros need no division.
        xs = allgather(tf.expand_dims(x, 0))
        others = (tf.math.cumprod(xs, axis=0, exclusive=True)
                  * tf.math.cumprod(xs, axis=0, exclusive=True, reverse=True))
        scale = post * pre ** size
        return g_full * others[basics.rank()] * tf.cast(scale, g_full.dtype)
    raise NotImplementedError(f"tfring: no gradient for reduce op {op_name}")


def _allreduce_grad(op, grad):
    op_name = _attr_str(op, "reduce_op")
    pre = op.get_attr("prescale_factor")
    post = op.get_attr("postscale_factor")
    if op_name in ("sum", "average"):
        return _allreduce(grad, op_name, None, pre, post)
    return _reduce_grad(op_name, op.inputs[0], op.outputs[0],
                        _allreduce(grad, "sum"), pre, post)


def _grouped_allreduce_grad(op, *grads):
    op_name = _attr_str(op, "reduce_op")
    pre = op.get_attr("prescale_factor")
    post = op.get_attr("postscale_factor")
    present = [i for i, g in enumerate(grads) if g is not None]
    out = [None] * len(grads)
    if op_name in ("sum", "average"):
        reduced = grouped_allreduce([grads[i] for i in present], op_name,
                                    prescale_factor=pre, postscale_factor=post)
        for i, r in zip(present, reduced):
            out[i] = r
        return out
    summed = grouped_allreduce([grads[i] for i in present], "sum")
    for i, g in zip(present, summed):
        out[i] = _reduce_grad(op_name, op.inputs[i], op.outputs[i], g, pre, post)
    return out


def _allgather_grad(op, grad):
    # Every rank's loss depends on every rank's rows: sum the gradients over
    # ranks, then keep this rank's rows. Ranks may contribute different row
    # counts, so the offsets come from the gathered counts.
    grad = _allreduce(tf.convert_to_tensor(grad), "sum")
    rows = tf.shape(op.inputs[0], out_type=tf.int64)[:1]
    if _in_xla_context(tf.compat.v1.get_default_graph()):
        # Under XLA every rank gathers the same row count (docs/xla.md),
        # and XLA needs the slice's bounds without running a collective.
        begin = rows[0] * basics.rank()
    else:
        all_rows = allgather(rows)
        begin = tf.reduce_sum(all_rows[:basics.rank()])
    return grad[begin:begin + rows[0]]


def _broadcast_grad(op, grad):
    # Only the root's input reaches the outputs: it gets the sum of every
    # rank's gradient, the others zero. Every rank builds the same graph
    # (the allreduce feeds the result on all of them), or graph optimizers
    # could drop the allreduce on non-root ranks only.
    grad = _allreduce(tf.convert_to_tensor(grad), "sum")
    is_root = basics.rank() == op.get_attr("root_rank")
    return grad * tf.constant(1 if is_root else 0, grad.dtype)


def _reducescatter_grad(op, grad):
    # Rank r's output is rows r of the reduced tensor, so the gradient with
    # respect to the whole reduced tensor is every rank's gradient stacked.
    op_name = _attr_str(op, "reduce_op")
    pre = op.get_attr("prescale_factor")
    post = op.get_attr("postscale_factor")
    g_full = allgather(tf.convert_to_tensor(grad))
    return _reduce_grad(op_name, op.inputs[0], None, g_full, pre, post)


def _register_gradients():
    for op_type, fn in (("RingAllreduce", _allreduce_grad),
                        ("RingGroupedAllreduce", _grouped_allreduce_grad),
                        ("RingAllgather", _allgather_grad),
                        ("RingBroadcast", _broadcast_grad),
                        ("RingReducescatter", _reducescatter_grad)):
        try:
            tf.RegisterGradient(op_type)(fn)
        except KeyError:  # already registered (module imported twice)
            pass


_register_gradients()
