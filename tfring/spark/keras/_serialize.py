"""How the estimator ships Keras objects to the ranks and tags checkpoints.

The model travels as the bytes of a .keras file, the optimizer as its
Keras config (keras.optimizers.serialize), losses and metrics as Keras
configs when they are Keras objects (plain functions and strings travel as
they are): live models, optimizers and metrics hold variables, which do not
pickle.

A checkpoint in the store is a .keras file with one more member,
``tfring_checkpoint.json``: the epochs done when it was saved, the history
up to then, the run and the number of ranks. Keras ignores the member, so
keras.models.load_model opens the checkpoint as it is, and the epoch
count cannot disagree with the weights (one file, published by one
rename).
"""

import copy
import io
import json
import os
import shutil
import tempfile
import zipfile

CHECKPOINT_TAG = "tfring_checkpoint.json"
_KERAS = "__keras_config__"


def model_to_bytes(model):
    """The model as the bytes of a .keras file."""
    with tempfile.TemporaryDirectory(prefix="tfring-model-") as tmp:
        path = os.path.join(tmp, "model.keras")
        model.save(path)
        with open(path, "rb") as f:
            return f.read()


def bytes_to_model(data, custom_objects=None, compile=True, directory=None, safe_mode=True):
    """A Keras model from .keras bytes (written to a temporary file). The
    checkpoints of a run with a learning-rate schedule hold tfring's
    ScaledLearningRateSchedule: importing _schedule registers it."""
    import keras

    from tfring.spark.keras import _schedule  # noqa: F401 - registers the schedule

    with tempfile.TemporaryDirectory(prefix="tfring-model-", dir=directory) as tmp:
        path = os.path.join(tmp, "model.keras")
        with open(path, "wb") as f:
            f.write(data)
        return keras.saving.load_model(path, custom_objects=custom_objects or None,
                                       compile=compile, safe_mode=safe_mode)


def tag_checkpoint(src, dst, info):
    """Copies the .keras file ``src`` to ``dst`` with ``info`` (a dict) as its
    tfring_checkpoint.json member."""
    shutil.copyfile(src, dst)
    with zipfile.ZipFile(dst, "a") as z:
        z.writestr(CHECKPOINT_TAG, json.dumps(info))


def read_tag(data):
    """The tfring_checkpoint.json of checkpoint bytes, or None."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            return json.loads(z.read(CHECKPOINT_TAG))
    except (KeyError, zipfile.BadZipFile, ValueError):
        return None


def serialize_compile_arg(value, custom_objects=None, what="loss"):
    """A loss, metric (or a list/dict of them) in a form that pickles:
    Keras Loss and Metric objects as their configs, checked to deserialize
    here with ``custom_objects``; strings and functions as they are."""
    import keras

    if isinstance(value, (list, tuple)):
        return type(value)(serialize_compile_arg(v, custom_objects, what) for v in value)
    if isinstance(value, dict):
        return {k: serialize_compile_arg(v, custom_objects, what) for k, v in value.items()}
    if isinstance(value, (keras.losses.Loss, keras.metrics.Metric)):
        config = keras.saving.serialize_keras_object(value)
        try:  # (a copy: from_config may replace parts of the config it is given)
            with keras.saving.custom_object_scope(custom_objects or {}):
                keras.saving.deserialize_keras_object(copy.deepcopy(config))
        except Exception as e:  # noqa: BLE001 - reported with the object's name
            if isinstance(value, keras.losses.Loss):
                return value  # a Loss holds no variables: it pickles
            raise ValueError(f"KerasEstimator: the {what} {value!r} cannot be rebuilt from its "
                             f"Keras config on the ranks ({e}); register its class "
                             "(keras.saving.register_keras_serializable) or pass it in "
                             "custom_objects") from None
        return {_KERAS: config}
    return value


def deserialize_compile_arg(value, custom_objects=None):
    import keras

    if isinstance(value, (list, tuple)):
        return type(value)(deserialize_compile_arg(v, custom_objects) for v in value)
    if isinstance(value, dict):
        if set(value) == {_KERAS}:
            with keras.saving.custom_object_scope(custom_objects or {}):
                return keras.saving.deserialize_keras_object(value[_KERAS])
        return {k: deserialize_compile_arg(v, custom_objects) for k, v in value.items()}
    return value


def serialize_optimizer(optimizer):
    """(Keras config of the optimizer, its learning rate as a float or None
    when it is a schedule)."""
    import keras

    optimizer = keras.optimizers.get(optimizer)
    config = keras.optimizers.serialize(optimizer)
    lr = config.get("config", {}).get("learning_rate")
    return config, float(lr) if isinstance(lr, (int, float)) else None
