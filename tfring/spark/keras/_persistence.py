"""KerasModel persistence: Spark ML's writer/reader protocol over any
filesystem pyarrow or fsspec can open.

A saved KerasModel is a folder:

    <path>/metadata/part-00000   one JSON line, Spark ML's DefaultParamsWriter
                                 layout: class, uid, sparkVersion, timestamp,
                                 paramMap and defaultParamMap (every param but
                                 the model, JSON values), plus "tfring": the
                                 model's file, the custom objects' names and
                                 the Keras/TensorFlow versions that wrote it
    <path>/model.keras           the Keras model (architecture, weights and,
                                 where compiled, its optimizer)

The metadata's place and format are Spark's, so a Pipeline holding a
KerasModel saves and loads through Spark's own readers. Custom objects
(layers, losses, ...) are recorded by name only: the code must come back
at load time, passed as `custom_objects` or registered with
`keras.saving.register_keras_serializable`.
"""

import json
import os
import time

from pyspark.ml.util import MLReader, MLWriter

FORMAT = 1
MODEL_FILE = "model.keras"
METADATA_FILE = "metadata/part-00000"


def filesystem(path):
    """(pyarrow FileSystem, path inside it) for a local path or any URL
    pyarrow knows (file://, hdfs://, s3://, gs://, ...), else fsspec's."""
    import pyarrow.fs as pafs

    if "://" not in path:
        return pafs.LocalFileSystem(), os.path.abspath(path)
    try:
        return pafs.FileSystem.from_uri(path)
    except (ValueError, TypeError, OSError) as e:  # (ArrowInvalid is a ValueError)
        why = e
    try:
        import fsspec
    except ImportError:
        raise ValueError(f"cannot open {path!r}: {why} (installing fsspec may help)") from None
    fs, root = fsspec.core.url_to_fs(path)
    return pafs.PyFileSystem(pafs.FSSpecHandler(fs)), root


def exists(fs, path):
    import pyarrow.fs as pafs

    return fs.get_file_info(path).type != pafs.FileType.NotFound


def write_bytes(fs, path, data):
    fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
    with fs.open_output_stream(path) as f:
        f.write(data)


def read_bytes(fs, path):
    with fs.open_input_stream(path) as f:
        return f.read()


def _json_value(v):
    """A param value as JSON (numpy numbers and arrays become plain ones)."""
    if hasattr(v, "tolist"):
        return v.tolist()
    if isinstance(v, dict):
        return {str(k): _json_value(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_json_value(x) for x in v]
    return v


def _object_name(obj):
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', repr(obj))}"


# --- shared by the KerasModel and KerasEstimator writers and readers ------------------


def check_path(path):
    if not isinstance(path, str):
        raise TypeError(f"path should be a string, got {type(path).__name__}")


def clear_target(path, overwrite, what="model"):
    """Makes way for a save to ``path``: removes what is there when
    ``overwrite``, else fails if anything is."""
    fs, root = filesystem(path)
    if exists(fs, root):
        if not overwrite:
            raise FileExistsError(
                f"{path} already exists: save with {what}.write().overwrite().save(path) "
                f"to replace it")
        info = fs.get_file_info(root)
        if info.type == info.type.Directory:
            fs.delete_dir(root)
        else:
            fs.delete_file(root)


def versions():
    """(Keras version, TensorFlow version or None)."""
    import keras

    try:
        import tensorflow as tf
        tf_version = tf.__version__
    except ImportError:
        tf_version = None
    return keras.__version__, tf_version


def params_metadata(inst, params, defaults, custom_objects, extra=None):
    """The metadata line (Spark's DefaultParamsWriter layout) of ``inst``
    with ``params`` and ``defaults`` (name -> JSON value) and the "tfring"
    entry: the format, the model's file, the custom objects' names, the
    Keras/TensorFlow versions and ``extra``."""
    import pyspark

    keras_version, tf_version = versions()
    own = {"format": FORMAT, "model": MODEL_FILE,
           "customObjects": {k: _object_name(v) for k, v in (custom_objects or {}).items()},
           "kerasVersion": keras_version, "tensorflowVersion": tf_version}
    own.update(extra or {})
    return {"class": type(inst).__module__ + "." + type(inst).__name__,
            "timestamp": int(round(time.time() * 1000)),
            "sparkVersion": pyspark.__version__, "uid": inst.uid,
            "paramMap": params, "defaultParamMap": defaults, "tfring": own}


def write_folder(path, meta, model_data):
    """Writes the saved folder: the model's .keras bytes (unless None),
    then the metadata."""
    fs, root = filesystem(path)
    if model_data is not None:
        write_bytes(fs, f"{root}/{MODEL_FILE}", model_data)
    write_bytes(fs, f"{root}/{METADATA_FILE}",
                (json.dumps(meta, separators=(",", ":")) + "\n").encode())


def read_folder(path, what):
    """(metadata, its "tfring" entry, the model's .keras bytes or None) of
    a folder that write_folder wrote; ``what`` names the class in errors."""
    check_path(path)
    fs, root = filesystem(path)
    if not exists(fs, f"{root}/{METADATA_FILE}"):
        raise FileNotFoundError(f"{path} holds no saved {what} ({METADATA_FILE} is missing)")
    meta = json.loads(read_bytes(fs, f"{root}/{METADATA_FILE}").decode().splitlines()[0])
    own = meta.get("tfring") or {}
    if own.get("format") != FORMAT:
        raise ValueError(f"{path} was not saved by tfring's {what} (or by a newer "
                         f"version: format {own.get('format')!r}, this reads {FORMAT})")
    name = own.get("model", MODEL_FILE)
    return meta, own, (read_bytes(fs, f"{root}/{name}") if name else None)


def load_model(data, custom_objects, recorded, safe_mode, what):
    """The Keras model of .keras bytes, compiled as saved. A failure for
    want of a custom object names those the folder recorded
    (``recorded``: name -> qualified name) and how to pass them."""
    from tfring.spark.keras import _predict

    try:
        return _predict.load_model_bytes(data, custom_objects, compile=True,
                                         safe_mode=safe_mode)
    except Exception as e:
        missing = sorted(set(recorded) - set(custom_objects))
        if not missing:
            raise
        hint = (f"{e}\n(the model was saved with custom objects "
                f"{ {k: recorded[k] for k in missing} }: pass them as "
                f"{what}.load(path, custom_objects={{...}}) unless they are "
                f"registered Keras serializables)")
        try:
            error = type(e)(hint)
        except Exception:
            error = ValueError(hint)
        raise error from e


def found_custom_objects(recorded, given):
    """``given`` plus the recorded custom objects that Keras finds by
    itself (registered, or in a custom_object_scope): the loaded
    instance's custom_objects, which training and transform ship to the
    executors."""
    import keras

    custom = dict(given)
    for name in recorded:
        if name not in custom:
            found = keras.saving.get_registered_object(name)
            if found is not None:
                custom[name] = found
    return custom


def set_params(instance, meta, decode=None):
    """Sets the saved defaults and params on a fresh ``instance`` (with the
    saved uid); ``decode(name, value)`` turns a JSON value back into the
    param's value."""
    instance._resetUid(meta["uid"])
    decode = decode or (lambda name, value: value)
    for source, setter in ((meta.get("defaultParamMap", {}), instance._setDefault),
                           (meta.get("paramMap", {}), instance._set)):
        values = {k: decode(k, v) for k, v in source.items() if instance.hasParam(k)}
        if values:
            setter(**values)
    return instance


class KerasModelWriter(MLWriter):
    """`model.write()`: `.overwrite()` replaces an existing folder, else
    saving over one fails."""

    def __init__(self, instance):
        super().__init__()
        self.instance = instance

    def save(self, path):
        check_path(path)
        clear_target(path, self.shouldOverwrite)
        self.saveImpl(path)

    def saveImpl(self, path):
        from tfring.spark.keras import _predict

        inst = self.instance
        model = inst.getModel()
        if model is None:
            raise ValueError("KerasModel has no Keras model to save")
        skip = {"model", "custom_objects"}
        params = {p.name: _json_value(v) for p, v in inst._paramMap.items() if p.name not in skip}
        defaults = {p.name: _json_value(v) for p, v in inst._defaultParamMap.items()
                    if p.name not in skip}
        meta = params_metadata(inst, params, defaults, inst.getCustomObjects())
        write_folder(path, meta, _predict.model_bytes(model))


class KerasReader(MLReader):
    """A reader of a folder of this layout (KerasModelReader,
    KerasEstimatorReader): `custom_objects` (name -> class or function)
    brings back the custom objects it was saved with (registered Keras
    serializables need not be passed); `safe_mode=False` lets the model's
    Lambda layers load."""

    def __init__(self, cls, custom_objects=None, safe_mode=True):
        super().__init__()
        self.cls = cls
        self.custom_objects = dict(custom_objects or {})
        self.safe_mode = safe_mode


class KerasModelReader(KerasReader):
    """`KerasModel.read()`: loads a folder that KerasModelWriter wrote."""

    def load(self, path):
        meta, own, data = read_folder(path, "KerasModel")
        recorded = own.get("customObjects") or {}
        model = load_model(data, self.custom_objects, recorded, self.safe_mode, "KerasModel")
        instance = set_params(self.cls(), meta)
        instance._set(model=model,
                      custom_objects=found_custom_objects(recorded, self.custom_objects))
        return instance
