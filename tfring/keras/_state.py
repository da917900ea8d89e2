"""Shared pieces of the Keras integration: which Keras is in use, gradient
reduction inside an optimizer's public apply methods, broadcasting a model's
state, and averaging logs."""

import functools

import numpy as np

from tfring import Average, basics
from tfring import gradient_reduction as _reduction
from tfring.compression import Compression
from tfring.rewrite import (
    _depth,
    _nested,
    average_scalars,
    broadcast_values,
    reduce_gradients,
)


class GradientConfig:
    """How gradients are reduced: op (Average or Sum), compression, fusion
    bucket size, sparse handling, Horovod's predivide factor, the process
    set, the local (unreduced) variables and local accumulation over
    backward_passes_per_step passes."""

    def __init__(self, op=Average, compression=Compression.none,
                 fusion_threshold=None, sparse_as_dense=False,
                 gradient_predivide_factor=1.0, process_set=None,
                 scale_local_gradients=True, backward_passes_per_step=1,
                 average_aggregated_gradients=False):
        from tfring._collectives import reduce_op_name

        name = reduce_op_name(op)
        if name not in ("sum", "average"):
            raise ValueError("tfring.keras: gradients are averaged or summed "
                             "over ranks (op=tfring.Average or tfring.Sum)")
        if gradient_predivide_factor != 1.0 and name != "average":
            raise ValueError("tfring.keras: gradient_predivide_factor needs "
                             "op=Average")
        passes = int(backward_passes_per_step)
        if passes < 1:
            raise ValueError(f"tfring.keras: backward_passes_per_step must be "
                             f">= 1, got {backward_passes_per_step}")
        self.op = op
        self.op_name = name
        self.compression = compression
        self.fusion_threshold = fusion_threshold
        self.sparse_as_dense = sparse_as_dense
        self.predivide = float(gradient_predivide_factor)
        self.process_set = _reduction.resolve_process_set(process_set)
        self.scale_local = bool(scale_local_gradients)
        self.local_keys = set()
        self.passes = passes
        self.average_passes = bool(average_aggregated_gradients)
        self.accumulator = None
        if passes > 1:
            from tfring.keras._accumulate import KerasAccumulator

            self.accumulator = KerasAccumulator(passes,
                                                self.average_passes)

    def register_local(self, variable):
        self.local_keys.update(_reduction.var_keys(variable))

    def is_local(self, variable):
        return bool(self.local_keys) and not self.local_keys.isdisjoint(
            _reduction.var_keys(variable))

    def _reduce_all(self, grads, variables=None):
        if self.process_set is not None:
            return _reduction.GradientReducer(
                self.op, self.compression, self.sparse_as_dense,
                self.predivide, "DistributedOptimizer_Allreduce",
                self.process_set).reduce(grads, variables)
        op, pre, post = self.op, 1.0, 1.0
        if self.predivide != 1.0:
            # Split the average's 1/size around the sum (keeps fp16 in range).
            op, pre, post = "sum", 1.0 / self.predivide, \
                self.predivide / basics.size()
        return reduce_gradients(grads, op, self.compression,
                                self.fusion_threshold, self.sparse_as_dense,
                                prescale_factor=pre, postscale_factor=post,
                                variables=variables)

    def reduce(self, grads, variables=None):
        grads = list(grads)
        if variables is None or not self.local_keys:
            return self._reduce_all(grads, variables)
        return _reduction.reduce_skipping_locals(
            self._reduce_all, grads, variables, self.is_local,
            self.scale_local, _reduction.set_size(self.process_set))

    def track_state(self, optimizer):
        """Makes a stateful compressor (PowerSGD) a dependency of the
        optimizer, so a tf.train.Checkpoint of the optimizer saves and
        restores its state."""
        _reduction.track_compression(optimizer, self.compression)


def _variables_arg(optimizer, args, kwargs):
    variables = args[0] if args else kwargs.get("trainable_variables")
    if variables is None and optimizer is not None:
        variables = getattr(optimizer, "_trainable_variables", None)
    return None if variables is None else list(variables)


def reducing_apply(orig, config, optimizer=None):
    # config: a GradientConfig, or a function returning the current one.
    """optimizer.apply(grads, trainable_variables=None, ...) that reduces
    the gradients first (or accumulates them, with backward passes); nested
    apply calls (apply_gradients -> apply, a LossScaleOptimizer's inner
    optimizer) reduce nothing again."""

    @functools.wraps(orig)
    def apply(grads, *args, **kwargs):
        if _depth() > 0:
            with _nested():
                return orig(grads, *args, **kwargs)
        cfg = _current(config)
        grads = list(grads)
        variables = _variables_arg(optimizer, args, kwargs)
        if cfg.accumulator is not None:
            if variables is None:
                raise ValueError("tfring.keras: backward_passes_per_step "
                                 "needs the variables: apply(grads, "
                                 "trainable_variables)")

            def apply_fn(reduced):
                with _nested():
                    return orig(reduced, *args, **kwargs)
            return cfg.accumulator.step(optimizer, grads, variables,
                                        cfg.reduce, apply_fn)
        grads = cfg.reduce(grads, variables)
        with _nested():
            return orig(grads, *args, **kwargs)
    return apply


def _current(config):
    return config() if callable(config) else config


def reducing_apply_gradients(orig, config, optimizer=None):
    """optimizer.apply_gradients(grads_and_vars, ...) reducing first."""

    @functools.wraps(orig)
    def apply_gradients(grads_and_vars, *args, **kwargs):
        if _depth() > 0:
            with _nested():
                return orig(grads_and_vars, *args, **kwargs)
        cfg = _current(config)
        pairs = list(grads_and_vars)
        grads = [g for g, _ in pairs]
        variables = [v for _, v in pairs]
        if cfg.accumulator is not None:
            def apply_fn(reduced):
                with _nested():
                    return orig(list(zip(reduced, variables)),
                                *args, **kwargs)
            return cfg.accumulator.step(optimizer, grads, variables,
                                        cfg.reduce, apply_fn)
        grads = cfg.reduce(grads, variables)
        with _nested():
            return orig(list(zip(grads, variables)), *args, **kwargs)
    return apply_gradients


def distribute_instance(optimizer, config):
    """Makes this optimizer object reduce gradients in its public apply
    methods (instance attributes shadowing the class's; the class, its
    config and its checkpoints are unchanged). Idempotent."""
    if getattr(optimizer, "_tfring_config", None) is not None:
        object.__setattr__(optimizer, "_tfring_config", config)
        config.track_state(optimizer)
        return optimizer
    for name, wrap in (("apply", reducing_apply),
                       ("apply_gradients", reducing_apply_gradients)):
        orig = getattr(optimizer, name, None)
        if orig is not None:
            object.__setattr__(optimizer, name, wrap(
                orig, lambda: optimizer._tfring_config, optimizer))
    object.__setattr__(optimizer, "_tfring_config", config)
    config.track_state(optimizer)
    return optimizer


def optimizer_variables(optimizer):
    if optimizer is None:
        return []
    variables = getattr(optimizer, "variables", None)
    if callable(variables):  # tf_keras legacy optimizers
        variables = variables()
    return list(variables or [])


def agree(count, what):
    """Checks every rank has the same count of something to broadcast."""
    if basics.size() == 1:
        return
    from tfring import _core

    most, least = _core.allreduce(np.array([count, -count], np.int64),
                                  op="max", name=f"tfring.keras.count.{what}")
    if most != -least:
        raise RuntimeError(
            f"tfring.keras: ranks hold different numbers of {what} "
            f"({-least} to {most}; this rank {count}); build the same model "
            f"and optimizer on every rank before broadcasting")


def broadcast_model(model, root_rank=0, optimizer=True, exclude=None):
    """Broadcasts the model's variables (trainable or not) and, if built,
    its optimizer's state from root_rank. Optimizers that exist but are
    unbuilt on some ranks are built first, so restored state on root_rank
    reaches every rank. `exclude`: ids (tfring.gradient_reduction.var_keys) of
    model variables that keep each rank's value."""
    variables = list(model.variables)
    if exclude:
        variables = [v for v in variables
                     if exclude.isdisjoint(_reduction.var_keys(v))]
    agree(len(variables), "model variables")
    broadcast_values(variables, root_rank, name="tfring.keras.weights")
    opt = getattr(model, "optimizer", None) if optimizer else None
    if opt is None:
        return
    built = bool(getattr(opt, "built", True))
    if basics.size() > 1:
        from tfring import _core

        any_built = _core.allreduce(np.array([int(built)], np.int64),
                                    op="max", name="tfring.keras.opt_built")
        if int(any_built[0]) and not built and hasattr(opt, "build"):
            opt.build(model.trainable_variables)
    state = optimizer_variables(opt)
    agree(len(state), "optimizer variables")
    broadcast_values(state, root_rank, name="tfring.keras.optimizer")


def average_logs(logs):
    """Averages the numeric values of a Keras logs dict over ranks, in
    place (later callbacks see the averages)."""
    if logs is None:
        return logs
    numeric = {k: v for k, v in logs.items()
               if isinstance(v, (int, float, np.number)) and not isinstance(v, bool)}
    agree(len(numeric), "logged metrics")
    logs.update(average_scalars(numeric, name="tfring.keras.metrics"))
    return logs
