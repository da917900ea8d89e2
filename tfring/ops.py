"""TensorFlow collectives: loads the op library (_tfring_ops.so), wraps its
ops (RingAllreduce, RingGroupedAllreduce, RingAllgather, RingBroadcast,
RingReducescatter, and the topology queries RingRank, RingSize, ...);
their gradients are in tfring/_op_grads.py, registered on import.

Horovod's arguments. Every collective takes the keyword arguments Horovod's
has: `process_set=` (see tfring/process_sets.py), `ignore_name_scope=`
(the op's node name leaves out the enclosing name scopes), `average=`
(deprecated; Horovod's rule: True is Average, False is Sum, and giving both
`average` and `op` is an error), and `device_dense=` / `device_sparse=`,
which do nothing: every op runs where its input tensor lives (host or GPU),
so there is no device to choose.

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
import warnings
import weakref

import tensorflow as tf
from tensorflow.python.framework import func_graph as _func_graph
from tensorflow.python.ops import control_flow_util as _cf_util

from tfring import Adasum, Average, Max, Min, Product, Sum, basics
from tfring.compression import Compression
from tfring.process_sets import _process_set_arg, _rank_size

__all__ = [
    "Adasum", "Average", "Compression", "Max", "Min", "Product", "Sum",
    "allgather", "allreduce", "broadcast", "broadcast_",
    "broadcast_global_variables", "broadcast_variables",
    "grouped_allgather", "grouped_allreduce", "grouped_reducescatter",
    "local_rank_op", "local_size_op", "process_set_included_op", "rank_op",
    "reducescatter", "size_op",
]
__all__ += ["alltoall", "join"]

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
                    Product: "product", Adasum: "adasum"}


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
                     f"Average, Min, Max, Product or Adasum")


def _handle_average(op, average):
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


def _in_xla_context(graph):
    try:
        return _cf_util.GraphOrParentsInXlaContext(graph)
    except Exception:  # noqa: BLE001 - private API; never fail because of it
        return False


_XLA_FILE = _LIB_FILE + ".xla"
_xla_ready = set()  # op types checked compilable by XLA in this process
# The ops with XLA kernels (csrc/tf/xla_ops.cc).
_XLA_OPS = frozenset({"RingAllreduce", "RingGroupedAllreduce", "RingAllgather",
                      "RingBroadcast", "RingReducescatter"})
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


def _run_op(op_fn, op_type, name, ignore_name_scope=False, **attrs):
    """Creates one collective op with its cross-rank name; returns outputs."""
    if tf.executing_eagerly():
        return op_fn(tensor_name=name or "", **attrs)
    graph = tf.compat.v1.get_default_graph()
    if ignore_name_scope:
        with graph.name_scope(None):  # the root scope
            return _run_op(op_fn, op_type, name, **attrs)
    if _in_xla_context(graph):
        inputs = attrs.get("tensors") or [attrs.get("tensor")]
        _check_xla(op_type, inputs[0])
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
    if _in_xla_context(tf.compat.v1.get_default_graph()):
        return outputs
    return _lib.ring_outputs(outputs)


# ----------------------------------------------------------- collectives ----

def _allreduce(tensor, op="average", name=None, prescale_factor=1.0,
               postscale_factor=1.0, ignore_name_scope=False, ps_id=0):
    return _run_op(_lib.ring_allreduce, "RingAllreduce", name,
                   ignore_name_scope, tensor=tensor,
                   reduce_op=_reduce_op_name(op),
                   prescale_factor=float(prescale_factor),
                   postscale_factor=float(postscale_factor),
                   process_set_id=ps_id)


@_no_autograph
def allreduce(tensor, op=None, name=None, compression=Compression.none,
              prescale_factor=1.0, postscale_factor=1.0, *, average=None,
              device_dense="", device_sparse="", process_set=None,
              ignore_name_scope=False):
    """Reduces `tensor` across all ranks; every rank gets
    `postscale_factor * op(prescale_factor * tensor)`. `op` is one of
    Sum, Average (the default), Min, Max, Product, Adasum. `process_set`
    (a tfring.ProcessSet, default every rank) restricts it to that set's
    ranks; every collective here takes it.

    A tf.IndexedSlices is allgathered (values and indices), not densified:
    the result is an IndexedSlices holding every rank's rows (divided by
    the number of ranks for Average; integer values then become floating,
    as Horovod's true division makes them). Only Sum and Average apply to it.

    Horovod's keywords: `average` (deprecated), `process_set`,
    `ignore_name_scope`; `device_dense`/`device_sparse` are accepted and
    do nothing (the op runs where the tensor is).
    """
    ps_id = _process_set_arg(process_set)
    op_name = _reduce_op_name(_handle_average(op, average))
    if isinstance(tensor, tf.IndexedSlices):
        return _allreduce_indexed_slices(tensor, op_name, name, compression,
                                         prescale_factor * postscale_factor,
                                         ignore_name_scope, process_set)
    tensor = tf.convert_to_tensor(tensor)
    compressed, ctx = compression.compress(tensor)
    if op_name == "adasum":
        from tfring import adasum
        reduced = adasum.allreduce(compressed, name, prescale_factor,
                                   postscale_factor, ignore_name_scope,
                                   process_set)
    else:
        reduced = _allreduce(compressed, op_name, name, prescale_factor,
                             postscale_factor, ignore_name_scope, ps_id)
    return compression.decompress(reduced, ctx)


def _scale_gathered_values(values, op_name, scale, size):
    """Scales allgathered IndexedSlices values: Average divides by the number
    of ranks with true division (integers become floating, as in Horovod);
    an integer Sum with a scale other than 1 is scaled in float64 and
    truncated toward zero, as the dense integer collectives do."""
    if op_name == "average":
        if values.dtype.is_integer or values.dtype.is_bool:
            values = tf.math.truediv(values, tf.cast(size, values.dtype))
            return values * tf.cast(scale, values.dtype) if scale != 1.0 else values
        scale = scale / size
    if scale == 1.0:
        return values
    if values.dtype.is_integer:
        return tf.cast(tf.cast(values, tf.float64) * scale, values.dtype)
    return values * tf.cast(scale, values.dtype)


def _allreduce_indexed_slices(slices, op_name, name, compression, scale,
                              ignore_name_scope=False, process_set=None):
    if op_name not in ("sum", "average"):
        raise NotImplementedError(
            f"tfring: allreduce of a tf.IndexedSlices supports Sum and "
            f"Average only, not {op_name}; densify it first "
            f"(tf.convert_to_tensor) or use sparse_as_dense=True")
    values, ctx = compression.compress(slices.values)
    values = allgather(values, name=f"{name}.values" if name else None,
                       ignore_name_scope=ignore_name_scope,
                       process_set=process_set)
    indices = allgather(slices.indices,
                        name=f"{name}.indices" if name else None,
                        ignore_name_scope=ignore_name_scope,
                        process_set=process_set)
    size = _rank_size(_process_set_arg(process_set))[1]
    values = _scale_gathered_values(compression.decompress(values, ctx),
                                    op_name, scale, size)
    return tf.IndexedSlices(values, indices, dense_shape=slices.dense_shape)


@_no_autograph
def grouped_allreduce(tensors, op=None, name=None,
                      compression=Compression.none, prescale_factor=1.0,
                      postscale_factor=1.0, *, average=None, device_dense="",
                      device_sparse="", process_set=None,
                      ignore_name_scope=False):
    """Allreduces a list of tensors (any mix of dtypes) as one op: all are
    handed to the engine together, so they are fused and finish together.
    tf.IndexedSlices entries are allgathered as in `allreduce`. Takes
    Horovod's keywords as `allreduce` does."""
    ps_id = _process_set_arg(process_set)
    tensors = list(tensors)
    if not tensors:
        return []
    op_name = _reduce_op_name(_handle_average(op, average))
    results = [None] * len(tensors)
    dense, dense_idx, ctxs = [], [], []
    for i, t in enumerate(tensors):
        if isinstance(t, tf.IndexedSlices):
            results[i] = _allreduce_indexed_slices(
                t, op_name, f"{name}.{i}" if name else None, compression,
                prescale_factor * postscale_factor, ignore_name_scope,
                process_set)
            continue
        c, ctx = compression.compress(tf.convert_to_tensor(t))
        dense.append(c)
        dense_idx.append(i)
        ctxs.append(ctx)
    if dense and op_name == "adasum":
        from tfring import adasum
        reduced = adasum.grouped_allreduce(dense, name, prescale_factor,
                                           postscale_factor, ignore_name_scope,
                                           process_set)
    elif dense:
        reduced = _run_op(_lib.ring_grouped_allreduce, "RingGroupedAllreduce",
                          name, ignore_name_scope, tensors=dense,
                          reduce_op=op_name,
                          prescale_factor=float(prescale_factor),
                          postscale_factor=float(postscale_factor),
                          process_set_id=ps_id)
        reduced = _inline_consumers(reduced)
    for i, r, ctx in zip(dense_idx, reduced if dense else [], ctxs):
        results[i] = compression.decompress(r, ctx)
    return results


@_no_autograph
def allgather(tensor, name=None, ignore_name_scope=False, process_set=None):
    """Concatenates every rank's `tensor` along dimension 0, in rank order.
    The first dimension may differ between ranks; the others must agree."""
    return _run_op(_lib.ring_allgather, "RingAllgather", name,
                   ignore_name_scope, tensor=tf.convert_to_tensor(tensor),
                   process_set_id=_process_set_arg(process_set))


@_no_autograph
def grouped_allgather(tensors, name=None, ignore_name_scope=False,
                      process_set=None):
    """Allgathers each tensor of a list (any mix of dtypes and shapes), all
    in flight together; returns the list of results. Tensor i is matched
    across ranks by `name.i` (eager, with a name) or its node name."""
    _process_set_arg(process_set)
    return [allgather(t, name=f"{name}.{i}" if name else None,
                      ignore_name_scope=ignore_name_scope,
                      process_set=process_set)
            for i, t in enumerate(tensors)]


@_no_autograph
def broadcast(tensor, root_rank=0, name=None, ignore_name_scope=False,
              process_set=None):
    """Every rank gets `root_rank`'s `tensor`. On a process set, root_rank
    is a global rank, which must be in the set (as in Horovod); the core
    checks it, failing the broadcast on every rank of the set alike."""
    ps_id = _process_set_arg(process_set)
    return _run_op(_lib.ring_broadcast, "RingBroadcast", name,
                   ignore_name_scope, tensor=tf.convert_to_tensor(tensor),
                   root_rank=int(root_rank), process_set_id=ps_id)


def _reducescatter_rows(rows, rank, size):
    return rows // size + (1 if rank < rows % size else 0)


@_no_autograph
def reducescatter(tensor, op=Average, name=None, compression=Compression.none,
                  prescale_factor=1.0, postscale_factor=1.0, *,
                  device_dense="", process_set=None, ignore_name_scope=False):
    """Reduces `tensor` across ranks like `allreduce` and returns this rank's
    rows of the result: dimension 0 is split as evenly as possible, the first
    (rows % size) ranks getting one extra row."""
    ps_id = _process_set_arg(process_set)
    tensor = tf.convert_to_tensor(tensor)
    compressed, ctx = compression.compress(tensor)
    op_name = _reduce_op_name(op)
    if op_name == "adasum":
        raise NotImplementedError(
            "tfring: reducescatter does not support Adasum (as in Horovod)")
    out = _run_op(_lib.ring_reducescatter, "RingReducescatter", name,
                  ignore_name_scope, tensor=compressed, reduce_op=op_name,
                  prescale_factor=float(prescale_factor),
                  postscale_factor=float(postscale_factor),
                  process_set_id=ps_id)
    rows = tensor.shape[0] if tensor.shape.rank else None
    if rows is not None and not tf.executing_eagerly() and basics.is_initialized():
        out.set_shape([_reducescatter_rows(rows, *_rank_size(ps_id))]
                      + tensor.shape[1:].as_list())
    return compression.decompress(out, ctx)


@_no_autograph
def grouped_reducescatter(tensors, device_dense="",
                          compression=Compression.none, op=Average,
                          process_set=None, prescale_factor=1.0,
                          postscale_factor=1.0, *, name=None,
                          ignore_name_scope=False):
    """`reducescatter` of each tensor of a list, all in flight together;
    returns the list of this rank's shares. The positional order is
    Horovod's (it has no `name`; here `name` is keyword-only)."""
    _process_set_arg(process_set)
    return [reducescatter(t, op=op, name=f"{name}.{i}" if name else None,
                          compression=compression,
                          prescale_factor=prescale_factor,
                          postscale_factor=postscale_factor,
                          ignore_name_scope=ignore_name_scope,
                          process_set=process_set)
            for i, t in enumerate(tensors)]


# tf.function used by broadcast_variables in eager mode, so all broadcasts
# are in flight together instead of one after another.
_broadcast_group_fn = None


def _broadcast_group(variables, root_rank, process_set=None):
    for var in variables:
        var.assign(broadcast(var, root_rank, process_set=process_set))


def _as_tf_variable(var):
    """Keras 3 variables wrap a tf.Variable (`.value`); tf.function needs the
    tf.Variable itself to assign to it."""
    if isinstance(var, tf.Variable):
        return var
    inner = getattr(var, "value", None)
    return inner if isinstance(inner, tf.Variable) else var


@_no_autograph
def broadcast_variables(variables, root_rank=0, process_set=None,
                        inplace=False):
    """Assigns `root_rank`'s value to every variable on every rank
    (tf.Variable or Keras variables). Eager: runs at once, all broadcasts in
    flight together. Graph: returns the op to run. `inplace=True` is
    `broadcast_` (the same result)."""
    global _broadcast_group_fn
    _process_set_arg(process_set)
    variables = list(variables)
    if tf.executing_eagerly():
        variables = [_as_tf_variable(v) for v in variables]
        if _broadcast_group_fn is None:
            _broadcast_group_fn = tf.function(_broadcast_group, autograph=False)
        if variables:
            if process_set is None:
                _broadcast_group_fn(variables, int(root_rank))
            else:
                _broadcast_group_fn(variables, int(root_rank), process_set)
        return None
    return tf.group(*[v.assign(broadcast(v, root_rank, process_set=process_set))
                      for v in variables])


@_no_autograph
def broadcast_(variables, root_rank, name=None, process_set=None):
    """Horovod's in-place broadcast: every variable in `variables` takes
    `root_rank`'s value; returns the variables' new values (a list). Unlike
    Horovod's it does not save memory: each variable's value travels in a
    temporary tensor, then is assigned. Variable i is matched across ranks
    by `name.i` when a name is given."""
    _process_set_arg(process_set)
    variables = [_as_tf_variable(v) for v in variables]
    updates = [v.assign(broadcast(v, root_rank,
                                  name=f"{name}.{i}" if name else None,
                                  process_set=process_set))
               for i, v in enumerate(variables)]
    if tf.executing_eagerly():
        return [v.read_value() for v in variables]
    with tf.control_dependencies(updates):
        return [v.read_value() for v in variables]


def broadcast_global_variables(root_rank):
    """tf.compat.v1 graphs: the op that assigns `root_rank`'s value to every
    global variable. Eager code broadcasts its variables with
    broadcast_variables(model.variables, root_rank) instead."""
    if tf.executing_eagerly():
        raise RuntimeError(
            "tfring.broadcast_global_variables() needs a tf.compat.v1 graph; "
            "in eager code use tfring.broadcast_variables(<model and "
            "optimizer variables>, root_rank)")
    return broadcast_variables(tf.compat.v1.global_variables(), root_rank)


# ------------------------------------------------------- topology as ops ----
# Evaluated when the graph runs, not when it is built (Horovod's *_op).

def rank_op(name=None):
    """An int32 scalar op: this process's rank, read when it runs."""
    return _lib.ring_rank(name=name)


def local_rank_op(name=None):
    """An int32 scalar op: this process's rank on its host."""
    return _lib.ring_local_rank(name=name)


def size_op(process_set_id=0, name=None):
    """An int32 scalar op: the number of ranks (of the process set with
    this id; 0 is every rank)."""
    return _lib.ring_size(process_set_id=int(process_set_id), name=name)


def local_size_op(name=None):
    """An int32 scalar op: the number of ranks on this host."""
    return _lib.ring_local_size(name=name)


def process_set_included_op(process_set_id=0, name=None):
    """An int32 scalar op: 1 when this process belongs to the process set,
    0 when not, -3 (Horovod's code for an unknown set) when there is no set
    with this id."""
    return _lib.ring_process_set_included(process_set_id=int(process_set_id),
                                          name=name)


# ------------------------------------------------------ alltoall and join ----

@_no_autograph
def alltoall(tensor, splits=None, name=None, ignore_name_scope=False,
             process_set=None):
    """Sends `splits[i]` rows of `tensor`'s first dimension to rank i and
    returns the rows received from every rank, concatenated in rank order.

    Without `splits` the first dimension is split evenly (it must divide by
    the number of ranks) and only the output is returned; with `splits`
    (length size(), summing to the first dimension) the result is
    `(output, received_splits)`, as in Horovod. The other dimensions must
    agree across ranks. GPU tensors go through host memory.

    On a process set, rank i means the set's i-th rank: `splits` has one
    entry per rank of the set, and the output holds the set's rows only.
    """
    ps_id = _process_set_arg(process_set)
    tensor = tf.convert_to_tensor(tensor)
    splits_t = (tf.constant([], tf.int32) if splits is None
                else tf.cast(tf.convert_to_tensor(splits), tf.int32))
    with tf.device("/cpu:0"):
        output, received = _run_op(_lib.ring_alltoall, "RingAlltoall", name,
                                   tensor=tensor, splits=splits_t,
                                   process_set_id=ps_id)
    return (output, received) if splits is not None else output


def join():
    """Says this rank is out of data. Until every rank has joined, it takes
    part in the other ranks' allreduces with zeros (Average still divides by
    size()); broadcast, allgather, reducescatter and alltoall fail while a
    rank has joined, as in Horovod. Returns the last rank to join (an int32
    scalar tensor)."""
    if tf.executing_eagerly():
        return _lib.ring_join(tensor_name="tfring.join")
    return _lib.ring_join(tensor_name="tfring.join", name="RingJoin")


# Registers the ops' gradients (tfring/_op_grads.py); last, since it uses
# the collectives above.
from tfring import _op_grads  # noqa: E402,F401
