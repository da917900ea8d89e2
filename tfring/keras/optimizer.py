"""tfring.keras.DistributedOptimizer: a Keras optimizer whose public apply
methods allreduce the gradients before updating (Horovod's API)."""

from tfring import Average
from tfring.compression import Compression
from tfring.keras._state import GradientConfig, reducing_apply, reducing_apply_gradients

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
        return reducing_apply(orig, self._tfring_config)(grads, *args, **kwargs)

    def apply_gradients(self, grads_and_vars, *args, **kwargs):
        orig = super(sub, self).apply_gradients
        return reducing_apply_gradients(orig, self._tfring_config)(
            grads_and_vars, *args, **kwargs)

    body = {"__module__": cls.__module__, "__qualname__": cls.__qualname__,
            "__doc__": cls.__doc__, "_tfring_base": cls,
            "apply_gradients": apply_gradients}
    if hasattr(cls, "apply"):
        body["apply"] = apply
    sub = type(cls.__name__, (cls,), body)
    _classes[cls] = sub
    return sub


def DistributedOptimizer(optimizer, name=None, device_dense="",
                         device_sparse="", compression=Compression.none,
                         sparse_as_dense=False, op=Average,
                         gradient_predivide_factor=1.0,
                         backward_passes_per_step=1,
                         fusion_threshold=None):
    """Returns a copy of a Keras optimizer (built from its config) whose
    `apply` / `apply_gradients` average (op=Average) or sum (op=Sum) the
    gradients over all ranks first, fused into few allreduce ops; sparse
    gradients are allgathered unless sparse_as_dense=True.

        opt = tfring.keras.DistributedOptimizer(keras.optimizers.SGD(0.01 * size))
        model.compile(optimizer=opt, ...)

    Works with Keras 3 (and tf_keras) optimizers. Gradient clipping
    (clipnorm, global_clipnorm) applies to the reduced gradients. To use
    loss scaling, wrap the LossScaleOptimizer (not the other way round) so
    every rank sees the same reduced gradients when checking them.

    backward_passes_per_step=N maps onto the optimizer's own
    gradient_accumulation_steps (gradients are still reduced every step).
    device_dense/device_sparse are accepted for Horovod compatibility.
    """
    config = GradientConfig(op, compression, fusion_threshold,
                            sparse_as_dense, gradient_predivide_factor)
    sub = _distributed_class(type(optimizer))
    cfg = optimizer.get_config()
    if name is not None:
        cfg["name"] = name
    if int(backward_passes_per_step) > 1:
        if "gradient_accumulation_steps" not in cfg:
            raise ValueError("tfring.keras.DistributedOptimizer: this "
                             "optimizer has no gradient_accumulation_steps; "
                             "backward_passes_per_step needs Keras 3")
        cfg["gradient_accumulation_steps"] = int(backward_passes_per_step)
    new = sub.from_config(cfg)
    object.__setattr__(new, "_tfring_config", config)
    return new
