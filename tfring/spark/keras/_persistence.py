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


class KerasModelWriter(MLWriter):
    """`model.write()`: `.overwrite()` replaces an existing folder, else
    saving over one fails."""

    def __init__(self, instance):
        super().__init__()
        self.instance = instance

    def save(self, path):
        if not isinstance(path, str):
            raise TypeError(f"path should be a string, got {type(path).__name__}")
        fs, root = filesystem(path)
        if exists(fs, root):
            if not self.shouldOverwrite:
                raise FileExistsError(
                    f"{path} already exists: save with model.write().overwrite().save(path) "
                    f"to replace it")
            info = fs.get_file_info(root)
            if info.type == info.type.Directory:
                fs.delete_dir(root)
            else:
                fs.delete_file(root)
        self.saveImpl(path)

    def saveImpl(self, path):
        import keras
        import pyspark

        from tfring.spark.keras import _predict

        inst = self.instance
        model = inst.getModel()
        if model is None:
            raise ValueError("KerasModel has no Keras model to save")
        skip = {"model", "custom_objects"}
        params = {p.name: _json_value(v) for p, v in inst._paramMap.items() if p.name not in skip}
        defaults = {p.name: _json_value(v) for p, v in inst._defaultParamMap.items()
                    if p.name not in skip}
        custom = inst.getCustomObjects() or {}
        try:
            import tensorflow as tf
            tf_version = tf.__version__
        except ImportError:
            tf_version = None
        meta = {"class": type(inst).__module__ + "." + type(inst).__name__,
                "timestamp": int(round(time.time() * 1000)),
                "sparkVersion": pyspark.__version__, "uid": inst.uid,
                "paramMap": params, "defaultParamMap": defaults,
                "tfring": {"format": FORMAT, "model": MODEL_FILE,
                           "customObjects": {k: _object_name(v) for k, v in custom.items()},
                           "kerasVersion": keras.__version__,
                           "tensorflowVersion": tf_version}}
        fs, root = filesystem(path)
        write_bytes(fs, f"{root}/{MODEL_FILE}", _predict.model_bytes(model))
        write_bytes(fs, f"{root}/{METADATA_FILE}",
                    (json.dumps(meta, separators=(",", ":")) + "\n").encode())


class KerasModelReader(MLReader):
    """`KerasModel.read()`: loads a folder that KerasModelWriter wrote.
    `custom_objects` (name -> class or function) brings back the custom
    objects the model was saved with; registered Keras serializables need
    not be passed."""

    def __init__(self, cls, custom_objects=None, safe_mode=True):
        super().__init__()
        self.cls = cls
        self.custom_objects = dict(custom_objects or {})
        self.safe_mode = safe_mode

    def load(self, path):
        from tfring.spark.keras import _predict

        if not isinstance(path, str):
            raise TypeError(f"path should be a string, got {type(path).__name__}")
        fs, root = filesystem(path)
        if not exists(fs, f"{root}/{METADATA_FILE}"):
            raise FileNotFoundError(f"{path} holds no saved KerasModel "
                                    f"({METADATA_FILE} is missing)")
        meta = json.loads(read_bytes(fs, f"{root}/{METADATA_FILE}").decode().splitlines()[0])
        own = meta.get("tfring") or {}
        if own.get("format") != FORMAT:
            raise ValueError(f"{path} was not saved by tfring's KerasModel (or by a newer "
                             f"version: format {own.get('format')!r}, this reads {FORMAT})")
        recorded = own.get("customObjects") or {}
        data = read_bytes(fs, f"{root}/{own.get('model', MODEL_FILE)}")
        try:
            model = _predict.load_model_bytes(data, self.custom_objects, compile=True,
                                              safe_mode=self.safe_mode)
        except Exception as e:
            missing = sorted(set(recorded) - set(self.custom_objects))
            if not missing:
                raise
            hint = (f"{e}\n(the model was saved with custom objects "
                    f"{ {k: recorded[k] for k in missing} }: pass them as "
                    f"KerasModel.load(path, custom_objects={{...}}) unless they are "
                    f"registered Keras serializables)")
            try:
                error = type(e)(hint)
            except Exception:
                error = ValueError(hint)
            raise error from e
        # The recorded custom objects that Keras found by itself (registered,
        # or in a custom_object_scope) become the param too: transform ships
        # them to the executors.
        import keras

        custom = dict(self.custom_objects)
        for name in recorded:
            if name not in custom:
                found = keras.saving.get_registered_object(name)
                if found is not None:
                    custom[name] = found
        instance = self.cls()
        instance._resetUid(meta["uid"])
        for source, setter in ((meta.get("defaultParamMap", {}), instance._setDefault),
                               (meta.get("paramMap", {}), instance._set)):
            values = {k: v for k, v in source.items() if instance.hasParam(k)}
            if values:
                setter(**values)
        instance._set(model=model, custom_objects=custom)
        return instance
