"""horovod.tensorflow.keras's module-level functions, with Horovod's
signatures: collectives on tensor-compatible values, the global-variable
broadcast, and load_model, which wraps a saved model's optimizer in
DistributedOptimizer. Shared by tfring.keras and tfring.keras.legacy."""

import tensorflow as tf

from tfring import Average, Sum
from tfring import ops as _ops
from tfring.compression import Compression
from tfring.keras._state import broadcast_model


def _op_of(average, op):
    if average is not None:
        if op is not None:
            raise ValueError("tfring.keras.allreduce: pass op or the "
                             "deprecated average, not both")
        return Average if average else Sum
    return Average if op is None else op


def allreduce(value, name=None, average=None, prescale_factor=1.0,
              postscale_factor=1.0, op=None, compression=Compression.none):
    """Reduces a tensor-compatible value over ranks (Average unless op or
    the deprecated average= says otherwise)."""
    return _ops.allreduce(tf.constant(value, name=name),
                          _op_of(average, op), name=name,
                          compression=compression,
                          prescale_factor=prescale_factor,
                          postscale_factor=postscale_factor)


def allgather(value, name=None):
    """Concatenates every rank's value along the first dimension."""
    return _ops.allgather(tf.constant(value, name=name), name=name)


def broadcast(value, root_rank, name=None):
    """root_rank's value, on every rank."""
    return _ops.broadcast(tf.constant(value, name=name), root_rank,
                          name=name)


def reducescatter(value, name=None, op=Average):
    """Reduces over ranks; each rank keeps its slice of the first
    dimension."""
    return _ops.reducescatter(tf.constant(value, name=name), op=op,
                              name=name)


def broadcast_global_variables(root_rank=0, model=None):
    """Horovod's broadcast_global_variables(root_rank).

    In a tf.compat.v1 graph this returns the op broadcasting every global
    variable from root_rank (as Horovod). Eagerly there are no global
    variables: pass the model (broadcast_global_variables(0, model=m), or
    the older tfring form broadcast_global_variables(m, 0)) to assign
    root_rank's weights and optimizer state to it; without one this raises,
    as Horovod does in eager mode."""
    if not isinstance(root_rank, int) and hasattr(root_rank, "variables"):
        # The older form: broadcast_global_variables(model, root_rank=0).
        root_rank, model = (0 if model is None else model), root_rank
    if model is not None:
        broadcast_model(model, int(root_rank))
        return None
    if not tf.executing_eagerly():
        return _ops.broadcast_variables(tf.compat.v1.global_variables(),
                                        int(root_rank))
    raise RuntimeError(
        "tfring.keras.broadcast_global_variables(root_rank) has no global "
        "variables to broadcast in eager mode: pass the model "
        "(broadcast_global_variables(root_rank, model=model)), or use "
        "BroadcastGlobalVariablesCallback(root_rank) in fit")


def load_model_with(keras_module, distributed_optimizer, filepath,
                    custom_optimizers=None, custom_objects=None,
                    compression=Compression.none):
    """Loads a saved model and makes its optimizer (with the state it was
    saved with) a DistributedOptimizer of the same class."""
    from tfring.keras.optimizer import _distributed_class

    objects = dict(custom_objects or {})
    for cls in custom_optimizers or []:
        objects.setdefault(cls.__name__, cls)
    model = keras_module.models.load_model(filepath,
                                           custom_objects=objects or None)
    opt = getattr(model, "optimizer", None)
    if opt is not None:
        template = distributed_optimizer(opt, compression=compression)
        # The loaded optimizer keeps its variables (iteration count, slots):
        # it becomes an instance of the reducing subclass in place.
        opt.__class__ = _distributed_class(type(opt))
        object.__setattr__(opt, "_tfring_config", template._tfring_config)
    return model


def load_model(filepath, custom_optimizers=None, custom_objects=None,
               compression=Compression.none, legacy_opts=False):
    """Horovod's load_model: loads a saved Keras model whose optimizer
    becomes a tfring DistributedOptimizer (its saved state kept), ready to
    resume training. custom_optimizers: optimizer classes the file may
    name besides Keras' own. legacy_opts is accepted for Horovod
    compatibility (Keras 3 has no legacy optimizers; use
    tfring.keras.legacy.load_model for tf_keras)."""
    import keras

    from tfring.keras.optimizer import DistributedOptimizer

    return load_model_with(keras, DistributedOptimizer, filepath,
                           custom_optimizers, custom_objects, compression)
