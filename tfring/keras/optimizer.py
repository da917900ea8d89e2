"""tfring.keras.DistributedOptimizer: a Keras optimizer whose public apply
methods allreduce the gradients before updating (Horovod's API), and
PartialDistributedOptimizer, which leaves some layers' gradients local."""

from tfring import Average
from tfring.compression import Compression
from tfring.keras._state import (
    GradientConfig,
    reducing_apply,
    reducing_apply_gradients,
)
from tfring.gradient_reduction import check_groups, local_layer_variables

_classes = {}


def _distributed_class(cls):
    """A subclass of `cls` overriding its public apply methods. It keeps the
    name and module of `cls`, so a saved model records the plain optimizer
    and loads without tfring."""
    if getattr(cls, "_tfring_base", None) is not None:
        cls = cls._tfring_base
    if cls in _classes:
        return _classes[cls]

    def apply(self, grads, *args, **kwargs):
        orig = super(sub, self).apply
        return reducing_apply(orig, self._tfring_config, self)(
            grads, *args, **kwargs)

    def apply_gradients(self, grads_and_vars, *args, **kwargs):
        orig = super(sub, self).apply_gradients
        return reducing_apply_gradients(orig, self._tfring_config, self)(
            grads_and_vars, *args, **kwargs)

    def register_local_var(self, var):
        """This variable's gradient is not reduced (Horovod's local
        variables; PartialDistributedOptimizer registers whole layers)."""
        self._tfring_config.register_local(var)

    body = {"__module__": cls.__module__, "__qualname__": cls.__qualname__,
            "__doc__": cls.__doc__, "_tfring_base": cls,
            "apply_gradients": apply_gradients,
            "register_local_var": register_local_var}
    if hasattr(cls, "apply"):
        body["apply"] = apply
    sub = type(cls.__name__, (cls,), body)
    _classes[cls] = sub
    return sub


def DistributedOptimizer(optimizer, name=None, device_dense="",
                         device_sparse="", compression=Compression.none,
                         sparse_as_dense=False, gradient_predivide_factor=1.0,
                         op=Average, backward_passes_per_step=1,
                         average_aggregated_gradients=False, num_groups=0,
                         groups=None, process_set=None,
                         scale_local_gradients=True, fusion_threshold=None):
    """Returns a copy of a Keras optimizer (built from its config) whose
    `apply` / `apply_gradients` average (op=Average) or sum (op=Sum) the
    gradients over all ranks first, fused into few allreduce ops; sparse
    gradients are allgathered unless sparse_as_dense=True.

        opt = tfring.keras.DistributedOptimizer(keras.optimizers.SGD(0.01 * size))
        model.compile(optimizer=opt, ...)

    Works with Keras 3 and tf_keras optimizers. Gradient clipping
    (clipnorm, global_clipnorm) applies to the reduced gradients. To use
    loss scaling, wrap the LossScaleOptimizer (not the other way round) so
    every rank sees the same reduced gradients when checking them.

    backward_passes_per_step=N (Horovod's semantics): each rank sums its
    gradients over N passes locally; every N-th pass reduces that sum over
    ranks and applies it (divided by N with average_aggregated_gradients=
    True); the other passes only advance optimizer.iterations.

    device_dense/device_sparse are accepted for Horovod compatibility and
    ignored; num_groups/groups are validated and left to the engine's
    fusion (the result does not depend on them). fusion_threshold (bytes)
    bounds one fused allreduce.
    """
    check_groups(num_groups, groups)
    config = GradientConfig(op, compression, fusion_threshold,
                            sparse_as_dense, gradient_predivide_factor,
                            process_set, scale_local_gradients,
                            backward_passes_per_step,
                            average_aggregated_gradients)
    sub = _distributed_class(type(optimizer))
    cfg = optimizer.get_config()
    if name is not None:
        cfg["name"] = name
    new = sub.from_config(cfg)
    object.__setattr__(new, "_tfring_config", config)
    config.track_state(new)
    return new


def PartialDistributedOptimizer(optimizer, name=None, device_dense="",
                                device_sparse="",
                                compression=Compression.none,
                                sparse_as_dense=False,
                                gradient_predivide_factor=1.0, op=Average,
                                backward_passes_per_step=1,
                                average_aggregated_gradients=False,
                                groups=None, process_set=None,
                                local_layers=None, scale_local_gradients=True):
    """A DistributedOptimizer that does not reduce the gradients of
    `local_layers` (a Keras layer or a list of them): each rank applies its
    own, divided by the number of ranks when scale_local_gradients (as
    Horovod does). Local layers' weights diverge between ranks by design;
    keep them out of the broadcast with
    BroadcastGlobalVariablesCallback(local_variables=...)."""
    opt = DistributedOptimizer(
        optimizer, name=name, device_dense=device_dense,
        device_sparse=device_sparse, compression=compression,
        sparse_as_dense=sparse_as_dense,
        gradient_predivide_factor=gradient_predivide_factor, op=op,
        backward_passes_per_step=backward_passes_per_step,
        average_aggregated_gradients=average_aggregated_gradients,
        groups=groups, process_set=process_set,
        scale_local_gradients=scale_local_gradients)
    for var in local_layer_variables(local_layers):
        opt.register_local_var(var)
    return opt
