"""Adasum: Horovod's adaptive summation (op=tfring.Adasum).

Two gradients a and b combine as

    adasum(a, b) = (1 - a.b / (2 |a|^2)) a + (1 - a.b / (2 |b|^2)) b

(a coefficient stays 1 where its vector's squared norm is below
sqrt(DBL_MIN)), so orthogonal gradients add and parallel ones average. Over
N = 2^k ranks the combination is recursive, by rank: level 1 combines ranks
(0, 1), (2, 3), ...; level 2 combines the results of (0, 1) and (2, 3); and
so on, the tree Horovod's vector-halving implementation computes. Dot
products and norms are taken over the whole tensor (per tensor in a
group), in float64.

Here the tree is evaluated on every rank after one allgather of every
rank's tensor, so every rank computes the same float64 arithmetic in the
same order and gets a bitwise identical result. That costs N times the
tensor's memory and is meant for moderate tensors; it works for host and
GPU tensors alike. As in Horovod: floating dtypes only, N must be a power
of two, prescale_factor multiplies every input and postscale_factor the
result.

On a process set the same tree runs over the set's ranks in the set's
order (its size must be a power of two), through an allgather on the set.
"""

import numpy as np
import tensorflow as tf

from tfring import _collectives
from tfring.process_sets import _process_set_arg, _rank_size

__all__ = []

_TINY = float(np.sqrt(np.finfo(np.float64).tiny))  # sqrt(DBL_MIN)


def _check(tensor, what, ps_id=0):
    _, size = _rank_size(ps_id)
    if size & (size - 1):
        where = f"process set {ps_id} has" if ps_id else "this job has"
        raise NotImplementedError(
            f"tfring: Adasum needs a power-of-two number of ranks (as in "
            f"Horovod); {where} {size}")
    if not tensor.dtype.is_floating:
        raise ValueError(
            f"tfring: Adasum reduces floating-point tensors only; {what} has "
            f"dtype {tensor.dtype.name}")


def pairwise(a, b):
    """Adasum of two float64 tensors of the same shape."""
    dot = tf.reduce_sum(a * b)
    anormsq = tf.reduce_sum(a * a)
    bnormsq = tf.reduce_sum(b * b)
    one = tf.constant(1.0, tf.float64)
    acoeff = tf.where(anormsq >= _TINY, one - dot / anormsq * 0.5, one)
    bcoeff = tf.where(bnormsq >= _TINY, one - dot / bnormsq * 0.5, one)
    return acoeff * a + bcoeff * b


def _tree(stacked, n):
    """Adasum of stacked[0..n-1] (float64, n a power of two), combined
    pairwise by rank: neighbours first, then pairs of pairs."""
    level = [stacked[r] for r in range(n)]
    while len(level) > 1:
        level = [pairwise(level[i], level[i + 1]) for i in range(0, len(level), 2)]
    return level[0]


def _reduce_gathered(gathered, tensor, prescale, postscale, size):
    stacked = tf.reshape(tf.cast(gathered, tf.float64),
                         tf.concat([[size], tf.shape(tensor)], 0))
    if prescale != 1.0:
        stacked = stacked * prescale
    out = _tree(stacked, size)
    if postscale != 1.0:
        out = out * postscale
    return tf.cast(out, tensor.dtype)


def allreduce(tensor, name=None, prescale_factor=1.0, postscale_factor=1.0,
              ignore_name_scope=False, process_set=None):
    ps_id = _process_set_arg(process_set)
    _check(tensor, f"tensor {name!r}" if name else "the tensor", ps_id)
    gathered = _collectives.allgather(tf.expand_dims(tensor, 0),
                                      name=f"{name}.adasum" if name else None,
                                      ignore_name_scope=ignore_name_scope,
                                      ps_id=ps_id)
    return _reduce_gathered(gathered, tensor, prescale_factor, postscale_factor,
                            _rank_size(ps_id)[1])


def grouped_allreduce(tensors, name=None, prescale_factor=1.0,
                      postscale_factor=1.0, ignore_name_scope=False,
                      process_set=None):
    """Adasum of each tensor on its own (its own dot products and norms)."""
    ps_id = _process_set_arg(process_set)
    for i, t in enumerate(tensors):
        _check(t, f"tensor {i} of the group", ps_id)
    # One allgather per tensor, named as tfring.grouped_allgather names them.
    gathered = [_collectives.allgather(tf.expand_dims(t, 0),
                                       name=f"{name}.adasum.{i}" if name else None,
                                       ignore_name_scope=ignore_name_scope,
                                       ps_id=ps_id)
                for i, t in enumerate(tensors)]
    size = _rank_size(ps_id)[1]
    return [_reduce_gathered(g, t, prescale_factor, postscale_factor, size)
            for g, t in zip(gathered, tensors)]
