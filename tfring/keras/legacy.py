"""tfring.keras for tf_keras (Keras 2, `pip install tf_keras`; what
tf.keras means with TF_USE_LEGACY_KERAS=1): the same callbacks and
DistributedOptimizer, bound to tf_keras.

    import tfring.keras.legacy as tk
    model.fit(x, y, callbacks=[tk.callbacks.RingAllreduceCallback()])
"""

import types

import tf_keras

from tfring.keras import (  # noqa: F401 - the framework-independent API
    Average,
    Compression,
    Sum,
    average_metrics,
    broadcast_global_variables,
    broadcast_variables,
    init,
    local_rank,
    local_size,
    rank,
    shard,
    shutdown,
    size,
)
from tfring.keras.callbacks import (
    _BroadcastGlobalVariables,
    _LearningRateWarmup,
    _MetricAverage,
    _RingAllreduce,
)
from tfring.keras.checkpoint import _ResumableCheckpoint
from tfring.keras.optimizer import DistributedOptimizer  # noqa: F401 - works for both


class BroadcastGlobalVariablesCallback(_BroadcastGlobalVariables,
                                       tf_keras.callbacks.Callback):
    __doc__ = _BroadcastGlobalVariables.__doc__


class MetricAverageCallback(_MetricAverage, tf_keras.callbacks.Callback):
    __doc__ = _MetricAverage.__doc__


class LearningRateWarmupCallback(_LearningRateWarmup,
                                 tf_keras.callbacks.Callback):
    __doc__ = _LearningRateWarmup.__doc__


class RingAllreduceCallback(_RingAllreduce, tf_keras.callbacks.Callback):
    __doc__ = _RingAllreduce.__doc__


class ResumableCheckpointCallback(_ResumableCheckpoint,
                                  tf_keras.callbacks.Callback):
    __doc__ = _ResumableCheckpoint.__doc__


callbacks = types.SimpleNamespace(
    ResumableCheckpointCallback=ResumableCheckpointCallback,
    BroadcastGlobalVariablesCallback=BroadcastGlobalVariablesCallback,
    MetricAverageCallback=MetricAverageCallback,
    LearningRateWarmupCallback=LearningRateWarmupCallback,
    RingAllreduceCallback=RingAllreduceCallback,
)
