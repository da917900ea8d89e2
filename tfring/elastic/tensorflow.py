"""Elastic states holding TensorFlow variables (Horovod's names).

TensorFlowState(variables, **attrs): a list of tf.Variables plus picklable
attributes. TensorFlowKerasState(model, optimizer, **attrs): a built Keras
model's and its optimizer's variables plus picklable attributes.

commit() copies the variables' values into host memory; restore() assigns
them back; sync() broadcasts them from rank 0 after checking that every rank
holds the same variables (an error names the first ones that differ).

A Compression.powersgd compressor (passed as compression=, or the one a
tfring optimizer given to TensorFlowKerasState uses) is part of the state:
its step counters are committed and restored with it, and sync() treats its
rank-local error buffers as tfring/elastic/_powersgd.py describes.
"""

import tensorflow as tf

from tfring.elastic import _powersgd
from tfring.elastic.state import ObjectState, broadcast_arrays, broadcast_object


def _values(variables):
    return [v.numpy().copy() for v in variables]


def _assign(variables, values):
    for var, value in zip(variables, values):
        var.assign(value)


def _names(variables):
    return [f"{i}:{getattr(v, 'path', None) or v.name}" for i, v in enumerate(variables)]


class TensorFlowState(ObjectState):
    """A list of tf.Variables (eager TensorFlow 2) plus picklable attributes."""

    def __init__(self, variables=None, session=None, compression=None,
                 **kwargs):
        if variables is None:
            raise ValueError("tfring elastic: TensorFlowState needs the list of variables")
        if session is not None:
            raise NotImplementedError("tfring elastic: TensorFlowState supports eager "
                                      "TensorFlow 2 only (session must be None)")
        self.variables = list(variables)
        self._saved_values = _values(self.variables)
        self._powersgd = _elastic_powersgd(compression, None)
        super().__init__(**kwargs)

    def save(self):
        self._saved_values = _values(self.variables)
        _call(self._powersgd, "save")
        super().save()

    def restore(self):
        _assign(self.variables, self._saved_values)
        _call(self._powersgd, "restore")
        super().restore()

    def sync(self):
        values = broadcast_arrays(_values(self.variables), _names(self.variables))
        _assign(self.variables, values)
        self._saved_values = values
        _sync_powersgd(self._powersgd)
        super().sync()


def _elastic_powersgd(compression, optimizer):
    return _powersgd.ElasticPowerSGD(compression, optimizer)


def _call(powersgd, method):
    if powersgd is not None:
        getattr(powersgd, method)()


def _sync_powersgd(powersgd):
    if powersgd is not None:
        powersgd.sync(broadcast_object, broadcast_arrays)


def _optimizer_variables(optimizer):
    if optimizer is None:
        return []
    v = optimizer.variables
    return list(v() if callable(v) else v)


class TensorFlowKerasState(ObjectState):
    """A Keras model and its optimizer plus picklable attributes. The model
    must be built, and the optimizer's variables created (one step, or
    optimizer.build(model.trainable_variables)), so every rank's state has
    the same variables."""

    def __init__(self, model, optimizer=None, backend=None, compression=None,
                 **kwargs):
        if not model.built:
            raise ValueError("tfring elastic: the model must be built first; run "
                             "model.build(input_shape) or one step")
        self.model = model
        self.optimizer = optimizer if optimizer is not None else getattr(model, "optimizer", None)
        self.backend = backend
        # Keras 3 creates an optimizer's variables on its first step: create
        # them now, so a new worker's state has the same variables as the
        # survivors' it receives.
        build = getattr(self.optimizer, "build", None)
        if callable(build) and not getattr(self.optimizer, "built", True):
            build(model.trainable_variables)
        self._save_model()
        self._powersgd = _elastic_powersgd(compression, self.optimizer)
        super().__init__(**kwargs)

    def _variables(self):
        return list(self.model.variables) + _optimizer_variables(self.optimizer)

    def _save_model(self):
        self._saved_values = _values(self._variables())

    def save(self):
        self._save_model()
        _call(self._powersgd, "save")
        super().save()

    def restore(self):
        variables = self._variables()
        if len(variables) != len(self._saved_values):
            raise ValueError(f"tfring elastic: the model and optimizer hold {len(variables)} "
                             f"variables, the commit {len(self._saved_values)}")
        _assign(variables, self._saved_values)
        _call(self._powersgd, "restore")
        super().restore()

    def sync(self):
        variables = self._variables()
        values = broadcast_arrays(_values(variables), _names(variables))
        _assign(variables, values)
        self._saved_values = values
        _sync_powersgd(self._powersgd)
        super().sync()
