"""SyncBatchNormalization: Keras 3 BatchNormalization whose training-time
statistics cover the global batch (every rank's samples), Horovod's
horovod.tensorflow.SyncBatchNormalization.

Each rank computes, over its local batch and the normalized axes, the
sample count n_r, the sum S_r and the sum of squares Q_r of every channel,
and one Sum allreduce of [n, S, Q] gives the global totals. Then
mean = S / n and variance = Q / n - mean^2 (the biased variance, as Keras
uses for both normalizing and the moving statistics). Counting samples
rather than averaging per-rank means makes uneven local batches (the last
batch of an epoch, a rank with fewer rows) give exactly the statistics of
the concatenated batch. The allreduce has a gradient (Sum of the upstream
gradients), so backprop through the statistics is that of the global
batch as well. Moving statistics are then updated by Keras'
BatchNormalization code, so inference is unchanged.
"""

import keras
import tensorflow as tf

from tfring import basics
from tfring import ops as _ops


@keras.saving.register_keras_serializable(package="tfring")
class SyncBatchNormalization(keras.layers.BatchNormalization):
    """Batch normalization with statistics synchronized across all ranks
    during training (see the module doc). Takes BatchNormalization's
    arguments; fused is accepted for Horovod compatibility (False or None
    only, as there)."""

    def __init__(self, fused=False, **kwargs):
        if fused:
            raise ValueError("SyncBatchNormalization does not support "
                             "fused=True")
        if kwargs.get("synchronized"):
            raise ValueError("SyncBatchNormalization synchronizes over "
                             "tfring's ranks; synchronized=True "
                             "(tf.distribute) does not apply")
        kwargs.pop("synchronized", None)
        super().__init__(**kwargs)

    def _moments(self, inputs, mask):
        if basics.size() == 1:
            return super()._moments(inputs, mask)
        return global_moments(inputs, list(self._reduction_axes), mask,
                              name=f"{self.name}.moments")


def global_moments(inputs, axes, mask=None, keepdims=False, name=None):
    """Mean and biased variance over `axes` of every rank's `inputs` (the
    protocol in the module doc); `mask` (one dimension less than inputs)
    leaves out masked positions."""
    x = tf.convert_to_tensor(inputs)
    if mask is None:
        weights = tf.ones_like(x)
    else:
        weights = tf.cast(tf.broadcast_to(
            tf.expand_dims(mask, -1), tf.shape(x)), x.dtype)
        x = x * weights
    count = tf.reduce_sum(weights, axis=axes, keepdims=keepdims)
    total = tf.reduce_sum(x, axis=axes, keepdims=keepdims)
    squares = tf.reduce_sum(x * x, axis=axes, keepdims=keepdims)
    stats = _ops.allreduce(tf.stack([count, total, squares]), op="sum",
                           name=name)
    count, total, squares = tf.unstack(stats)
    count = tf.maximum(count, 1.0)
    mean = total / count
    variance = tf.maximum(squares / count - tf.square(mean), 0.0)
    return mean, variance
