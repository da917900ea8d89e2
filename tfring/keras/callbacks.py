"""Keras callbacks that make model.fit data-parallel.

    model.fit(x_shard, y_shard, callbacks=[
        tfring.keras.callbacks.RingAllreduceCallback()])

RingAllreduceCallback is the one-line way. Put it first in the list, so the
callbacks after it see metrics averaged over ranks. The Horovod-style pieces
(BroadcastGlobalVariablesCallback, MetricAverageCallback,
LearningRateWarmupCallback, with tfring.keras.DistributedOptimizer) do one
job each. ResumableCheckpointCallback writes checkpoints from rank 0 and
restores the newest on every rank, so a killed job resumes where it stopped.

The callbacks initialise tfring on first use (when fit hands them the
model), not when built, and are Keras serializables (get_config /
from_config, registered as "tfring>ClassName"): a KerasEstimator holding
them saves and loads on the Spark driver without starting the runtime.
"""

import keras
import numpy as np

from tfring import Average, basics
from tfring import _op_lib
from tfring.compression import Compression
from tfring.keras._state import (
    GradientConfig,
    average_logs,
    broadcast_model,
    distribute_instance,
)
from tfring.keras.checkpoint import (
    _ResumableCheckpoint,
    set_pending_powersgd_steps,
)
from tfring.gradient_reduction import var_keys

__all__ = [
    "BestModelCheckpoint",
    "BroadcastGlobalVariablesCallback",
    "LearningRateScheduleCallback",
    "LearningRateWarmupCallback",
    "MetricAverageCallback",
    "ResumableCheckpointCallback",
    "RingAllreduceCallback",
]


def _ensure_init():
    """Initialises tfring on first use. The callbacks call it when fit
    hands them the model (set_model) and in their methods that need the
    runtime, never in __init__: a callback built or rebuilt from its Keras
    config off the ranks (the Spark driver saving or loading a
    KerasEstimator) does not start the runtime."""
    if not basics.is_initialized():
        basics.init()


class _KerasConfig:
    """get_config / from_config: a callback's Keras config holds its
    constructor arguments (Keras 3 registers the bound classes below as
    "tfring>ClassName", so keras.saving.deserialize_keras_object rebuilds
    them). An argument a config cannot hold (a Python callable, a
    variable, a stateful compressor) makes get_config raise, naming the
    callback and the argument, rather than leaving it out."""

    @classmethod
    def from_config(cls, config):
        return cls(**config)

    def _unsaveable(self, arg, value, why):
        return ValueError(
            f"{type(self).__name__}: its {arg} argument ({value!r}) cannot be "
            f"held in a Keras config: {why}")


def _print0(msg):
    if basics.rank() == 0:
        print(msg, flush=True)


class _BroadcastGlobalVariables(_KerasConfig):
    """At the start of the first fit, assigns root_rank's model weights and
    optimizer state to every rank, so all ranks start equal (after random
    initialization or after root_rank alone restored a checkpoint).

    local_variables (a variable or a list of them, e.g. the weights of a
    PartialDistributedOptimizer's local layers) keep each rank's own
    values. device is accepted for Horovod compatibility and ignored."""

    def __init__(self, root_rank=0, device="", local_variables=None):
        super().__init__()
        self.root_rank = int(root_rank)
        self.device = device
        self.broadcast_done = False
        if local_variables is None:
            local_variables = []
        elif not isinstance(local_variables, (list, tuple, set)):
            local_variables = [local_variables]
        for var in local_variables:
            if not hasattr(var, "assign"):
                raise ValueError(f"BroadcastGlobalVariablesCallback: local "
                                 f"variables must be variables, got "
                                 f"{type(var).__name__}")
        self._local_keys = set()
        for var in local_variables:
            self.register_local_var(var)

    def register_local_var(self, var):
        """Keeps this variable out of the broadcast."""
        self._local_keys.update(var_keys(var))

    def get_config(self):
        if self._local_keys:
            raise self._unsaveable(
                "local_variables", f"{len(self._local_keys)} variable keys",
                "it holds live variables; set the callback again after "
                "loading")
        return {"root_rank": self.root_rank, "device": self.device}

    def set_model(self, model):
        _ensure_init()
        super().set_model(model)

    def _broadcast(self):
        _ensure_init()
        broadcast_model(self.model, self.root_rank, exclude=self._local_keys)
        self.broadcast_done = True

    def on_train_begin(self, logs=None):
        _ensure_init()
        _no_xla_for_tfring_optimizer(self.model)
        # Keras builds the model and its optimizer before fit calls
        # on_train_begin; a model it could not build waits for its first
        # batch.
        if not self.broadcast_done and _built(self.model):
            self._broadcast()

    def on_train_batch_end(self, batch, logs=None):
        if not self.broadcast_done:
            self._broadcast()


def _plain(value, callback, arg):
    """A number (or None) as a plain Python value for a Keras config."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, np.generic) or (
            hasattr(value, "numpy") and not getattr(value, "shape", ())):
        return np.asarray(value).item()
    raise callback._unsaveable(arg, value, f"a {type(value).__name__} is "
                               "not a plain number")


def _compression_name(compression, callback):
    """The name of a tfring.Compression class (a config holds the name)."""
    for name, value in vars(Compression).items():
        if not name.startswith("_") and value is compression:
            return name
    raise callback._unsaveable(
        "compression", compression,
        "only the tfring.Compression classes (none, fp16, bf16, fp16_cast) "
        "are saved, by name; a compressor instance such as "
        "Compression.powersgd() holds state")


def _built(model):
    """Whether the model has its weights: a model without an Input is built
    by its first batch (before that its variables may hold only the
    dropout seed generators)."""
    return bool(getattr(model, "built", True) and model.trainable_variables)


def _no_xla_for_tfring_optimizer(model):
    """A train step that runs a tfring.keras.DistributedOptimizer is
    XLA-compiled when the op library has XLA kernels (docs/xla.md); with a
    build that has none (Keras 3 compiles with XLA by default on GPU hosts)
    turn XLA off for it and trace the train function again."""
    opt = getattr(model, "optimizer", None)
    if (getattr(opt, "_tfring_config", None) is not None
            and getattr(model, "jit_compile", False)
            and not _op_lib.xla_build_state()[0]):
        model.jit_compile = False
        if hasattr(model, "make_train_function"):
            model.make_train_function(force=True)


class _MetricAverage(_KerasConfig):
    """Averages the epoch-end metrics (loss, metrics, val_*) over ranks, in
    place, so callbacks after it (History, ModelCheckpoint(save_best_only),
    EarlyStopping, ReduceLROnPlateau) decide the same on every rank.
    device is accepted for Horovod compatibility and ignored."""

    def __init__(self, device=""):
        super().__init__()
        self.device = device

    def get_config(self):
        return {"device": self.device}

    def on_epoch_end(self, epoch, logs=None):
        average_logs(logs)


class _LearningRateSchedule(_KerasConfig):
    """Sets the learning rate to initial_lr * multiplier(epoch) for epochs
    in [start_epoch, end_epoch) (Horovod's LearningRateScheduleCallback).

    A constant multiplier m means m ** (epoch - start_epoch). With
    staircase=True the rate changes at the start of each epoch (integer
    epoch); otherwise at every batch, with the fractional epoch
    epoch + batch / steps_per_epoch (steps_per_epoch defaults to what fit
    reports). initial_lr=None takes the optimizer's rate at train begin.
    momentum_correction is accepted for Horovod compatibility: Keras
    compiles the momentum into the train step, so it is not rescaled.
    """

    def __init__(self, initial_lr, multiplier, start_epoch=0, end_epoch=None,
                 staircase=True, momentum_correction=True,
                 steps_per_epoch=None):
        super().__init__()
        self.initial_lr = initial_lr
        self.start_epoch = start_epoch
        self.end_epoch = end_epoch
        self.staircase = staircase
        self.momentum_correction = momentum_correction
        self.steps_per_epoch = steps_per_epoch
        self.current_epoch = None
        self._multiplier_arg = multiplier  # for get_config
        if callable(multiplier):
            self.multiplier = multiplier
        else:
            self.multiplier = (
                lambda epoch: multiplier ** (epoch - start_epoch))

    def get_config(self):
        multiplier = self._multiplier_arg
        if callable(multiplier):
            raise self._unsaveable(
                "multiplier", multiplier,
                "it is a Python callable; a constant multiplier m (the rate "
                "times m ** (epoch - start_epoch)) is saved, a function is "
                "not: set the callback again after loading")
        if isinstance(multiplier, np.generic):
            multiplier = multiplier.item()
        return {"initial_lr": _plain(self.initial_lr, self, "initial_lr"),
                "multiplier": multiplier,
                "start_epoch": self.start_epoch, "end_epoch": self.end_epoch,
                "staircase": self.staircase,
                "momentum_correction": self.momentum_correction,
                "steps_per_epoch": self.steps_per_epoch}

    def set_model(self, model):
        _ensure_init()
        super().set_model(model)

    def _set_lr(self, value):
        self.model.optimizer.learning_rate = value

    def _get_lr(self):
        return float(np.array(self.model.optimizer.learning_rate))

    def on_train_begin(self, logs=None):
        if self.initial_lr is None:
            self.initial_lr = self._get_lr()
        if not self.staircase and not self.steps_per_epoch:
            params = self.params or {}
            self.steps_per_epoch = params.get("steps")
            if not self.steps_per_epoch:
                raise ValueError(
                    f"{type(self).__name__}: fit does not know the steps "
                    f"per epoch (an unsized dataset); pass steps_per_epoch=")

    def on_epoch_begin(self, epoch, logs=None):
        self.current_epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        epoch = self.current_epoch
        if epoch < self.start_epoch or (self.end_epoch is not None
                                        and epoch >= self.end_epoch):
            return
        if self.staircase:
            if batch == 0:
                self._set_lr(self.initial_lr * self.multiplier(epoch))
        else:
            self._set_lr(self.initial_lr * self.multiplier(
                epoch + float(batch) / self.steps_per_epoch))

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            logs["lr"] = self._get_lr()


class _LearningRateWarmup(_KerasConfig):
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
        self.initial_lr = float(initial_lr)
        self.warmup_epochs = float(warmup_epochs)
        self.momentum_correction = momentum_correction
        self.steps_per_epoch = steps_per_epoch
        self.verbose = verbose
        self.current_epoch = 0

    def get_config(self):
        return {"initial_lr": self.initial_lr,
                "warmup_epochs": self.warmup_epochs,
                "momentum_correction": self.momentum_correction,
                "steps_per_epoch": self.steps_per_epoch,
                "verbose": self.verbose}

    def set_model(self, model):
        _ensure_init()
        super().set_model(model)

    def learning_rate(self, epoch_float):
        """The warm-up learning rate at a (fractional) epoch."""
        _ensure_init()
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
        # As Horovod: the rate a batch trains with is the one at the end of
        # that batch, so the last batch of the warm-up reaches initial_lr.
        epoch_float = self.current_epoch + (batch + 1) / self.steps_per_epoch
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


class _RingAllreduce(_KerasConfig):
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
        self.root_rank = int(root_rank)
        self.gradient_config = GradientConfig(op, compression,
                                              fusion_threshold,
                                              sparse_as_dense)
        self.average_metrics = average_metrics
        self.verbose_all_ranks = verbose_all_ranks
        self.checkpoint_all_ranks = checkpoint_all_ranks
        self._broadcast_for = None  # id of the model last broadcast
        self._saved_methods = None

    def get_config(self):
        gc = self.gradient_config
        return {"root_rank": self.root_rank, "op": gc.op_name,
                "compression": _compression_name(gc.compression, self),
                "fusion_threshold": gc.fusion_threshold,
                "sparse_as_dense": gc.sparse_as_dense,
                "average_metrics": self.average_metrics,
                "verbose_all_ranks": self.verbose_all_ranks,
                "checkpoint_all_ranks": self.checkpoint_all_ranks}

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        config["compression"] = getattr(Compression, config["compression"])
        return cls(**config)

    def set_model(self, model):
        _ensure_init()
        super().set_model(model)

    def set_params(self, params):
        # Runs before the ProgbarLogger that fit appends after the user's
        # callbacks reads params["verbose"].
        _ensure_init()
        if (params and basics.rank() != 0 and not self.verbose_all_ranks
                and "verbose" in params):
            params["verbose"] = 0
        super().set_params(params)

    def on_train_begin(self, logs=None):
        _ensure_init()
        model = self.model
        retrace = False
        if getattr(model, "jit_compile", False) and not _op_lib.xla_build_state()[0]:
            model.jit_compile = False  # this build's ops have no XLA kernels
            retrace = True
        if model.optimizer is None:
            raise ValueError("RingAllreduceCallback: compile the model with "
                             "an optimizer before fit")
        distribute_instance(model.optimizer, self.gradient_config)
        set_pending_powersgd_steps(model.optimizer)
        # The train function may have been traced before the optimizer
        # reduced gradients (an earlier fit without this callback): trace it
        # again, but only then. A function traced for this configuration
        # is kept, so fit called once per epoch does not retrace each time.
        fn = getattr(model, "train_function", None)
        if retrace or fn is None or getattr(
                fn, "_tfring_config", None) is not self.gradient_config:
            model.make_train_function(force=True)
            try:
                model.train_function._tfring_config = self.gradient_config
            except AttributeError:
                pass
        if self._broadcast_for != id(model) and _built(model):
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
# (tfring.keras.legacy binds the same to tf_keras), registered as Keras
# serializables "tfring>ClassName": keras.saving.deserialize_keras_object
# rebuilds them from their configs wherever this module is imported (a
# saved KerasEstimator's callbacks, tfring/spark/keras/_estimator_persistence.py).


_register = keras.saving.register_keras_serializable(package="tfring")


@_register
class BroadcastGlobalVariablesCallback(_BroadcastGlobalVariables,
                                       keras.callbacks.Callback):
    __doc__ = _BroadcastGlobalVariables.__doc__


@_register
class MetricAverageCallback(_MetricAverage, keras.callbacks.Callback):
    __doc__ = _MetricAverage.__doc__


@_register
class LearningRateWarmupCallback(_LearningRateWarmup, keras.callbacks.Callback):
    __doc__ = _LearningRateWarmup.__doc__


@_register
class LearningRateScheduleCallback(_LearningRateSchedule,
                                   keras.callbacks.Callback):
    __doc__ = _LearningRateSchedule.__doc__


def _best_model_checkpoint(base):
    class BestModelCheckpoint(base):
        """Horovod's BestModelCheckpoint: a ModelCheckpoint that saves only
        the best model by `monitor` (save_best_only=True). filepath may be
        given here or set later (callback.filepath = ...) before fit."""

        def __init__(self, monitor="val_loss", verbose=0,
                     save_weights_only=False, mode="auto",
                     save_freq="epoch", filepath=None):
            placeholder = ("best.weights.h5" if save_weights_only
                           else "best.keras")
            super().__init__(filepath=filepath or placeholder,
                             monitor=monitor, verbose=verbose,
                             save_best_only=True,
                             save_weights_only=save_weights_only, mode=mode,
                             save_freq=save_freq)
            self.filepath = filepath
            self._tfring_args = dict(monitor=monitor, verbose=verbose,
                                     save_weights_only=save_weights_only,
                                     mode=mode, save_freq=save_freq)

        def get_config(self):
            """The constructor's arguments, with the filepath as it is
            now (set after construction too)."""
            filepath = self.filepath
            if filepath is not None and not isinstance(filepath, str):
                filepath = str(filepath)  # a pathlib.Path
            return {**self._tfring_args, "filepath": filepath}

        @classmethod
        def from_config(cls, config):
            return cls(**config)

        def on_train_begin(self, logs=None):
            if not self.filepath:
                raise ValueError("BestModelCheckpoint: set its filepath "
                                 "before fit (BestModelCheckpoint(filepath="
                                 "...) or callback.filepath = ...)")
            self.filepath = str(self.filepath)
            parent = getattr(super(), "on_train_begin", None)
            if parent is not None:
                parent(logs)

    return BestModelCheckpoint


BestModelCheckpoint = _register(
    _best_model_checkpoint(keras.callbacks.ModelCheckpoint))


@_register
class RingAllreduceCallback(_RingAllreduce, keras.callbacks.Callback):
    __doc__ = _RingAllreduce.__doc__


@_register
class ResumableCheckpointCallback(_ResumableCheckpoint, keras.callbacks.Callback):
    __doc__ = _ResumableCheckpoint.__doc__
