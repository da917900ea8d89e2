"""tfring for Keras 3 (the Keras TensorFlow 2.21 ships).

The one-line way:

    model.fit(x, y, callbacks=[tfring.keras.callbacks.RingAllreduceCallback()])

Horovod-style, one piece at a time (a horovod.tensorflow.keras script
runs with `import tfring.keras as hvd`; see docs/from-horovod-keras.md):

    import tfring.keras as tk
    tk.init()
    opt = tk.DistributedOptimizer(keras.optimizers.SGD(0.01 * tk.size()))
    model.compile(optimizer=opt, loss=...)
    model.fit(x, y, callbacks=[
        tk.callbacks.BroadcastGlobalVariablesCallback(0),
        tk.callbacks.MetricAverageCallback(),
        tk.callbacks.LearningRateWarmupCallback(0.01 * tk.size(), 5),
    ], verbose=1 if tk.rank() == 0 else 0)

Resuming after a failure (rank 0 writes, every rank restores):

    ckpt = tk.callbacks.ResumableCheckpointCallback("ckpt/")
    model.fit(x, y, initial_epoch=ckpt.restore(model), callbacks=[
        tk.callbacks.RingAllreduceCallback(), ckpt])
"""

import keras as _keras

if _keras.backend.backend() != "tensorflow":
    raise ImportError(
        f"tfring.keras needs Keras' TensorFlow backend; KERAS_BACKEND is "
        f"{_keras.backend.backend()!r}. Set KERAS_BACKEND=tensorflow.")

from tfring import (  # noqa: F401 - re-exported
    Average,
    Max,
    Min,
    Product,
    Sum,
    cross_rank,
    cross_size,
    init,
    is_initialized,
    local_rank,
    local_size,
    rank,
    shutdown,
    size,
)
from tfring import basics as _basics
from tfring.compression import Compression  # noqa: F401
from tfring.keras import callbacks  # noqa: F401
from tfring.keras._state import average_logs, broadcast_model
from tfring.keras.callbacks import (  # noqa: F401
    BestModelCheckpoint,
    BroadcastGlobalVariablesCallback,
    LearningRateScheduleCallback,
    LearningRateWarmupCallback,
    MetricAverageCallback,
    ResumableCheckpointCallback,
    RingAllreduceCallback,
)
from tfring.keras.checkpoint import restore_checkpoint  # noqa: F401
from tfring.keras import elastic  # noqa: F401,E402 - hvd.elastic.KerasState...
from tfring.keras.horovod import (  # noqa: F401
    allgather,
    allreduce,
    broadcast,
    broadcast_global_variables,
    load_model,
    reducescatter,
)
from tfring.keras.optimizer import (  # noqa: F401
    DistributedOptimizer,
    PartialDistributedOptimizer,
)
from tfring.keras.sync_batch_norm import SyncBatchNormalization  # noqa: F401
from tfring.optimizers import (  # noqa: F401
    DistributedGradientTape,
    PartialDistributedGradientTape,
)
from tfring.rewrite import broadcast_values

# Horovod's horovod.tensorflow.keras also re-exports these from
# horovod.tensorflow; here they resolve to tfring's names of the same
# meaning, when this build has them.
_FROM_TFRING = (
    "start_timeline", "stop_timeline", "mpi_threads_supported",
    "mpi_enabled", "mpi_built", "gloo_enabled", "gloo_built", "nccl_built",
    "ddl_built", "ccl_built", "cuda_built", "rocm_built", "ProcessSet",
    "global_process_set", "add_process_set", "remove_process_set",
)


def __getattr__(name):
    if name in _FROM_TFRING:
        import tfring

        try:
            return getattr(tfring, name)
        except AttributeError:
            pass
    raise AttributeError(f"module 'tfring.keras' has no attribute {name!r}")


def broadcast_variables(variables, root_rank=0):
    """Assigns root_rank's values to these Keras (or TF) variables, eagerly."""
    broadcast_values(variables, root_rank, name="tfring.keras.variables")


def average_metrics(logs):
    """Averages a dict of numbers over ranks in place; returns it."""
    return average_logs(logs)


def shard(*arrays, rank=None, size=None):  # noqa: F811 - keyword names
    """This rank's rows of each array: rows rank, rank + size, ... (equal
    counts on every rank; the last len % size rows are dropped so every rank
    runs the same number of steps)."""
    rank = _basics.rank() if rank is None else rank
    size = _basics.size() if size is None else size
    out = []
    for a in arrays:
        n = (len(a) // size) * size
        out.append(a[rank:n:size])
    return out[0] if len(out) == 1 else tuple(out)
