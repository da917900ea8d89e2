"""tfring.keras for tf_keras (Keras 2, `pip install tf_keras`; what
tf.keras means with TF_USE_LEGACY_KERAS=1): the same callbacks,
DistributedOptimizer and the rest of horovod.tensorflow.keras, bound to
tf_keras.

    import tfring.keras.legacy as tk
    model.fit(x, y, callbacks=[tk.callbacks.RingAllreduceCallback()])
"""

import types

import tf_keras

from tfring.keras import (  # noqa: F401 - the framework-independent API
    Average,
    Compression,
    DistributedGradientTape,
    PartialDistributedGradientTape,
    Sum,
    allgather,
    allreduce,
    average_metrics,
    broadcast,
    broadcast_global_variables,
    broadcast_variables,
    cross_rank,
    cross_size,
    init,
    is_initialized,
    local_rank,
    local_size,
    rank,
    reducescatter,
    shard,
    shutdown,
    size,
)
from tfring.keras.callbacks import (
    _BroadcastGlobalVariables,
    _best_model_checkpoint,
    _LearningRateSchedule,
    _LearningRateWarmup,
    _MetricAverage,
    _RingAllreduce,
)
from tfring.keras import elastic as _elastic
from tfring.keras.checkpoint import _ResumableCheckpoint
from tfring.keras.horovod import load_model_with
from tfring.keras.optimizer import (  # noqa: F401 - work for both
    DistributedOptimizer,
    PartialDistributedOptimizer,
)
from tfring.keras.sync_batch_norm import global_moments
from tfring import basics as _basics


class BroadcastGlobalVariablesCallback(_BroadcastGlobalVariables,
                                       tf_keras.callbacks.Callback):
    __doc__ = _BroadcastGlobalVariables.__doc__


class MetricAverageCallback(_MetricAverage, tf_keras.callbacks.Callback):
    __doc__ = _MetricAverage.__doc__


class LearningRateWarmupCallback(_LearningRateWarmup,
                                 tf_keras.callbacks.Callback):
    __doc__ = _LearningRateWarmup.__doc__


class LearningRateScheduleCallback(_LearningRateSchedule,
                                   tf_keras.callbacks.Callback):
    __doc__ = _LearningRateSchedule.__doc__


class RingAllreduceCallback(_RingAllreduce, tf_keras.callbacks.Callback):
    __doc__ = _RingAllreduce.__doc__


class ResumableCheckpointCallback(_ResumableCheckpoint,
                                  tf_keras.callbacks.Callback):
    __doc__ = _ResumableCheckpoint.__doc__


BestModelCheckpoint = _best_model_checkpoint(
    tf_keras.callbacks.ModelCheckpoint)


class SyncBatchNormalization(tf_keras.layers.BatchNormalization):
    """tf_keras BatchNormalization with statistics over every rank's batch
    during training (see tfring.keras.SyncBatchNormalization)."""

    def __init__(self, fused=False, **kwargs):
        if fused:
            raise ValueError("SyncBatchNormalization does not support "
                             "fused=True")
        if not kwargs.get("name"):
            kwargs["name"] = "sync_batch_normalization"
        super().__init__(fused=False, **kwargs)

    def _moments(self, inputs, reduction_axes, keep_dims, mask=None):
        if _basics.size() == 1:
            return super()._moments(inputs, reduction_axes, keep_dims,
                                    mask=mask)
        return global_moments(inputs, list(reduction_axes), mask,
                              keepdims=keep_dims, name=f"{self.name}.moments")


def load_model(filepath, custom_optimizers=None, custom_objects=None,
               compression=Compression.none, legacy_opts=False):
    """Horovod's load_model on tf_keras: the loaded model's optimizer (and
    its saved state) becomes a tfring DistributedOptimizer."""
    return load_model_with(tf_keras, DistributedOptimizer, filepath,
                           custom_optimizers, custom_objects, compression)


class _LegacyKerasState(_elastic.KerasState):
    __doc__ = _elastic.KerasState.__doc__
    _backend = tf_keras.backend


class _CommitStateCallback(_elastic._CommitState, tf_keras.callbacks.Callback):
    __doc__ = _elastic._CommitState.__doc__


class _UpdateBatchStateCallback(_elastic._UpdateBatchState,
                                tf_keras.callbacks.Callback):
    __doc__ = _elastic._UpdateBatchState.__doc__


class _UpdateEpochStateCallback(_elastic._UpdateEpochState,
                                tf_keras.callbacks.Callback):
    __doc__ = _elastic._UpdateEpochState.__doc__


# horovod.tensorflow.keras.elastic on tf_keras.
elastic = types.SimpleNamespace(
    KerasState=_LegacyKerasState,
    CommitStateCallback=_CommitStateCallback,
    UpdateBatchStateCallback=_UpdateBatchStateCallback,
    UpdateEpochStateCallback=_UpdateEpochStateCallback,
    run=_elastic.run,
    ObjectState=_elastic.ObjectState,
    State=_elastic.State,
    HorovodInternalError=_elastic.HorovodInternalError,
    HostsUpdatedInterrupt=_elastic.HostsUpdatedInterrupt,
)


def __getattr__(name):
    # The framework-independent names horovod.tensorflow.keras re-exports
    # from horovod.tensorflow (process sets, timeline, build queries).
    from tfring import keras as _k3

    if name in _k3._FROM_TFRING:
        return getattr(_k3, name)
    raise AttributeError(
        f"module 'tfring.keras.legacy' has no attribute {name!r}")


callbacks = types.SimpleNamespace(
    ResumableCheckpointCallback=ResumableCheckpointCallback,
    BroadcastGlobalVariablesCallback=BroadcastGlobalVariablesCallback,
    MetricAverageCallback=MetricAverageCallback,
    LearningRateWarmupCallback=LearningRateWarmupCallback,
    LearningRateScheduleCallback=LearningRateScheduleCallback,
    RingAllreduceCallback=RingAllreduceCallback,
    BestModelCheckpoint=BestModelCheckpoint,
)
