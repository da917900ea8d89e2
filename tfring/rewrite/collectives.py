"""Collectives the rewrites are built from, also used by tfring.keras:
reduce_gradients (fused allreduce of a gradient list, sparse gradients
allgathered), broadcast_values (root_rank's values into variables, eagerly),
average_scalars, and the fusion bucketing they share with the graph rewrite."""

import numpy as np
import tensorflow as tf

from tfring import Average, _core, _tunables, basics
from tfring import _collectives
from tfring import ops as _ops
from tfring._buckets import plan as _bucket_plan
from tfring.compression import Compression
from tfring.compression.powersgd import is_powersgd
from tfring.compression.powersgd_step import reduce_step


def _fusion_bytes(fusion_threshold):
    """Bucket size for fused gradient ops: the argument, else the engine's
    fusion threshold (TFRING_FUSION_THRESHOLD: rank 0's after init, this
    process's before)."""
    if fusion_threshold is not None:
        return int(fusion_threshold)
    if _core.is_initialized():
        return int(_core.config()["fusion_threshold"])
    return _tunables.get("TFRING_FUSION_THRESHOLD")


def _nbytes(tensor):
    shape = tensor.shape
    if shape.rank is None or not shape.is_fully_defined():
        return None
    return int(np.prod(shape.as_list(), dtype=np.int64)) * tensor.dtype.size


def _buckets(tensors, limit):
    """Splits `tensors` (in backprop order) into consecutive runs of at most
    `limit` bytes, the first ones smaller so that communication starts early
    in backprop (tfring/_buckets.py); a larger tensor forms its own run."""
    return [[tensors[i] for i in run]
            for run in _bucket_plan([_nbytes(t) for t in tensors], limit)]


def reduce_gradients(grads, op=Average, compression=Compression.none,
                     fusion_threshold=None, sparse_as_dense=False,
                     prescale_factor=1.0, postscale_factor=1.0,
                     process_set=None, variables=None):
    """Allreduces a list of gradients (None entries stay None), fused into
    RingGroupedAllreduce ops of at most `fusion_threshold` bytes (one op
    when traced for XLA). The list is bucketed from its end, since backprop
    produces the gradients of the last layers first. tf.IndexedSlices are allgathered (see
    tfring.allreduce) unless sparse_as_dense. `process_set`, if given, is
    passed to every op.

    With Compression.powersgd the whole list goes to the compressor, whose
    state is keyed by `variables` (the gradients' variables, or names;
    else their positions)."""
    grads = list(grads)
    if is_powersgd(compression):
        with tf.name_scope("PowerSGD"):
            return reduce_step(compression, grads, variables, op,
                               prescale_factor, postscale_factor, process_set,
                               sparse_as_dense, name=compression.name)
    out = [None] * len(grads)
    dense = []
    scales = {"prescale_factor": prescale_factor,
              "postscale_factor": postscale_factor}
    if process_set is not None:
        scales["process_set"] = process_set
    for i, g in enumerate(grads):
        if g is None:
            continue
        if isinstance(g, tf.IndexedSlices) and not sparse_as_dense:
            out[i] = _ops.allreduce(g, op, compression=compression, **scales)
        else:
            dense.append((i, tf.convert_to_tensor(g)))
    dense.reverse()
    tensors = [t for _, t in dense]
    if _collectives.in_xla_context(tf.compat.v1.get_default_graph()):
        # Under XLA one grouped op: every gradient in one custom call. On
        # the GPU each call holds XLA's thread until done, so buckets could
        # not overlap backprop there, only add calls (docs/xla.md).
        runs = [tensors] if tensors else []
    else:
        runs = _buckets(tensors, _fusion_bytes(fusion_threshold))
    start = 0
    for run in runs:
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
