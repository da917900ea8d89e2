"""KerasEstimator persistence: Spark ML's writer/reader protocol, so an
estimator saves and loads alone or as a stage of a Pipeline.

A saved KerasEstimator is a folder, laid out as a saved KerasModel
(_persistence.py):

    <path>/metadata/part-00000   one JSON line, Spark ML's DefaultParamsWriter
                                 layout: class, uid, sparkVersion, timestamp,
                                 paramMap and defaultParamMap (JSON values,
                                 below), plus "tfring": the model's file, the
                                 custom objects' names and the Keras/TensorFlow
                                 versions that wrote it
    <path>/model.keras           the untrained Keras model (absent when the
                                 estimator has none)

How each param becomes JSON:
  - model: model.keras;
  - custom_objects: their names only; the reader takes the objects again
    (KerasEstimator.load(path, custom_objects=...)), or Keras finds them
    registered or in a custom_object_scope;
  - store: its prefix path, recreated with Store.create on load;
  - backend: not saved (a backend holds a live SparkContext); the loaded
    estimator runs SparkBackend(num_proc) unless given another;
  - gradient_compression: the name of a tfring Compression (none, fp16,
    bf16, fp16_cast);
  - every other value that is not plain JSON (the optimizer, Keras losses
    and metrics, callbacks, functions) as its Keras config, the
    {"__keras_config__": ...} form in which the estimator ships losses and
    metrics to the ranks (_serialize.py). Saving checks that each config
    deserializes again with the estimator's custom objects, so a value
    that would not load (a callback without get_config, an unregistered
    class or function) is refused at save, naming the param. tfring's own
    callbacks (tfring.keras.callbacks) are registered Keras serializables:
    they save, and loading imports their module; one with an argument a
    config cannot hold (a callable multiplier, local variables, a
    PowerSGD compressor) is refused, naming the callback and the argument.
"""

import copy
import json
import warnings

from pyspark.ml.util import MLWriter

from tfring.spark.keras import _persistence as ps
from tfring.spark.keras import _serialize as ser

# Params saved some other way than as (Keras-)JSON values.
_NOT_PARAMS = ("model", "custom_objects", "backend")


class _Unsaveable(ValueError):
    pass


def _compression_names():
    from tfring.compression import Compression

    return {name: value for name, value in vars(Compression).items()
            if not name.startswith("_") and isinstance(value, type)}


def _keras_json(value, custom_objects):
    """A value that is not plain JSON, as {"__keras_config__": config},
    checked to deserialize again with ``custom_objects``."""
    import keras

    try:
        config = keras.saving.serialize_keras_object(value)
    except Exception as e:  # noqa: BLE001 - Keras raises several types here
        raise _Unsaveable(f"Keras cannot serialize it ({type(e).__name__}: {e})") from None
    try:  # (a copy: from_config may replace parts of the config it is given)
        with keras.saving.custom_object_scope(custom_objects or {}):
            keras.saving.deserialize_keras_object(copy.deepcopy(config))
    except Exception as e:  # noqa: BLE001
        raise _Unsaveable(f"its Keras config does not deserialize again ({e})") from None
    return {ser._KERAS: config}


def _to_json(value, custom_objects):
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, (int, float)):
        return value
    if hasattr(value, "tolist") and type(value).__module__ == "numpy":
        return value.tolist()
    if isinstance(value, (list, tuple)):
        return [_to_json(v, custom_objects) for v in value]
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        if set(value) == {ser._KERAS}:
            raise _Unsaveable(f"a dict whose only key is {ser._KERAS!r} is reserved")
        return {k: _to_json(v, custom_objects) for k, v in value.items()}
    return _keras_json(value, custom_objects)


def _callback_error(name, value, custom_objects):
    """The error for an unsaveable callbacks/checkpoint_callback value,
    naming the callback, or None."""
    items = list(value) if name == "callbacks" else [value]
    for i, cb in enumerate(items):
        try:
            _to_json(cb, custom_objects)
        except _Unsaveable as e:
            where = f"callbacks[{i}]" if name == "callbacks" else name
            qual = f"{type(cb).__module__}.{type(cb).__qualname__}"
            setter = "setCallbacks" if name == "callbacks" else "setCheckpointCallback"
            if hasattr(type(cb), "get_config") and hasattr(type(cb), "from_config"):
                # Its class is serializable (tfring's callbacks are): an
                # argument of this one is not, and the error names it.
                advice = ("Remove it before saving and set it again after loading "
                          f"({setter}), or give it arguments a Keras config holds")
            else:
                advice = ("A callback is saved as its Keras config: its class needs "
                          "get_config() and from_config() (keras.callbacks.Callback has "
                          "neither) and registration (keras.saving.register_keras_serializable) "
                          "or an entry in custom_objects. Or remove it before saving and set "
                          f"it again after loading ({setter})")
            return ValueError(f"KerasEstimator.save: the callback {type(cb).__name__} ({where}, "
                              f"{qual}) cannot be saved: {e}. {advice}")
    return None


def _register_tfring_objects(value):
    """Imports the modules that register tfring's Keras serializables a
    JSON value names ("tfring>..."): tfring's callbacks are registered
    when tfring.keras.callbacks is imported, which a new process loading
    a saved estimator has not done. (Importing it does not initialise
    tfring: the callbacks initialise it on first use, on the ranks.)"""
    if '"tfring>' not in json.dumps(value):
        return
    from tfring.spark.keras import _schedule  # noqa: F401 - registers the schedule

    try:
        import tfring.keras.callbacks  # noqa: F401 - registers the callbacks
    except ImportError:
        pass  # then deserializing fails, naming the class it cannot find


def encode_param(name, value, custom_objects):
    """The JSON value of one param (module docstring); ValueError naming
    the param when it cannot be saved."""
    if value is None:
        return None
    if name == "store":
        return value.prefix_path
    if name == "gradient_compression":
        for cname, compressor in _compression_names().items():
            if value is compressor:
                return cname
        raise ValueError(f"KerasEstimator.save: gradient_compression {value!r} cannot be "
                         f"saved: only the tfring.Compression classes "
                         f"({', '.join(_compression_names())}) are saved, by name. Set it "
                         "again after loading (setGradientCompression)")
    try:
        return _to_json(value, custom_objects)
    except _Unsaveable as e:
        if name in ("callbacks", "checkpoint_callback"):
            error = _callback_error(name, value, custom_objects)
            if error is not None:
                raise error from None
        raise ValueError(
            f"KerasEstimator.save: the {name} param ({value!r}) cannot be saved: {e}. A value "
            "that is not plain JSON is saved as its Keras config: register its class or "
            "function (keras.saving.register_keras_serializable) or pass it in "
            f"custom_objects; or set {name} again after loading") from None


def decode_param(name, value, custom_objects):
    """The param's value from its JSON value (encode_param's inverse)."""
    if value is None:
        return None
    if name == "store":
        from tfring.spark.common.store import Store

        return Store.create(value)
    if name == "gradient_compression":
        return _compression_names()[value]
    _register_tfring_objects(value)
    return ser.deserialize_compile_arg(value, custom_objects)


class KerasEstimatorWriter(MLWriter):
    """`estimator.write()`: `.overwrite()` replaces an existing folder, else
    saving over one fails. Every param is encoded before anything is
    written, so a param that cannot be saved leaves the path as it was."""

    def __init__(self, instance):
        super().__init__()
        self.instance = instance

    def save(self, path):
        ps.check_path(path)
        meta, model_data = self._encode()
        ps.clear_target(path, self.shouldOverwrite, "estimator")
        ps.write_folder(path, meta, model_data)

    def saveImpl(self, path):
        meta, model_data = self._encode()
        ps.write_folder(path, meta, model_data)

    def _encode(self):
        inst = self.instance
        custom = inst.getCustomObjects() or {}
        if inst.isSet(inst.backend) and inst.getBackend() is not None:
            warnings.warn("KerasEstimator.save: the backend is not saved (a backend holds a live "
                          "SparkContext): the loaded estimator runs SparkBackend(num_proc) "
                          "unless given one with setBackend", UserWarning, stacklevel=4)

        def encode(param_map):
            return {p.name: encode_param(p.name, v, custom) for p, v in param_map.items()
                    if p.name not in _NOT_PARAMS}

        params, defaults = encode(inst._paramMap), encode(inst._defaultParamMap)
        model = inst.getModel()
        model_data = ser.model_to_bytes(model) if model is not None else None
        extra = {"kind": "KerasEstimator"} if model is not None else \
            {"kind": "KerasEstimator", "model": None}
        return ps.params_metadata(inst, params, defaults, custom, extra), model_data


class KerasEstimatorReader(ps.KerasReader):
    """`KerasEstimator.read()`: loads a folder that KerasEstimatorWriter
    wrote."""

    def load(self, path):
        meta, own, data = ps.read_folder(path, "KerasEstimator")
        recorded = own.get("customObjects") or {}
        custom = ps.found_custom_objects(recorded, self.custom_objects)
        model = None
        if data is not None:
            model = ps.load_model(data, custom, recorded, self.safe_mode, "KerasEstimator")
        instance = ps.set_params(self.cls(), meta,
                                 lambda name, value: decode_param(name, value, custom))
        instance._set(custom_objects=custom)
        if model is not None:
            instance._set(model=model)
        return instance
