"""Keras callbacks that make model.fit data-parallel.

    model.fit(x_shard, y_shard, callbacks=[
        tfring.keras.callbacks.RingAllreduceCallback()])

RingAllreduceCallback is the one-line way. Put it first in the list, so the
callbacks after it see metrics averaged over ranks. The Horovod-style pieces
(BroadcastGlobalVariablesCallback, MetricAverageCallback,
LearningRateWarmupCallback, with tfring.keras.DistributedOptimizer) do one
job each. ResumableCheckpointCallback writes checkpoints from rank 0 and
restores the newest on every rank, so a killed job resumes where it stopped.
"""

import keras
import numpy as np

from tfring import Average, basics
from tfring import ops as _ops
from tfring.compression import Compression
from tfring.keras._state import (
    GradientConfig,
    average_logs,
    broadcast_model,
    distribute_instance,
)
from tfring.keras.checkpoint import _ResumableCheckpoint

__all__ = [
    "BroadcastGlobalVariablesCallback",
    "LearningRateWarmupCallback",
    "MetricAverageCallback",
    "ResumableCheckpointCallback",
    "RingAllreduceCallback",
]


def _ensure_init():
    if not basics.is_initialized():
        basics.init()


def _print0(msg):
    if basics.rank() == 0:
        print(msg, flush=True)


class _BroadcastGlobalVariables:
    """At the start of the first fit, assigns root_rank's model weights and
    optimizer state to every rank, so all ranks start equal (after random
    initialization or after root_rank alone restored a checkpoint)."""

    def __init__(self, root_rank=0):
        super().__init__()
        _ensure_init()
        self.root_rank = int(root_rank)
        self.broadcast_done = False

    def _broadcast(self):
        broadcast_model(self.model, self.root_rank)
        self.broadcast_done = True

    def on_train_begin(self, logs=None):
        # Keras builds the model and its optimizer before fit calls
        # on_train_begin; a model it could not build waits for its first
        # batch.
        if not self.broadcast_done and self.model.variables:
            self._broadcast()

    def on_train_batch_end(self, batch, logs=None):
        if not self.broadcast_done:
            self._broadcast()


class _MetricAverage:
    """Averages the epoch-end metrics (loss, metrics, val_*) over ranks, in
    place, so callbacks after it (History, ModelCheckpoint(save_best_only),
    EarlyStopping, ReduceLROnPlateau) decide the same on every rank."""

    def on_epoch_end(self, epoch, logs=None):
        average_logs(logs)


class _LearningRateWarmup:
    """Linear learning-rate warm-up for large-batch training (Goyal et al.
    2017, "Accurate, Large Minibatch SGD"): with the learning rate scaled
    linearly by the number of ranks (initial_lr = base_lr * size), training
    starts at initial_lr / size and ramps linearly, batch by batch, to
    initial_lr at the end of warmup_epochs.

    steps_per_epoch defaults to what fit reports. momentum_correction is
    accepted for Horovod compatibility: Keras 3 compiles the momentum into
    the train step, so it is not rescaled.
    """

    def __init__(self, initial_lr, warmup_epochs=5, momentum_correction=True,
                 steps_per_epoch=None, verbose=0):
        super().__init__()
        _ensure_init()
        self.initial_lr = float(initial_lr)
        self.warmup_epochs = float(warmup_epochs)
        self.momentum_correction = momentum_correction
        self.steps_per_epoch = steps_per_epoch
        self.verbose = verbose
        self.current_epoch = 0

    def learning_rate(self, epoch_float):
        """The warm-up learning rate at a (fractional) epoch."""
        size = basics.size()
        if epoch_float >= self.warmup_epochs:
            return self.initial_lr
        return self.initial_lr / size * (
            epoch_float * (size - 1) / self.warmup_epochs + 1)

    def on_train_begin(self, logs=None):
        if self.steps_per_epoch is None:
            self.steps_per_epoch = (self.params or {}).get("steps")
        if not self.steps_per_epoch:
            raise ValueError(
                "LearningRateWarmupCallback: fit does not know the steps "
                "per epoch (an unsized dataset); pass steps_per_epoch=")

    def on_epoch_begin(self, epoch, logs=None):
        self.current_epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        if self.current_epoch > self.warmup_epochs:
            return
        epoch_float = self.current_epoch + batch / self.steps_per_epoch
        self.model.optimizer.learning_rate = self.learning_rate(epoch_float)

    def on_epoch_end(self, epoch, logs=None):
        if epoch + 1 == round(self.warmup_epochs):
            self.model.optimizer.learning_rate = self.initial_lr
            if self.verbose:
                _print0(f"\nEpoch {epoch + 1}: finished gradual learning "
                        f"rate warmup to {self.initial_lr:g}.")
        if logs is not None:
            logs["learning_rate"] = float(
                np.array(self.model.optimizer.learning_rate))


class _RingAllreduce:
    """Adding this to model.fit(callbacks=[...]) makes the fit data-parallel:

    * the optimizer's public apply methods allreduce (average) the
      gradients inside the compiled train step, fused into few ops; the
      train function is recompiled at the start of each fit (with XLA
      when the model asks for it, see docs/xla.md; builds whose ops have
      no XLA kernels turn XLA off for the step);
    * at the start of the first fit, root_rank's weights and optimizer
      state (also when restored from a checkpoint) are broadcast;
    * epoch-end metrics are averaged over ranks (put this callback first);
    * only rank 0 prints progress (other ranks' verbose becomes 0) and
      writes checkpoints (on other ranks model.save / save_weights do
      nothing during fit, which covers ModelCheckpoint and
      BackupAndRestore) unless verbose_all_ranks / checkpoint_all_ranks.

    Each rank should read its own part of the data (e.g. x[rank::size]),
    and all ranks must run the same number of steps (equal shards, or
    steps_per_epoch).
    """

    def __init__(self, root_rank=0, op=Average, compression=Compression.none,
                 fusion_threshold=None, sparse_as_dense=False,
                 average_metrics=True, verbose_all_ranks=False,
                 checkpoint_all_ranks=False):
        super().__init__()
        _ensure_init()
        self.root_rank = int(root_rank)
        self.gradient_config = GradientConfig(op, compression,
                                              fusion_threshold,
                                              sparse_as_dense)
        self.average_metrics = average_metrics
        self.verbose_all_ranks = verbose_all_ranks
        self.checkpoint_all_ranks = checkpoint_all_ranks
        self._broadcast_for = None  # id of the model last broadcast
        self._saved_methods = None

    def set_params(self, params):
        # Runs before the ProgbarLogger that fit appends after the user's
        # callbacks reads params["verbose"].
        if (params and basics.rank() != 0 and not self.verbose_all_ranks
                and "verbose" in params):
            params["verbose"] = 0
        super().set_params(params)

    def on_train_begin(self, logs=None):
        model = self.model
        if getattr(model, "jit_compile", False) and not _ops._xla_build_state()[0]:
            model.jit_compile = False  # this build's ops have no XLA kernels
        if model.optimizer is None:
            raise ValueError("RingAllreduceCallback: compile the model with "
                             "an optimizer before fit")
        distribute_instance(model.optimizer, self.gradient_config)
        # The train function may have been traced before the optimizer
        # reduced gradients (an earlier fit): trace it again.
        model.make_train_function(force=True)
        if self._broadcast_for != id(model) and model.variables:
            broadcast_model(model, self.root_rank)
            self._broadcast_for = id(model)
        if basics.rank() != 0 and not self.checkpoint_all_ranks:
            self._silence_saving(model)

    def on_train_batch_end(self, batch, logs=None):
        if self._broadcast_for != id(self.model):
            # A model Keras could not build before fit: built by now.
            broadcast_model(self.model, self.root_rank)
            self._broadcast_for = id(self.model)

    def on_epoch_end(self, epoch, logs=None):
        if self.average_metrics:
            average_logs(logs)

    def on_train_end(self, logs=None):
        self._restore_saving()

    def _silence_saving(self, model):
        if self._saved_methods is not None:
            return
        saved = {}
        for name in ("save", "save_weights"):
            if name in vars(model):
                saved[name] = vars(model)[name]
            object.__setattr__(model, name, _skip_save)
        self._saved_methods = (model, saved)

    def _restore_saving(self):
        if self._saved_methods is None:
            return
        model, saved = self._saved_methods
        for name in ("save", "save_weights"):
            if name in saved:
                object.__setattr__(model, name, saved[name])
            else:
                object.__delattr__(model, name)
        self._saved_methods = None


def _skip_save(*args, **kwargs):
    """model.save / save_weights on ranks other than 0 during fit."""


# The logic above is Keras-agnostic; these bind it to Keras 3's Callback
# (tfring.keras.legacy binds the same to tf_keras).


class BroadcastGlobalVariablesCallback(_BroadcastGlobalVariables,
                                       keras.callbacks.Callback):
    __doc__ = _BroadcastGlobalVariables.__doc__


class MetricAverageCallback(_MetricAverage, keras.callbacks.Callback):
    __doc__ = _MetricAverage.__doc__


class LearningRateWarmupCallback(_LearningRateWarmup, keras.callbacks.Callback):
    __doc__ = _LearningRateWarmup.__doc__


class RingAllreduceCallback(_RingAllreduce, keras.callbacks.Callback):
    __doc__ = _RingAllreduce.__doc__


class ResumableCheckpointCallback(_ResumableCheckpoint, keras.callbacks.Callback):
    __doc__ = _ResumableCheckpoint.__doc__
