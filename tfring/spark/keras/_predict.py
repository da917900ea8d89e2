"""KerasModel.transform: batched predictions on the executors, over Arrow.

The driver plans, the executors predict:

  driver     serializes the Keras model to `.keras` bytes once per
             transform and broadcasts them; turns each feature column into
             a numeric Arrow-friendly column (a Spark ML vector becomes an
             array of the model input's float type, in the JVM); works out
             each output column's Spark type from the label column it
             mirrors; and adds one Arrow UDF (iterator form) that takes the
             feature columns and returns a struct of the raw outputs, which
             one projection then turns into the output columns (vectors
             rebuilt in the JVM by `array_to_vector`).
  executor   each Python worker loads the model once (a module-level
             cache keyed by a hash of its architecture and weights, so later
             tasks and later transforms of the same model reuse it), turns every Arrow
             batch of rows (spark.sql.execution.arrow.maxRecordsPerBatch,
             10,000 by default) into one array per model input, runs the
             model once on the batch (predict_on_batch: Keras' compiled
             predict step, traced once or twice per worker, with none of
             model.predict's per-call setup) and returns the outputs as
             Arrow.

Only the feature columns cross into Python; every other column stays in
the JVM, and Spark's projection keeps each partition's rows in order.
Predictions run on the CPU, as Horovod's did: several tasks share an
executor, and each would otherwise claim a whole GPU's memory.
"""

import collections
import hashlib

import numpy as np

from tfring.spark.keras import _serialize

# Kinds of output column, by the label column each one mirrors.
VECTOR, ARRAY, SCALAR = "vector", "array", "scalar"

# A Python worker keeps this many loaded models (least recently used go).
_CACHE_SIZE = 4
_models = collections.OrderedDict()
# The driver keeps the broadcasts of this many models' bytes, so transforms
# of one model share one broadcast.
_BROADCASTS = 8
_broadcasts = collections.OrderedDict()

_SCALAR_DTYPES = {"byte": "int8", "short": "int16", "integer": "int32", "long": "int64",
                  "float": "float32", "double": "float64", "boolean": "bool"}


def model_bytes(model):
    """The Keras model as the bytes of a `.keras` file."""
    return _serialize.model_to_bytes(model)


def load_model_bytes(data, custom_objects=None, compile=False, safe_mode=True):
    """A Keras model from the bytes of a `.keras` file."""
    return _serialize.bytes_to_model(data, custom_objects, compile=compile,
                                     safe_mode=safe_mode)


# ---------------------------------------------------------------- driver side


def _spark_scalar_dtype(dt, what):
    name = dt.typeName()
    if name not in _SCALAR_DTYPES:
        raise TypeError(f"{what} has Spark type {dt.simpleString()}; tfring predicts into "
                        f"numeric or boolean scalars, arrays of them and ML vectors")
    return _SCALAR_DTYPES[name]


def _array_depth(dt):
    """(nesting depth, element type) of a Spark ArrayType."""
    from pyspark.sql.types import ArrayType

    depth = 0
    while isinstance(dt, ArrayType):
        depth, dt = depth + 1, dt.elementType
    return depth, dt


def _per_row_shape(tensor):
    """The per-row shape of a Keras input or output (-1 for one unknown
    dimension), or None where it is unknown."""
    shape = getattr(tensor, "shape", None)
    if shape is None:
        return None
    dims = [-1 if d is None else int(d) for d in tuple(shape)[1:]]
    return tuple(dims) if dims.count(-1) <= 1 else None


def _dtype_name(tensor, default="float32"):
    dtype = getattr(tensor, "dtype", None)
    if dtype is None:
        return default
    return getattr(dtype, "name", None) or str(dtype)


def _model_tensors(model, attr):
    try:
        return list(getattr(model, attr) or [])
    except (AttributeError, ValueError):  # a subclassed model never built functionally
        return []


def plan_inputs(schema, feature_cols, model):
    """(Spark columns to hand the UDF, per-input spec (column, per-row shape
    or None, numpy dtype)) for the model's inputs, one feature column each."""
    from pyspark.ml.linalg import VectorUDT
    from pyspark.sql.types import ArrayType

    names = set(schema.names)
    missing = [c for c in feature_cols if c not in names]
    if missing:
        raise ValueError(f"feature column(s) {missing} not in the DataFrame, whose columns "
                         f"are {schema.names}")
    tensors = _model_tensors(model, "inputs")
    if tensors and len(tensors) != len(feature_cols):
        raise ValueError(f"the model has {len(tensors)} input(s) but {len(feature_cols)} "
                         f"feature column(s) {feature_cols}: give one feature column per "
                         f"model input, in the order of model.inputs")
    columns, specs = [], []
    for i, col in enumerate(feature_cols):
        tensor = tensors[i] if tensors else None
        dtype = _dtype_name(tensor)
        dt = schema[col].dataType
        if isinstance(dt, VectorUDT):
            # The JVM unpacks dense and sparse vectors alike; float32
            # rounding there equals numpy's (both round to nearest even).
            as_type = "float32" if dtype == "float32" else "float64"
            columns.append(_vector_to_array(column(col), as_type))
        elif isinstance(dt, ArrayType):
            _spark_scalar_dtype(_array_depth(dt)[1], f"feature column {col!r}")
            columns.append(column(col))
        else:
            _spark_scalar_dtype(dt, f"feature column {col!r}")
            columns.append(column(col))
        specs.append((col, _per_row_shape(tensor), dtype))
    return columns, specs


def _vector_to_array(col, dtype):
    from pyspark.ml.functions import vector_to_array

    return vector_to_array(col, dtype)


def column(name):
    """The top-level column `name`, even where it holds dots or backticks."""
    from pyspark.sql import functions as F

    return F.col("`" + name.replace("`", "``") + "`")


def plan_outputs(label_cols, output_cols, metadata, model):
    """Per-output spec (kind, array depth, numpy dtype, per-row shape or
    None) and the Spark type of each output column, from the label column
    it mirrors (its _metadata entry), else from the model's output."""
    from pyspark.ml.linalg import VectorUDT
    from pyspark.sql.types import ArrayType, DoubleType, FloatType, \
        _parse_datatype_json_string

    if len(output_cols) != len(label_cols):
        raise ValueError(f"{len(output_cols)} output column(s) {output_cols} for "
                         f"{len(label_cols)} label column(s) {label_cols}: setOutputCols "
                         f"takes one name per label column")
    tensors = _model_tensors(model, "outputs")
    if tensors and len(tensors) != len(label_cols):
        raise ValueError(f"the model has {len(tensors)} output(s) but {len(label_cols)} "
                         f"label column(s) {label_cols}")
    specs, types = [], []
    for i, label in enumerate(label_cols):
        tensor = tensors[i] if tensors else None
        meta = (metadata or {}).get(label)
        if meta is None:
            # No record of the label: a scalar where the model predicts one
            # value per row, else an array, of the model's float type.
            shape = _per_row_shape(tensor)
            dtype = _dtype_name(tensor)
            element = FloatType() if dtype == "float32" else DoubleType()
            if shape is not None and int(np.prod(shape)) == 1:
                specs.append((SCALAR, 0, _spark_scalar_dtype(element, "output"), None))
                types.append(element)
            else:
                specs.append((ARRAY, 1, _spark_scalar_dtype(element, "output"), None))
                types.append(ArrayType(element))
            continue
        kind = meta.get("spark_type", SCALAR)
        sql = meta.get("sql_type")
        dt = _parse_datatype_json_string(sql) if sql else None
        if kind == VECTOR:
            specs.append((VECTOR, 1, "float64", None))
            types.append(VectorUDT())
        elif kind == ARRAY:
            if dt is None:
                dt = ArrayType(_from_dtype(meta.get("dtype", "float64")))
            depth, element = _array_depth(dt)
            shape = tuple(meta.get("shape") or ()) or None
            specs.append((ARRAY, depth, _spark_scalar_dtype(element, f"label {label!r}"),
                          shape if shape and len(shape) == depth else None))
            types.append(dt)
        else:
            if dt is None:
                dt = _from_dtype(meta.get("dtype", "float64"))
            specs.append((SCALAR, 0, _spark_scalar_dtype(dt, f"label column {label!r}"), None))
            types.append(dt)
    return specs, types


def _from_dtype(name):
    from pyspark.sql import types as T

    return {"int8": T.ByteType(), "int16": T.ShortType(), "int32": T.IntegerType(),
            "int64": T.LongType(), "float32": T.FloatType(), "float64": T.DoubleType(),
            "bool": T.BooleanType()}.get(str(name), T.DoubleType())


def udf_return_type(specs, types):
    """The struct the Arrow UDF returns: one field per output, a vector
    travelling as an array of doubles."""
    from pyspark.sql.types import ArrayType, DoubleType, StructField, StructType

    fields = []
    for i, ((kind, _, _, _), dt) in enumerate(zip(specs, types)):
        fields.append(StructField(f"o{i}", ArrayType(DoubleType(), False) if kind == VECTOR
                                  else dt, True))
    return StructType(fields)


# -------------------------------------------------------------- executor side


def _pin_cpu():
    """Size TensorFlow's thread pools to the task's cores (one by default),
    as Spark schedules one task per core; a worker whose TensorFlow already
    started keeps its pools."""
    import tensorflow as tf
    from pyspark import TaskContext

    ctx = TaskContext.get()
    cpus = max(1, int(ctx.cpus())) if ctx is not None else None
    if cpus:
        try:
            tf.config.threading.set_intra_op_parallelism_threads(cpus)
            tf.config.threading.set_inter_op_parallelism_threads(cpus)
        except RuntimeError:
            pass


def cached_model(key, payload, custom_objects, floatx):
    """This worker's copy of the model: loaded from `payload` (a broadcast
    of the `.keras` bytes, or the bytes) on first use, then from the cache."""
    model = _models.get(key)
    if model is not None:
        _models.move_to_end(key)
        return model
    import keras
    import tensorflow as tf

    _pin_cpu()
    if floatx:
        keras.backend.set_floatx(floatx)
    data = payload.value if hasattr(payload, "value") else payload
    with tf.device("/CPU:0"):
        model = load_model_bytes(data, custom_objects, compile=False, safe_mode=False)
    try:
        model.jit_compile = False  # (an XLA compile per worker would not pay off on a CPU)
    except (AttributeError, ValueError):
        pass
    _models[key] = model
    while len(_models) > _CACHE_SIZE:
        _models.popitem(last=False)
    return model


def model_key(data, custom_objects, floatx):
    """The cache key of a model's `.keras` bytes: a hash of the members
    but metadata.json (which holds the time of saving, so that one model
    saved twice has one key), the custom objects' names and floatx."""
    import io
    import zipfile

    h = hashlib.sha256()
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            for name in sorted(z.namelist()):
                if name != "metadata.json":
                    h.update(name.encode() + b"\0")
                    h.update(z.read(name))
    except zipfile.BadZipFile:
        h.update(data)
    h.update(repr((sorted(custom_objects or {}), floatx)).encode())
    return h.hexdigest()


def _is_list(t):
    import pyarrow as pa

    return pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)


def arrow_to_numpy(arr, col, shape, dtype):
    """One feature column's Arrow batch as a (rows, *shape) numpy array."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    n = len(arr)
    dims = []
    while True:
        if arr.null_count:
            raise ValueError(f"feature column {col!r} holds null values; KerasModel.transform "
                             f"needs a value in every row (filter or fill them first)")
        if not _is_list(arr.type):
            break
        lengths = pc.list_value_length(arr).to_numpy(zero_copy_only=False)
        if len(lengths) and (lengths != lengths[0]).any():
            raise ValueError(f"feature column {col!r} holds arrays of different lengths "
                             f"({int(lengths.min())} to {int(lengths.max())} in one batch); "
                             f"a model input needs one shape for every row")
        dims.append(int(lengths[0]) if len(lengths) else 0)
        arr = arr.flatten()
    values = arr.to_numpy(zero_copy_only=False).reshape((n, *dims))
    if shape is not None:
        try:
            values = values.reshape((n, *shape))
        except ValueError:
            raise ValueError(f"feature column {col!r} has {int(np.prod(dims))} value(s) per "
                             f"row, which cannot fill the model input's per-row shape "
                             f"{tuple(shape)}") from None
    elif not dims:
        values = values.reshape(n, 1)  # a scalar column feeds a (rows, 1) input
    return values.astype(dtype, copy=False)


def numpy_to_arrow(pred, spec, label):
    """One output's numpy batch as the Arrow array of its output column."""
    import pyarrow as pa

    kind, depth, dtype, shape = spec
    n = pred.shape[0]
    if kind == SCALAR:
        if pred.size != n:
            raise ValueError(f"the model predicts {pred.size // max(n, 1)} values per row for "
                             f"the scalar label column {label!r}; a scalar output needs one")
        values = pred.reshape(n)
        if np.dtype(dtype).kind in "iub" and values.dtype.kind == "f":
            # An integer or boolean label: the prediction rounded, as
            # Horovod's KerasModel rounds it.
            values = np.rint(values)
            values = values != 0 if dtype == "bool" else values
        return pa.array(values.astype(dtype, copy=False))
    row = pred.shape[1:]
    if kind == VECTOR or depth == 1:
        lengths = [n, int(np.prod(row))]
    elif shape is not None and int(np.prod(shape)) == int(np.prod(row)):
        lengths = [n, *shape]
    elif len(row) == depth:
        lengths = [n, *row]
    else:
        raise ValueError(f"the model predicts per-row shape {tuple(row)} for label column "
                         f"{label!r}, an array nested {depth} deep")
    values = pred.reshape(-1)
    if np.dtype(dtype).kind in "iu" and values.dtype.kind == "f":
        values = np.rint(values)
    values = values.astype(dtype, copy=False)
    # Nest from the innermost level out: level k holds prod(lengths[:k]) lists.
    arr = pa.array(values)
    for level in range(len(lengths) - 1, 0, -1):
        count = int(np.prod(lengths[:level]))
        offsets = np.arange(count + 1, dtype=np.int64) * lengths[level]
        arr = pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), arr)
    return arr


def _outputs(y, label_cols):
    """The model's outputs as a list of numpy arrays, in label order."""
    if isinstance(y, dict):
        y = [y[c] for c in label_cols] if all(c in y for c in label_cols) else list(y.values())
    elif not isinstance(y, (list, tuple)):
        y = [y]
    return [np.asarray(t) for t in y]


def predict_batches(batches, key, payload, custom_objects, floatx, inputs, outputs,
                    label_cols, arrow_type):
    """The Arrow UDF: feature-column batches in, struct-of-outputs out
    (`arrow_type`, the Arrow type of udf_return_type)."""
    import pyarrow as pa
    import tensorflow as tf

    model = cached_model(key, payload, custom_objects, floatx)
    names = [f"o{i}" for i in range(len(outputs))]
    for batch in batches:
        cols = list(batch) if isinstance(batch, (tuple, list)) else [batch]
        n = len(cols[0])
        xs = [arrow_to_numpy(a, *spec) for a, spec in zip(cols, inputs)]
        if not n:
            yield pa.array([], type=arrow_type)
            continue
        with tf.device("/CPU:0"):
            y = model.predict_on_batch(xs[0] if len(xs) == 1 else xs)
        preds = _outputs(y, label_cols)
        if len(preds) != len(outputs):
            raise ValueError(f"the model returned {len(preds)} output(s) for "
                             f"{len(outputs)} label column(s) {label_cols}")
        arrays = [numpy_to_arrow(p, spec, label)
                  for p, spec, label in zip(preds, outputs, label_cols)]
        yield pa.StructArray.from_arrays(arrays, names=names)


# ---------------------------------------------------------------- the plan


def _broadcast(sc, key, data):
    """The broadcast of a model's bytes in this SparkContext, made once."""
    k = (sc.applicationId, key)
    bc = _broadcasts.get(k)
    if bc is None:
        bc = _broadcasts[k] = sc.broadcast(data)
        while len(_broadcasts) > _BROADCASTS:
            _broadcasts.popitem(last=False)
    _broadcasts.move_to_end(k)
    return bc


def _payload(session, key, data):
    """What the UDF carries to the workers: a broadcast of the bytes in a
    classic session; the bytes themselves through Spark Connect, whose
    client has no SparkContext to broadcast from (the plan ships them)."""
    try:
        sc = session.sparkContext
    except Exception:  # Connect: PySparkAttributeError JVM_ATTRIBUTE_NOT_SUPPORTED
        return data
    return _broadcast(sc, key, data)


def transform(df, model, feature_cols, label_cols, output_cols, metadata, custom_objects=None,
              floatx=None):
    """`df` with one prediction column per label column appended (named by
    `output_cols`); every input column and each partition's row order kept."""
    import warnings

    import pyspark
    from pyspark.ml.functions import array_to_vector
    from pyspark.sql.pandas.types import to_arrow_type

    try:
        from pyspark.sql.functions import ArrowUDFType, arrow_udf
    except ImportError:
        raise RuntimeError(f"KerasModel.transform needs pyspark 4.1 or later (Arrow UDFs); "
                           f"this is pyspark {pyspark.__version__}") from None
    if model is None:
        raise ValueError("KerasModel has no Keras model (setModel or the constructor's model)")
    taken = [c for c in output_cols if c in df.columns]
    if taken:
        raise ValueError(f"output column(s) {taken} already in the DataFrame; name others "
                         f"with setOutputCols")
    columns, inputs = plan_inputs(df.schema, list(feature_cols), model)
    outputs, types = plan_outputs(list(label_cols), list(output_cols), metadata, model)
    return_type = udf_return_type(outputs, types)

    data = model_bytes(model)
    key = model_key(data, custom_objects, floatx)
    payload = _payload(df.sparkSession, key, data)
    custom_objects = dict(custom_objects or {})
    label_cols = list(label_cols)
    arrow_type = to_arrow_type(return_type)

    def predict(batches):
        return predict_batches(batches, key, payload, custom_objects, floatx, inputs, outputs,
                               label_cols, arrow_type)

    with warnings.catch_warnings():  # (type hints could not say 1 vs n columns)
        warnings.simplefilter("ignore", UserWarning)
        udf = arrow_udf(predict, return_type, ArrowUDFType.SCALAR_ITER)

    tmp = "__tfring_predictions"
    while tmp in df.columns:
        tmp += "_"
    out = df.withColumn(tmp, udf(*columns))
    results = []
    for i, ((kind, _, _, _), name) in enumerate(zip(outputs, output_cols)):
        field = column(tmp).getField(f"o{i}")
        results.append((array_to_vector(field) if kind == VECTOR else field).alias(name))
    return out.select(*[column(c) for c in df.columns], *results)
