"""TensorFlow collectives, the public API over tfring's ops (RingAllreduce,
RingGroupedAllreduce, RingAllgather, RingBroadcast, RingReducescatter, and
the topology queries RingRank, RingSize, ...). Layers: tfring/_op_lib.py
loads the op library; tfring/_collectives.py names and creates the ops (the
raw collectives); tfring/adasum.py and the gradients (tfring/_op_grads.py,
registered when this module is imported) are built on those; this module
adds the public arguments and Adasum on top.

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

import tensorflow as tf

from tfring import Adasum, Average, Max, Min, Product, Sum  # noqa: F401
from tfring import _collectives as _c
from tfring import _op_grads  # noqa: F401  (registers the ops' gradients)
from tfring import adasum, basics
from tfring._op_lib import lib as _lib
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

# Our Python runs as written inside tf.function, never rewritten by autograph.
_no_autograph = tf.autograph.experimental.do_not_convert

# ----------------------------------------------------------- collectives ----

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
    op_name = _c.reduce_op_name(_c.handle_average(op, average))
    if isinstance(tensor, tf.IndexedSlices):
        return _c.allreduce_indexed_slices(tensor, op_name, name, compression,
                                           prescale_factor * postscale_factor,
                                           ignore_name_scope, ps_id)
    tensor = tf.convert_to_tensor(tensor)
    wire = _c.wire_of(compression)
    if wire and op_name != "adasum":  # 16-bit words in the ring, float32 sums
        return _c.allreduce(tensor, op_name, name, prescale_factor,
                            postscale_factor, ignore_name_scope, ps_id,
                            wire=wire)
    compressed, ctx = compression.compress(tensor)
    if op_name == "adasum":
        reduced = adasum.allreduce(compressed, name, prescale_factor,
                                   postscale_factor, ignore_name_scope,
                                   process_set)
    else:
        reduced = _c.allreduce(compressed, op_name, name, prescale_factor,
                               postscale_factor, ignore_name_scope, ps_id)
    return compression.decompress(reduced, ctx)


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
    op_name = _c.reduce_op_name(_c.handle_average(op, average))
    if op_name != "adasum":
        return _c.grouped_allreduce(tensors, op_name, name, prescale_factor,
                                    postscale_factor, ignore_name_scope,
                                    ps_id, compression)
    if any(isinstance(t, tf.IndexedSlices) for t in tensors):
        _c.check_indexed_slices_op(op_name)
    dense, ctxs = [], []
    for t in tensors:
        c, ctx = compression.compress(tf.convert_to_tensor(t))
        dense.append(c)
        ctxs.append(ctx)
    reduced = adasum.grouped_allreduce(dense, name, prescale_factor,
                                       postscale_factor, ignore_name_scope,
                                       process_set)
    return [compression.decompress(r, ctx) for r, ctx in zip(reduced, ctxs)]


@_no_autograph
def allgather(tensor, name=None, ignore_name_scope=False, process_set=None):
    """Concatenates every rank's `tensor` along dimension 0, in rank order.
    The first dimension may differ between ranks; the others must agree."""
    return _c.allgather(tensor, name, ignore_name_scope,
                        _process_set_arg(process_set))


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
    return _c.run_op(_lib.ring_broadcast, "RingBroadcast", name,
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
    op_name = _c.reduce_op_name(op)
    if op_name == "adasum":
        raise NotImplementedError(
            "tfring: reducescatter does not support Adasum (as in Horovod)")
    out = _c.run_op(_lib.ring_reducescatter, "RingReducescatter", name,
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
    output, received = _c.alltoall(tensor, splits, name, ps_id=ps_id)
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

