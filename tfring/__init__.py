"""tfring: data-parallel TensorFlow training with a ring allreduce.

    import tfring
    tfring.init()
    y = tfring.allreduce(x)                      # average over ranks
    tape = tfring.DistributedGradientTape(tape)  # in a TF2 training step

The process basics (init, rank, size, ...) load only the native core. The
TensorFlow parts (collectives, training helpers, compression) load on first
use, so `import tfring` stays cheap for the launcher and for tools that do
not use TensorFlow.
"""

import importlib

# Reduce operations, valued as the core's ReduceOp (csrc/common/types.h).
Sum = 0
Average = 1
Min = 2
Max = 3
Product = 4

from tfring.basics import (
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

# Public name -> the module defining it (imported on first access).
_LAZY = {
    "allreduce": "tfring.ops",
    "grouped_allreduce": "tfring.ops",
    "allgather": "tfring.ops",
    "broadcast": "tfring.ops",
    "broadcast_variables": "tfring.ops",
    "reducescatter": "tfring.ops",
    "Compression": "tfring.compression",
    "DistributedGradientTape": "tfring.optimizers",
    "DistributedOptimizer": "tfring.optimizers",
}

__all__ = [
    "init", "shutdown", "is_initialized", "size", "rank", "local_rank",
    "local_size", "cross_rank", "cross_size",
    "Sum", "Average", "Min", "Max", "Product",
] + list(_LAZY)


def __getattr__(name):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'tfring' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
