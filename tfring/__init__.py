"""tfring: data-parallel TensorFlow training with a ring allreduce.

    import tfring
    tfring.init()
    y = tfring.allreduce(x)                      # average over ranks
    tape = tfring.DistributedGradientTape(tape)  # in a TF2 training step

Every name loads its module on first use: the process basics (init, rank,
size, ...) the native core, the collectives and training helpers
TensorFlow. So `import tfring` (and the launcher, tfring.run) needs neither.

`import tfring as hvd` stands in for Horovod's `horovod.tensorflow`: its
names and keyword arguments are here (docs/from-horovod.md maps each one).
"""

import importlib
import os

# TFRING_GPU_COMPLETION=stream holds XLA's stream on the device (a wait on a
# word in host memory) until the engine's kernels, on a stream of their own,
# are done. CUDA maps a context's streams onto a few hardware queues
# (CUDA_DEVICE_MAX_CONNECTIONS, 8 by default); two streams that share one
# are ordered as if they were one, so the engine's kernels could queue
# behind the wait that waits for them. The most queues makes that far less
# likely. Read when the process creates its CUDA context, so it is set here,
# before TensorFlow places anything on a GPU.
if os.environ.get("TFRING_GPU_COMPLETION") == "stream":
    os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "32")

# Reduce operations, valued as the core's ReduceOp (csrc/common/types.h).
Sum = 0
Average = 1
Min = 2
Max = 3
Product = 4
# Horovod's adaptive summation; not a core op: tfring/adasum.py.
Adasum = 5

# Public name -> the module defining it (imported on first access).
_LAZY = {
    "init": "tfring.basics",
    "shutdown": "tfring.basics",
    "is_initialized": "tfring.basics",
    "size": "tfring.basics",
    "rank": "tfring.basics",
    "local_rank": "tfring.basics",
    "local_size": "tfring.basics",
    "cross_rank": "tfring.basics",
    "cross_size": "tfring.basics",
    "is_homogeneous": "tfring.basics",
    "barrier": "tfring.basics",
    "start_timeline": "tfring.basics",
    "stop_timeline": "tfring.basics",
    "mpi_threads_supported": "tfring.basics",
    "mpi_enabled": "tfring.basics",
    "mpi_built": "tfring.basics",
    "gloo_enabled": "tfring.basics",
    "gloo_built": "tfring.basics",
    "nccl_built": "tfring.basics",
    "ddl_built": "tfring.basics",
    "ccl_built": "tfring.basics",
    "cuda_built": "tfring.basics",
    "rocm_built": "tfring.basics",
    "allreduce": "tfring.ops",
    "grouped_allreduce": "tfring.ops",
    "allgather": "tfring.ops",
    "broadcast": "tfring.ops",
    "broadcast_variables": "tfring.ops",
    "reducescatter": "tfring.ops",
    "grouped_allgather": "tfring.ops",
    "grouped_reducescatter": "tfring.ops",
    "broadcast_": "tfring.ops",
    "broadcast_global_variables": "tfring.ops",
    "BroadcastGlobalVariablesHook": "tfring.hooks",
    "rank_op": "tfring.ops",
    "local_rank_op": "tfring.ops",
    "size_op": "tfring.ops",
    "local_size_op": "tfring.ops",
    "process_set_included_op": "tfring.ops",
    "allgather_object": "tfring.functions",
    "broadcast_object": "tfring.functions",
    "broadcast_object_fn": "tfring.functions",
    "alltoall": "tfring.ops",
    "join": "tfring.ops",
    "Compression": "tfring.compression",
    "DistributedGradientTape": "tfring.optimizers",
    "DistributedOptimizer": "tfring.optimizers",
    "PartialDistributedGradientTape": "tfring.optimizers",
    "SyncBatchNormalization": "tfring.keras",
    "ProcessSet": "tfring.process_sets",
    "global_process_set": "tfring.process_sets",
    "add_process_set": "tfring.process_sets",
    "remove_process_set": "tfring.process_sets",
    "process_set_by_id": "tfring.process_sets",
    # The function shadows its module once loaded; an explicit
    # `import tfring.rewrite` before first use leaves the module here instead.
    "rewrite": "tfring.rewrite",
    # Horovod's horovod.tensorflow re-exports this helper of its util module,
    # and code written for it calls hvd._executing_eagerly().
    "_executing_eagerly": "tfring.util",
    # Horovod's horovod.run (horovod.runner.run): a function run as a job.
    "run_fn": "tfring.runner",
}

# Subpackages reachable as attributes (tfring.keras.callbacks...) without an
# explicit import; importing one loads its framework, so only on first use.
_SUBPACKAGES = ("keras", "elastic", "util")

__all__ = ["Sum", "Average", "Min", "Max", "Product", "Adasum"] + [
    n for n in _LAZY if not n.startswith("_")]


def _tf_keras_is_legacy():
    """True when tf.keras means tf_keras (Keras 2): TensorFlow's own test of
    TF_USE_LEGACY_KERAS (tensorflow/python/util/lazy_loader.py)."""
    return os.environ.get("TF_USE_LEGACY_KERAS") in ("true", "True", "1")


def __getattr__(name):
    if name in _SUBPACKAGES:
        return importlib.import_module(f"tfring.{name}")
    if name == "SyncBatchNormalization" and _tf_keras_is_legacy():
        # Horovod's horovod.tensorflow.SyncBatchNormalization subclasses
        # tf.keras' BatchNormalization, whichever Keras that is; a Keras 3
        # layer among tf_keras layers cannot be run by a tf.compat.v1 Session.
        value = importlib.import_module("tfring.keras.legacy").SyncBatchNormalization
        globals()[name] = value
        return value
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'tfring' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY) | set(_SUBPACKAGES))
