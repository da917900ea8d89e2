"""Gradients of tfring's TensorFlow ops (tfring/ops.py), registered with
TensorFlow when this module is imported (tfring.ops imports it). They are
built from the raw collectives of tfring/_collectives.py.

With y = postscale * op_r(prescale * x_r) on every rank and a loss summed
over ranks, dL/dx_r = sum over ranks r' of dL_r'/dy * dy/dx_r. Allgather
and broadcast follow Horovod instead (see below). Every gradient runs on
the op's own process set.
"""

import tensorflow as tf

from tfring import basics
from tfring._collectives import (
    allgather,
    allreduce,
    alltoall,
    grouped_allreduce,
    in_xla_context,
)
from tfring.compression import Compression
from tfring.process_sets import _process_set_arg, _rank_size, process_set_by_id


def _attr_str(op, name):
    v = op.get_attr(name)
    return v.decode() if isinstance(v, bytes) else v


def _ps_of(op):
    """The op's process set id, checked as a `process_set=` argument is.
    Gradients run on the same set as the op."""
    try:
        ps_id = int(op.get_attr("process_set_id"))
    except ValueError:  # graphs built before the attribute existed
        ps_id = 0
    if ps_id == 0:
        return 0
    return _process_set_arg(process_set_by_id(ps_id))


def _reduce_grad(op_name, x, y_full, g_full, pre, post, ps_id):
    """dL/dx for y_full = post * op_r(pre * x_r), given g_full = the sum over
    ranks of dL/dy_full (y_full: the whole reduced tensor)."""
    me, size = _rank_size(ps_id)
    # Scales are Python floats made constants of the gradient's dtype
    # (tf.cast would make a float32 tensor of them first: 2/3 off by 3e-8).
    if op_name in ("sum", "average"):
        scale = pre * post / (size if op_name == "average" else 1)
        return g_full * tf.constant(scale, g_full.dtype)
    if op_name in ("min", "max"):
        # The gradient goes to the ranks holding the extreme value, split
        # evenly on ties. The winners are found from unscaled inputs (a
        # negative prescale swaps min and max).
        if pre < 0:
            op_name = "max" if op_name == "min" else "min"
        best = allreduce(x, op_name, ps_id=ps_id)
        mask = tf.cast(tf.equal(x, best), g_full.dtype)
        count = allreduce(mask, "sum", ps_id=ps_id)
        return g_full * tf.constant(pre * post, g_full.dtype) * mask / count
    if op_name == "product":
        # dy/dx_r = post * pre^size * product of the other ranks' x, built
        # from exclusive cumulative products so zeros need no division.
        xs = allgather(tf.expand_dims(x, 0), ps_id=ps_id)
        others = (tf.math.cumprod(xs, axis=0, exclusive=True)
                  * tf.math.cumprod(xs, axis=0, exclusive=True, reverse=True))
        scale = post * pre ** size
        return g_full * others[me] * tf.constant(scale, g_full.dtype)
    raise NotImplementedError(f"tfring: no gradient for reduce op {op_name}")


def _wire_of(op):
    """The op's 16-bit wire (Compression.fp16/bf16), or None: a sum's
    gradient travels on the same wire."""
    try:
        wire = _attr_str(op, "wire_dtype")
    except ValueError:  # graphs built before the attribute existed
        return None
    return None if wire == "none" else wire


_WIRES = {"float16": Compression.fp16, "bfloat16": Compression.bf16}


def _allreduce_grad(op, grad):
    op_name = _attr_str(op, "reduce_op")
    pre = op.get_attr("prescale_factor")
    post = op.get_attr("postscale_factor")
    ps_id = _ps_of(op)
    if op_name in ("sum", "average"):
        return allreduce(grad, op_name, None, pre, post, ps_id=ps_id,
                         wire=_wire_of(op))
    return _reduce_grad(op_name, op.inputs[0], op.outputs[0],
                        allreduce(grad, "sum", ps_id=ps_id), pre, post, ps_id)


def _grouped_allreduce_grad(op, *grads):
    op_name = _attr_str(op, "reduce_op")
    pre = op.get_attr("prescale_factor")
    post = op.get_attr("postscale_factor")
    present = [i for i, g in enumerate(grads) if g is not None]
    out = [None] * len(grads)
    ps_id = _ps_of(op)
    if op_name in ("sum", "average"):
        wire = _wire_of(op)
        reduced = grouped_allreduce([grads[i] for i in present], op_name,
                                    prescale_factor=pre, postscale_factor=post,
                                    ps_id=ps_id,
                                    compression=_WIRES.get(wire,
                                                           Compression.none))
        for i, r in zip(present, reduced):
            out[i] = r
        return out
    summed = grouped_allreduce([grads[i] for i in present], "sum", ps_id=ps_id)
    for i, g in zip(present, summed):
        out[i] = _reduce_grad(op_name, op.inputs[i], op.outputs[i], g, pre, post,
                              ps_id)
    return out


# Allgather and broadcast: Horovod's gradients, which average the upstream
# gradients over ranks where the plain chain rule (with every rank's loss
# summed) would sum them. Averaged data-parallel training divides the summed
# loss by the number of ranks, so these match it; a rank that wants the sum
# multiplies by size(). (Allreduce and reducescatter keep the chain rule.)

def _allgather_grad(op, grad):
    # Every rank's loss depends on every rank's rows: average the gradients
    # over ranks, then keep this rank's rows. Ranks may contribute different
    # row counts, so the offsets come from the gathered counts.
    ps_id = _ps_of(op)
    grad = allreduce(tf.convert_to_tensor(grad), "average", ps_id=ps_id)
    rows = tf.shape(op.inputs[0], out_type=tf.int64)[:1]
    if in_xla_context(tf.compat.v1.get_default_graph()):
        # Under XLA every rank gathers the same row count (docs/xla.md),
        # and XLA needs the slice's bounds without running a collective.
        begin = rows[0] * _rank_size(ps_id)[0]
    else:
        all_rows = allgather(rows, ps_id=ps_id)
        begin = tf.reduce_sum(all_rows[:_rank_size(ps_id)[0]])
    return grad[begin:begin + rows[0]]


def _broadcast_grad(op, grad):
    # Only the root's input reaches the outputs: it gets the average of every
    # rank's gradient, the others zero. Every rank builds the same graph
    # (the allreduce feeds the result on all of them), or graph optimizers
    # could drop the allreduce on non-root ranks only.
    ps_id = _ps_of(op)
    grad = allreduce(tf.convert_to_tensor(grad), "average", ps_id=ps_id)
    is_root = basics.rank() == op.get_attr("root_rank")
    return grad * tf.constant(1 if is_root else 0, grad.dtype)


def _reducescatter_grad(op, grad):
    # Rank r's output is rows r of the reduced tensor, so the gradient with
    # respect to the whole reduced tensor is every rank's gradient stacked.
    op_name = _attr_str(op, "reduce_op")
    pre = op.get_attr("prescale_factor")
    post = op.get_attr("postscale_factor")
    ps_id = _ps_of(op)
    g_full = allgather(tf.convert_to_tensor(grad), ps_id=ps_id)
    return _reduce_grad(op_name, op.inputs[0], None, g_full, pre, post, ps_id)


def _alltoall_grad(op, grad, _grad_received):
    # Rows went from rank s to rank d, so their gradients go back from d to
    # s: an alltoall of the gradient with the received splits, on the op's
    # process set.
    ps_id = _ps_of(op)
    grad, _ = alltoall(tf.convert_to_tensor(grad), splits=op.outputs[1],
                       ps_id=ps_id)
    return [grad, None]


def _outputs_grad(op, *grads):
    return list(grads)


def _register_gradients():
    for op_type, fn in (("RingOutputs", _outputs_grad),
                        ("RingAllreduce", _allreduce_grad),
                        ("RingGroupedAllreduce", _grouped_allreduce_grad),
                        ("RingAllgather", _allgather_grad),
                        ("RingBroadcast", _broadcast_grad),
                        ("RingReducescatter", _reducescatter_grad),
                        ("RingAlltoall", _alltoall_grad)):
        try:
            tf.RegisterGradient(op_type)(fn)
        except KeyError:  # already registered (module imported twice)
            pass
    for op_type in ("RingRank", "RingLocalRank", "RingSize", "RingLocalSize",
                    "RingProcessSetIncluded"):
        try:
            tf.no_gradient(op_type)
        except KeyError:
            pass


_register_gradients()
