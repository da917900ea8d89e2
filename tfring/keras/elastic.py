"""Elastic Keras training (Horovod's ``hvd.elastic`` for tf.keras).

    state = tfring.keras.elastic.KerasState(model, batch=0, epoch=0)
    callbacks = [tfring.keras.elastic.UpdateEpochStateCallback(state),
                 tfring.keras.elastic.UpdateBatchStateCallback(state),
                 tfring.keras.elastic.CommitStateCallback(state)]

    @tfring.keras.elastic.run
    def train(state):
        state.model.fit(x, y, steps_per_epoch=..., epochs=epochs - state.epoch,
                        callbacks=callbacks)

    train(state)

Callback semantics follow Horovod: CommitStateCallback commits every
batches_per_commit batches and at the end of every epoch;
UpdateBatchStateCallback keeps state.batch (and shortens the first epoch
after a reset by the batches already done); UpdateEpochStateCallback keeps
state.epoch as the number of epochs completed over all resets.
"""

import keras

from tfring.elastic import (  # noqa: F401 - re-exported under Horovod's names
    HorovodInternalError,
    HostsUpdatedInterrupt,
    ObjectState,
    State,
    run,
)
from tfring.elastic.tensorflow import TensorFlowKerasState


class KerasState(TensorFlowKerasState):
    """A compiled Keras model (its optimizer included) plus picklable attributes."""

    _backend = keras.backend

    def __init__(self, model, optimizer=None, **kwargs):
        super().__init__(model, optimizer=optimizer, backend=self._backend,
                         **kwargs)


class _CommitState:
    """Commits the state every batches_per_commit batches and at every
    epoch's end. Commits are collective: every rank commits at the same batch."""

    def __init__(self, state, batches_per_commit=1):
        super().__init__()
        self.state = state
        self.batches_per_commit = batches_per_commit
        self.batches_remaining = batches_per_commit

    def on_train_begin(self, logs=None):
        # Every rank counts from the same point after a reset.
        self.batches_remaining = self.batches_per_commit

    def on_train_batch_end(self, batch, logs=None):
        self.batches_remaining -= 1
        if self.batches_remaining == 0:
            self.state.commit()
            self.batches_remaining = self.batches_per_commit

    def on_epoch_end(self, epoch, logs=None):
        self.state.commit()


class _UpdateBatchState:
    """Tracks state.batch; after a reset the current epoch runs only the
    batches it has left."""

    def __init__(self, state):
        super().__init__()
        self.state = state
        self.steps_per_epoch = None

    def on_train_begin(self, logs=None):
        self.steps_per_epoch = None

    def on_epoch_begin(self, epoch, logs=None):
        steps = (self.params or {}).get("steps")
        if steps:
            if self.steps_per_epoch is None:
                self.steps_per_epoch = steps
            self.params["steps"] = self.steps_per_epoch - self.state.batch

    def on_train_batch_end(self, batch, logs=None):
        self.state.batch = batch

    def on_epoch_end(self, epoch, logs=None):
        self.state.batch = 0


class _UpdateEpochState:
    """Tracks state.epoch as epochs completed, counted across resets (Keras
    numbers each fit's epochs from 0)."""

    def __init__(self, state):
        super().__init__()
        self.state = state
        self.initial_epoch = state.epoch

    def on_train_begin(self, logs=None):
        self.initial_epoch = self.state.epoch

    def on_epoch_end(self, epoch, logs=None):
        # +1: a reset right after this epoch must not repeat it.
        self.state.epoch = self.initial_epoch + epoch + 1


# The callbacks above are framework-independent; these bind them to Keras 3
# (tfring.keras.legacy binds the same to tf_keras).
class CommitStateCallback(_CommitState, keras.callbacks.Callback):
    __doc__ = _CommitState.__doc__


class UpdateBatchStateCallback(_UpdateBatchState, keras.callbacks.Callback):
    __doc__ = _UpdateBatchState.__doc__


class UpdateEpochStateCallback(_UpdateEpochState, keras.callbacks.Callback):
    __doc__ = _UpdateEpochState.__doc__
