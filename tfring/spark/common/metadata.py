"""Per-column metadata of the estimator's data, and the checks that a
column fits a model input or output.

The metadata of a column (the contract KerasModel relies on; the estimator
passes it as KerasModel(_metadata=...) for every feature and label column):

    {"spark_type": "vector" | "array" | "scalar",
     "dtype": numpy name of the element type ("float32", "float64", "int64",
              "int32", "int16", "int8", "bool"; vectors are "float64"),
     "shape": per-row shape as a list of ints ([] for a scalar, [n] for a
              vector or array of n, [n, m] for an array of arrays),
     "sql_type": the column's Spark type as JSON (df.schema[col].dataType.json())}

It comes from the DataFrame's schema, and from its first row where a vector
or array length must be read (a vector's size is read from its ML attribute
metadata when VectorAssembler left one, so no Spark job runs). For data that
fit_on_parquet finds in the store without a metadata file, it comes from the
Parquet schema and the first row of the first file.
"""

import json

import numpy as np

from tfring.spark.common import tensor_codec

VECTOR, ARRAY, SCALAR = "vector", "array", "scalar"

_SPARK_SCALARS = {"byte": "int8", "short": "int16", "integer": "int32", "long": "int64",
                  "float": "float32", "double": "float64", "boolean": "bool"}


def _spark_scalar(dt):
    """numpy dtype name of a numeric Spark scalar type, else None."""
    return _SPARK_SCALARS.get(dt.typeName())


def _array_element(dt):
    """(depth, element type) of a (nested) Spark ArrayType."""
    from pyspark.sql.types import ArrayType

    depth = 0
    while isinstance(dt, ArrayType):
        depth += 1
        dt = dt.elementType
    return depth, dt


def _is_vector(dt):
    from pyspark.ml.linalg import VectorUDT

    return isinstance(dt, VectorUDT)


def describe_type(col, dt):
    """(spark_type, dtype, depth) of a Spark column type, or a ValueError
    naming the column when it is not numeric."""
    from pyspark.sql.types import ArrayType

    if _is_vector(dt):
        return VECTOR, "float64", 1
    if isinstance(dt, ArrayType):
        depth, elem = _array_element(dt)
        dtype = _spark_scalar(elem)
        if dtype is None:
            raise ValueError(f"column {col!r} is an array of {elem.simpleString()}, not of "
                             "numbers: the model reads numeric columns only (scalars, arrays "
                             "of numbers, Spark ML vectors)")
        return ARRAY, dtype, depth
    dtype = _spark_scalar(dt)
    if dtype is None:
        hint = " (cast it: df.withColumn(c, F.col(c).cast('double')))" \
            if dt.typeName() == "decimal" else ""
        raise ValueError(f"column {col!r} has type {dt.simpleString()}, not a number: the "
                         "model reads numeric columns only (scalars, arrays of numbers, "
                         f"Spark ML vectors){hint}")
    return SCALAR, dtype, 0


def _vector_size_from_schema(field):
    attrs = (field.metadata or {}).get("ml_attr") or {}
    n = attrs.get("num_attrs")
    if n is None and isinstance(attrs.get("attrs"), dict):
        n = sum(len(v) for v in attrs["attrs"].values())
    return int(n) if n else None


def _row_shape(value, depth):
    shape = []
    for _ in range(depth):
        if value is None:
            return None
        if hasattr(value, "toArray"):  # an ML vector
            value = value.toArray()
        shape.append(len(value))
        value = value[0] if len(value) else None
        if value is None and len(shape) < depth:
            return None
    return shape


def column_metadata(df, cols, read_row=True):
    """The metadata (module docstring) of ``cols`` of ``df``. Raises a
    ValueError naming the column for a missing or non-numeric column, or
    for an empty DataFrame. Runs at most one small Spark job (the first
    row), and none when every column is a scalar or a sized vector; with
    read_row=False none at all, leaving the shapes it cannot tell None."""
    schema = df.schema
    names = set(schema.names)
    missing = [c for c in cols if c not in names]
    if missing:
        raise ValueError(f"column {missing[0]!r} is not in the DataFrame (its columns: "
                         f"{', '.join(schema.names)})")
    meta, need_row = {}, []
    for col in cols:
        field = schema[col]
        kind, dtype, depth = describe_type(col, field.dataType)
        shape = [] if kind == SCALAR else None
        if kind == VECTOR:
            n = _vector_size_from_schema(field)
            shape = [n] if n else None
        meta[col] = {"spark_type": kind, "dtype": dtype, "shape": shape,
                     "sql_type": field.dataType.json(), "_depth": depth}
        if shape is None:
            need_row.append(col)
    if need_row and read_row:
        from pyspark.sql import functions as F

        cond = None
        for c in need_row:
            cond = F.col(f"`{c}`").isNotNull() if cond is None \
                else cond & F.col(f"`{c}`").isNotNull()
        rows = df.select(*[F.col(f"`{c}`") for c in need_row]).where(cond).head(1)
        if not rows:
            raise ValueError(f"the DataFrame has no row with values in {need_row}: cannot "
                             "read the length of its arrays or vectors (is it empty?)")
        for c in need_row:
            shape = _row_shape(rows[0][c], meta[c]["_depth"])
            if shape is None:
                raise ValueError(f"column {c!r}: its first row has an empty or null nested "
                                 "array, so its per-row shape is unknown")
            meta[c]["shape"] = shape
    for m in meta.values():
        m.pop("_depth")
    return meta


def known(metadata):
    """The columns of ``metadata`` whose shapes are known."""
    return {c: m for c, m in metadata.items() if m["shape"] is not None}


# --- from Parquet (fit_on_parquet on data without a metadata file) ----------

_ARROW_SPARK = {"int8": "byte", "int16": "short", "int32": "integer", "int64": "long",
                "float": "float", "double": "double", "bool": "boolean", "halffloat": "float"}
_NUMPY_OF_ARROW = {"int8": "int8", "int16": "int16", "int32": "int32", "int64": "int64",
                   "float": "float32", "double": "float64", "bool": "bool",
                   "halffloat": "float32"}


def _arrow_is_list(t):
    import pyarrow as pa

    return pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)


def arrow_metadata(schema, first_rows, cols):
    """The metadata of ``cols`` from a Parquet file's arrow ``schema`` and
    a pyarrow Table of its first row(s); a BINARY tensor column written by
    prepare (tensor_codec.py) carries its own metadata."""
    meta = {}
    for col in cols:
        if col not in schema.names:
            raise ValueError(f"column {col!r} is not in the Parquet data (its columns: "
                             f"{', '.join(schema.names)})")
        t = schema.field(col).type
        if tensor_codec.is_binary(t):
            written = tensor_codec.parquet_field_metadata(schema, col)
            if written is None:
                raise ValueError(f"column {col!r} holds byte strings, not numbers (and is no "
                                 "tensor column written by KerasEstimator.fit)")
            meta[col] = written
            continue
        depth = 0
        while _arrow_is_list(t):
            depth += 1
            t = t.value_type
        name = str(t)
        if name not in _NUMPY_OF_ARROW:
            raise ValueError(f"column {col!r} holds {schema.field(col).type}, not numbers")
        spark_json = json.dumps(_ARROW_SPARK[name])
        for _ in range(depth):
            spark_json = json.dumps({"type": "array", "elementType": json.loads(spark_json),
                                     "containsNull": True})
        if depth == 0:
            shape = []
        else:
            if first_rows is None or first_rows.num_rows == 0:
                raise ValueError(f"column {col!r}: no rows to read its per-row shape from")
            shape = _row_shape(first_rows.column(col)[0].as_py(), depth)
            if shape is None:
                raise ValueError(f"column {col!r}: its first row is null or empty")
        meta[col] = {"spark_type": ARRAY if depth else SCALAR, "dtype": _NUMPY_OF_ARROW[name],
                     "shape": shape, "sql_type": spark_json}
    return meta


# --- model shapes -------------------------------------------------------------

def model_shapes(tensors):
    """Per-row shapes of a model's inputs or outputs (None for unknown
    dimensions)."""
    out = []
    for t in tensors:
        shape = tuple(t.shape)[1:]
        out.append([None if d is None else int(d) for d in shape])
    return out


def fits(col_shape, target_shape):
    """Whether a column of per-row shape ``col_shape`` can be reshaped into a
    model tensor of per-row shape ``target_shape`` (unknown dimensions take
    whatever is left over)."""
    size = int(np.prod(col_shape)) if col_shape else 1
    known = [d for d in target_shape if d is not None]
    known_size = int(np.prod(known)) if known else 1
    if len(known) == len(target_shape):
        return size == known_size
    return known_size > 0 and size % known_size == 0 and size >= known_size


def check_shapes(metadata, feature_cols, label_cols, input_shapes, output_shapes,
                 label_shapes=None):
    """Raises a ValueError naming the column whose per-row shape does not
    fit the model input or output at its index, or when the number of
    columns differs from the number of inputs or outputs."""
    if len(feature_cols) != len(input_shapes):
        raise ValueError(f"feature_cols has {len(feature_cols)} columns {feature_cols} but the "
                         f"model has {len(input_shapes)} inputs: give one column per input, "
                         "in the order of model.inputs")
    targets = label_shapes if label_shapes is not None else output_shapes
    what = "label_shapes entries" if label_shapes is not None else "outputs"
    if len(label_cols) != len(targets):
        raise ValueError(f"label_cols has {len(label_cols)} columns {label_cols} but the "
                         f"model has {len(targets)} {what}: give one column per output")
    for i, (col, shape) in enumerate(zip(feature_cols, input_shapes)):
        if col not in metadata:
            continue  # its shape is not known yet
        col_shape = metadata[col]["shape"]
        if not fits(col_shape, shape):
            raise ValueError(
                f"feature column {col!r} has per-row shape {tuple(col_shape)} "
                f"({int(np.prod(col_shape)) if col_shape else 1} values), which does not fit "
                f"model input {i} of per-row shape {_fmt(shape)}")
    for i, (col, shape) in enumerate(zip(label_cols, targets)):
        if col not in metadata:
            continue
        shape = [None if d in (None, -1) else int(d) for d in shape]
        col_shape = metadata[col]["shape"]
        if not fits(col_shape, shape) and not _sparse_label(metadata[col], shape):
            raise ValueError(
                f"label column {col!r} has per-row shape {tuple(col_shape)}, which does not fit "
                f"model output {i} of per-row shape {_fmt(shape)}")


def _sparse_label(meta, shape):
    """An integer class index for a softmax output (sparse categorical
    losses): a scalar integer label against an output of any width."""
    return meta["shape"] == [] and meta["dtype"].startswith("int") and len(shape) == 1


def _fmt(shape):
    return "(" + ", ".join("None" if d is None else str(d) for d in shape) + \
        ("," if len(shape) == 1 else "") + ")"
