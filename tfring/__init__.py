"""tfring: data-parallel TensorFlow training with a ring allreduce.

    import tfring
    tfring.init()
    y = tfring.allreduce(x)                      # average over ranks
    tape = tfring.DistributedGradientTape(tape)  # in a TF2 training step

Every name loads its module on first use: the process basics (init, rank,
size, ...) the native core, the collectives and training helpers
TensorFlow. So `import tfring` (and the launcher, tfring.run) needs neither.
"""

import importlib

# Reduce operations, valued as the core's ReduceOp (csrc/common/types.h).
Sum = 0
Average = 1
Min = 2
Max = 3
Product = 4

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
    "allreduce": "tfring.ops",
    "grouped_allreduce": "tfring.ops",
    "allgather": "tfring.ops",
    "broadcast": "tfring.ops",
    "broadcast_variables": "tfring.ops",
    "reducescatter": "tfring.ops",
    "Compression": "tfring.compression",
    "DistributedGradientTape": "tfring.optimizers",
    "DistributedOptimizer": "tfring.optimizers",
    # The function shadows its module once loaded; an explicit
    # `import tfring.rewrite` before first use leaves the module here instead.
    "rewrite": "tfring.rewrite",
}

# Subpackages reachable as attributes (tfring.keras.callbacks...) without an
# explicit import; importing one loads its framework, so only on first use.
_SUBPACKAGES = ("keras", "elastic")

__all__ = ["Sum", "Average", "Min", "Max", "Product"] + list(_LAZY)


def __getattr__(name):
    if name in _SUBPACKAGES:
        return importlib.import_module(f"tfring.{name}")
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'tfring' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY) | set(_SUBPACKAGES))
