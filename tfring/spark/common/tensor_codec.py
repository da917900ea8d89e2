"""Fixed-shape tensor columns as bytes: how the estimator stores array and
vector columns in the store, and how the ranks read them back.

Spark writes an array column to Parquet as a LIST: every element carries
its own repetition and definition levels, and decoding those levels is
most of what reading such a column costs (about 0.4 ms for a batch of 256
rows of 256 floats with pyarrow, against 0.1 ms for the same bytes in a
binary column). The estimator's data are rows of one fixed shape, so
prepare writes each array or vector column as BINARY instead: a row is its
values' bytes, little-endian, C order, in the column's element type (the
metadata's ``dtype``; vectors are float64), ``prod(shape) * itemsize``
bytes a row. Reading a batch is then one ``np.frombuffer`` of the column's
value buffer.

A column so written carries its metadata (metadata.py: spark_type, dtype,
shape, sql_type) in the Spark schema's field metadata under ``tfring``,
which Spark keeps in the Parquet footer, so fit_on_parquet reads it back
without the store's metadata file. Scalar columns stay as Spark writes
them.

    encode_batch(batch, columns) -> RecordBatches   (prepare, in mapInArrow)
    decode(arr, col, dtype, shape) -> numpy          (the reader)
"""

import json

import numpy as np

FIELD_KEY = "tfring"
_SPARK_ROW_METADATA = b"org.apache.spark.sql.parquet.row.metadata"
_MAX_BYTES = (1 << 31) - 1  # a BINARY array's int32 offsets


def is_binary(t):
    import pyarrow as pa

    return pa.types.is_binary(t) or pa.types.is_large_binary(t) or \
        pa.types.is_fixed_size_binary(t)


def row_bytes(dtype, shape):
    return int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize


def _flat_values(arr, depth):
    """The values of a (nested) list array of equal-length rows, flattened;
    the rows' lengths were checked where the column was selected."""
    import pyarrow as pa

    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    for _ in range(depth):
        arr = arr.flatten()
    return arr.to_numpy(zero_copy_only=False)


def _binary(values, n, width):
    """A BINARY array of n rows of ``width`` bytes each over ``values``."""
    import pyarrow as pa

    data = np.ascontiguousarray(values).view(np.uint8).reshape(-1)
    offsets = np.arange(n + 1, dtype=np.int32) * np.int32(width)
    return pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets),
                                                  pa.py_buffer(data)])


def encode_batch(batch, columns):
    """``batch`` (a RecordBatch) with each column named in ``columns``
    (column -> metadata) as BINARY rows; yields one or more RecordBatches,
    each small enough for int32 offsets."""
    import pyarrow as pa

    widths = {c: row_bytes(m["dtype"], m["shape"]) for c, m in columns.items()}
    step = max(1, _MAX_BYTES // max(1, sum(widths.values())))
    for start in range(0, max(batch.num_rows, 1), step):
        part = batch.slice(start, step)
        arrays, fields = [], []
        for field, arr in zip(part.schema, part.columns):
            if field.name in columns:
                m = columns[field.name]
                values = _flat_values(arr, len(m["shape"]))
                values = values.astype(np.dtype(m["dtype"]).newbyteorder("<"), copy=False)
                arr = _binary(values, part.num_rows, widths[field.name])
                field = pa.field(field.name, pa.binary(), nullable=False)
            arrays.append(arr)
            fields.append(field)
        yield pa.RecordBatch.from_arrays(arrays, schema=pa.schema(fields))
        if batch.num_rows == 0:
            return


def decode(arr, col, dtype, shape):
    """A BINARY column of a record batch as a (rows, *shape) numpy array of
    ``dtype``; a null or a row of another length is an error naming the
    column."""
    import pyarrow as pa

    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks() if arr.num_chunks != 1 else arr.chunk(0)
    n, width = len(arr), row_bytes(dtype, shape)
    if arr.null_count:
        raise ValueError(f"column {col!r} holds {arr.null_count} null value(s): the model "
                         "needs a value in every row")
    if n == 0:
        return np.empty((0, *shape), dtype)
    data = arr.buffers()[-1]
    if pa.types.is_fixed_size_binary(arr.type):
        ok, start = arr.type.byte_width == width, arr.offset * width
    else:
        large = pa.types.is_large_binary(arr.type)
        offsets = np.frombuffer(arr.buffers()[1], np.int64 if large else np.int32)
        offsets = offsets[arr.offset:arr.offset + n + 1]
        ok = bool(np.all(np.diff(offsets) == width))
        start = int(offsets[0])
    if not ok:
        raise ValueError(f"column {col!r}: its rows hold byte strings of another length than "
                         f"{width} bytes ({np.dtype(dtype).name} of shape {tuple(shape)}): "
                         "not the tensors its metadata describes")
    flat = np.frombuffer(data, np.dtype(dtype).newbyteorder("<"),
                         count=n * width // np.dtype(dtype).itemsize, offset=start)
    return flat.astype(np.dtype(dtype), copy=False).reshape((n, *shape))


def spark_field_metadata(meta):
    """The Spark field metadata that marks a column written by encode_batch."""
    return {FIELD_KEY: json.dumps(meta, sort_keys=True)}


def parquet_field_metadata(schema, col):
    """The metadata encode_batch's writer left for ``col`` in a Parquet
    file's arrow ``schema`` (Spark's row metadata, or the field's own), or
    None."""
    field = schema.field(col)
    own = (field.metadata or {}).get(FIELD_KEY.encode())
    if own is not None:
        return json.loads(own)
    row = (schema.metadata or {}).get(_SPARK_ROW_METADATA)
    if row is None:
        return None
    for f in json.loads(row).get("fields", []):
        if f.get("name") == col and FIELD_KEY in (f.get("metadata") or {}):
            return json.loads(f["metadata"][FIELD_KEY])
    return None
