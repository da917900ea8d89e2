"""Writes the columns a fit needs to Parquet in the store, with DataFrame
operations only (the executors write; nothing is collected to the driver
but the first row where an array length must be read, and the Parquet
footers' row counts).

For one fit:

  1. the needed columns are selected: features, labels, the sample weight
     and a validation column; Spark ML vectors become arrays of doubles
     (pyspark.ml.functions.vector_to_array). Each array's length and every
     value's presence are checked as the rows are written (raise_error), so
     a ragged or null row fails the write naming its column. Array and
     vector columns are then written as BINARY tensors, a row's values as
     bytes (tensor_codec.py: a rank reads them several times faster than
     Parquet LISTs);
  2. the validation split: a fraction takes a seeded randomSplit (the seed
     is random_seed, else 0, so refitting a DataFrame splits it the same
     way); a column name sends the rows where it is true (or > 0) to
     validation, and the column is dropped;
  3. each split is repartitioned round-robin into num_proc *
     partitions_per_process files (validation: num_proc times the
     fraction's share, at least num_proc), so ranks get equal numbers of
     files of about equal size, and written to
     store.get_train_data_path(idx) / get_val_data_path(idx);
  4. the row counts (from the Parquet footers), the file names and the
     column metadata are written to store.get_data_metadata_path(path).

idx is a hash of the DataFrame's plan (semanticHash), the columns, the
validation split and the file count: the same DataFrame and settings map
to the same paths, which a later run overwrites. Within one driver process,
fitting the same DataFrame object again with the same settings reuses the
data already written.
"""

import hashlib
import json
import posixpath
import threading
import weakref
from dataclasses import dataclass, field

from tfring.spark.common import metadata as md

_MARK = "tfring.prepare:"
_lock = threading.Lock()
_written = {}  # (store prefix, idx) -> (weakref to the DataFrame, DataInfo)


@dataclass
class DataInfo:
    """Where one fit's data lies and what it holds."""
    idx: object
    train_path: str
    val_path: object  # None without validation
    train_rows: int
    val_rows: int
    train_files: list
    val_files: list
    metadata: dict  # column -> metadata (metadata.py), every written column
    reused: bool = False
    extra: dict = field(default_factory=dict)


def check_validation(validation, df_columns=None, schema=None):
    """validation is None, a fraction in [0, 1), or a column of booleans or
    integers."""
    if validation is None or validation == 0:
        return
    if isinstance(validation, float):
        if not 0 <= validation < 1:
            raise ValueError(f"validation={validation}: a validation fraction must be in "
                             "[0, 1)")
        return
    if isinstance(validation, str):
        if df_columns is not None and validation not in df_columns:
            raise ValueError(f"validation column {validation!r} is not in the DataFrame")
        if schema is not None:
            name = schema[validation].dataType.typeName()
            if name not in ("boolean", "byte", "short", "integer", "long"):
                raise ValueError(f"validation column {validation!r} has type {name}: it must "
                                 "hold booleans or integers (true / > 0: a validation row)")
        return
    raise ValueError(f"validation must be a fraction or a column name, got {validation!r}")


def _col(name):
    from pyspark.sql import functions as F

    return F.col("`" + name.replace("`", "``") + "`")


def _checked(name, meta):
    """The column as written: vectors as arrays, and a row whose value is
    null or whose array length differs from the first row's fails the write
    naming the column."""
    from pyspark.ml.functions import vector_to_array
    from pyspark.sql import functions as F

    c = _col(name)
    if meta["spark_type"] == md.VECTOR:
        c = vector_to_array(c, "float64")
    bad = c.isNull()
    shape = meta["shape"]
    if meta["spark_type"] != md.SCALAR:
        bad = bad | (F.size(c) != shape[0])
        if len(shape) >= 2:
            bad = bad | F.exists(c, lambda x: x.isNull() | (F.size(x) != shape[1]))
        elif meta["spark_type"] == md.ARRAY:
            bad = bad | F.exists(c, lambda x: x.isNull())
    msg = (f"{_MARK} column {name!r} has a null value, or an array whose length differs from "
           f"the first row's (per-row shape {shape})")
    return F.when(bad, F.raise_error(F.lit(msg))).otherwise(c).alias(name)


def _encoded(df, meta):
    """``df`` with its array and vector columns as BINARY tensors
    (tensor_codec.py), through mapInArrow on the executors; each carries
    its metadata in the Spark field metadata, which the Parquet footer
    keeps."""
    from pyspark.sql.types import BinaryType, StructField, StructType

    from tfring.spark.common import tensor_codec

    tensors = {f.name: meta[f.name] for f in df.schema
               if f.name in meta and meta[f.name]["spark_type"] != md.SCALAR}
    if not tensors:
        return df
    schema = StructType([
        StructField(f.name, BinaryType(), False, tensor_codec.spark_field_metadata(
            tensors[f.name])) if f.name in tensors else f for f in df.schema])

    def encode(batches):
        for batch in batches:
            yield from tensor_codec.encode_batch(batch, tensors)

    return df.mapInArrow(encode, schema)


def _data_key(df, cols, validation, seed, n_train, n_val):
    try:
        plan = str(df.semanticHash())
    except Exception:  # Spark Connect or an old Spark
        plan = f"id{id(df)}"
    text = json.dumps([plan, cols, validation, seed, n_train, n_val, df.schema.json()],
                      default=str)
    return hashlib.sha1(text.encode()).hexdigest()[:12]


def _spark_error(e):
    """A write that failed on one of our checks: its message, else None."""
    text = str(e)
    i = text.find(_MARK)
    if i < 0:
        return None
    line = text[i + len(_MARK):].splitlines()[0]
    return line.strip()


def _count(store, files):
    import pyarrow.parquet as pq

    rows = 0
    for f in files:
        with store.filesystem.open_input_file(store.get_localized_path(f)) as fh:
            rows += pq.ParquetFile(fh).metadata.num_rows
    return rows


def prepare_data(df, store, num_proc, feature_cols, label_cols, metadata,
                 sample_weight_col=None, validation=None, partitions_per_process=10,
                 random_seed=None, verbose=0, log=print):
    """Writes the needed columns of ``df`` into ``store`` (module docstring)
    and returns a DataInfo. ``metadata``: the features' and labels' column
    metadata (metadata.column_metadata)."""
    if num_proc < 1 or partitions_per_process < 1:
        raise ValueError(f"num_proc={num_proc} and partitions_per_process="
                         f"{partitions_per_process} must both be >= 1")
    check_validation(validation, df.columns, df.schema)
    cols = list(dict.fromkeys(list(feature_cols) + list(label_cols)
                              + ([sample_weight_col] if sample_weight_col else [])))
    meta = dict(metadata)
    if sample_weight_col and sample_weight_col not in meta:
        meta.update(md.column_metadata(df, [sample_weight_col]))
    if sample_weight_col and meta[sample_weight_col]["spark_type"] != md.SCALAR:
        raise ValueError(f"sample_weight_col {sample_weight_col!r} must be a numeric scalar "
                         "column (one weight per row)")
    fraction = validation if isinstance(validation, float) and validation > 0 else 0.0
    by_column = validation if isinstance(validation, str) else None
    seed = 0 if random_seed is None else int(random_seed)
    n_train = num_proc * partitions_per_process
    n_val = num_proc * max(1, round(partitions_per_process * fraction)) if fraction else num_proc
    idx = _data_key(df, cols, validation, seed, n_train, n_val)
    train_path, val_path = store.get_train_data_path(idx), store.get_val_data_path(idx)
    has_val = bool(fraction or by_column)

    with _lock:
        cached = _written.get((store.prefix_path, idx))
        if cached is not None and cached[0]() is df and \
                store.exists(store.get_data_metadata_path(train_path)):
            info = cached[1]
            info.reused = True
            if verbose:
                log(f"KerasEstimator: reusing the data written for this DataFrame: {train_path}")
            return info

        selected = df.select(*[_checked(c, meta[c]) for c in cols]
                             + ([_col(by_column)] if by_column else []))
        if fraction:
            train_df, val_df = selected.randomSplit([1.0 - fraction, fraction], seed=seed)
        elif by_column:
            from pyspark.sql import functions as F

            flag = _col(by_column)
            if selected.schema[by_column].dataType.typeName() != "boolean":
                flag = flag > 0
            flag = F.coalesce(flag, F.lit(False))
            val_df = selected.where(flag).drop(by_column)
            train_df = selected.where(~flag).drop(by_column)
        else:
            train_df, val_df = selected, None
        if verbose:
            log(f"KerasEstimator: writing {cols} to {train_path} ({n_train} files)"
                + (f" and {val_path} ({n_val} files)" if has_val else ""))
        train_df = _encoded(train_df, meta)
        val_df = _encoded(val_df, meta) if has_val else None
        try:
            train_df.repartition(n_train).write.mode("overwrite").parquet(train_path)
            if has_val:
                val_df.repartition(n_val).write.mode("overwrite").parquet(val_path)
        except Exception as e:  # noqa: BLE001 - a failed check becomes a clear error
            why = _spark_error(e)
            if why is None:
                raise
            raise ValueError(why) from None
        info = describe_written(store, idx, train_path, val_path if has_val else None, meta,
                                num_proc, validation)
        _written[(store.prefix_path, idx)] = (_weak(df), info)
        if verbose:
            log(f"KerasEstimator: {info.train_rows} training rows in {len(info.train_files)} "
                f"files" + (f", {info.val_rows} validation rows in {len(info.val_files)} files"
                            if has_val else ""))
        return info


def _weak(df):
    try:
        return weakref.ref(df)
    except TypeError:
        return lambda: None


def describe_written(store, idx, train_path, val_path, meta, num_proc, validation=None):
    """Counts the rows written, checks there are enough files for the ranks,
    and writes the metadata files. Returns the DataInfo."""
    train_files = store.get_parquet_files(train_path)
    train_rows = _count(store, train_files)
    if train_rows == 0:
        raise ValueError("the training data is empty" + (
            f" (validation={validation!r} took every row)" if validation else ""))
    _enough_files(train_files, train_rows, num_proc, "training")
    val_files, val_rows = [], 0
    if val_path is not None:
        val_files = store.get_parquet_files(val_path)
        val_rows = _count(store, val_files)
        if val_rows == 0:
            raise ValueError(f"validation={validation!r} left no validation rows")
        _enough_files(val_files, val_rows, num_proc, "validation")
    for path, files, rows in ((train_path, train_files, train_rows),
                              (val_path, val_files, val_rows)):
        if path is None:
            continue
        store.write_text(store.get_data_metadata_path(path), json.dumps({
            "format": "tfring.spark.data/2", "rows": rows,
            "files": [posixpath.basename(f) for f in files], "columns": meta}, indent=1))
    return DataInfo(idx, train_path, val_path, train_rows, val_rows, train_files, val_files,
                    meta)


def _enough_files(files, rows, num_proc, what):
    if len(files) < num_proc:
        raise ValueError(f"the {what} data has {rows} rows in {len(files)} Parquet files, "
                         f"fewer files than the {num_proc} ranks: each rank reads whole files, "
                         "so some would get none (use fewer ranks, or more rows)")


def read_data_info(store, idx, cols, num_proc):
    """DataInfo of data already in the store (fit_on_parquet): from the
    metadata files when prepare wrote them, else from the Parquet schema
    and first row."""
    import pyarrow.parquet as pq

    train_path = store.get_train_data_path(idx)
    val_path = store.get_val_data_path(idx)
    if not store.is_parquet_dataset(train_path):
        raise ValueError(f"fit_on_parquet: no Parquet training data at {train_path} (write it "
                         "with fit(), or with df.write.parquet to that path)")
    has_val = store.is_parquet_dataset(val_path)
    meta_path = store.get_data_metadata_path(train_path)
    meta = None
    if store.exists(meta_path):
        written = json.loads(store.read(meta_path))
        meta = written.get("columns") or None
        if meta is not None and any(c not in meta for c in cols):
            meta = None  # written for other columns: read the Parquet schema
    if meta is None:
        first = store.get_parquet_files(train_path)[0]
        with store.filesystem.open_input_file(store.get_localized_path(first)) as fh:
            pf = pq.ParquetFile(fh)
            schema = pf.schema_arrow
            head = next(pf.iter_batches(batch_size=1, columns=[c for c in cols
                                                               if c in schema.names]), None)
            import pyarrow as pa

            table = pa.Table.from_batches([head]) if head is not None else None
            meta = md.arrow_metadata(schema, table, cols)
    return describe_written(store, idx, train_path, val_path if has_val else None,
                            {c: meta[c] for c in cols}, num_proc)
