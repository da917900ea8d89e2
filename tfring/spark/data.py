"""Training on a Spark DataFrame without passing it through the driver.

The driver writes the DataFrame as Parquet files (the executors write them;
nothing is collected), and each rank reads only its own files:

    tfring.spark.write_parquet(df, "/shared/train", num_files=8)   # driver

    def fn():                                                        # each rank
        tk.init()
        ds, steps = tfring.spark.make_dataset(
            "/shared/train", ["x0", "x1"], "y", batch_size=32)
        model.fit(ds, steps_per_epoch=steps, epochs=3, callbacks=[...])

Files are dealt to ranks in turn (rank r reads files r, r+size, ...), so the
shards are disjoint and together hold every row. Every rank must run the
same number of steps (a rank that stops early leaves the others' allreduce
waiting for it), so ``make_dataset`` agrees on the smallest shard's count of
whole batches and each rank takes that many. The path must be readable by
every executor under the same name: a shared file system, or, with one
host, a local directory.
"""

import glob
import os

import numpy as np


def write_parquet(df, path, num_files=None, mode="overwrite"):
    """Writes ``df`` to ``path`` as ``num_files`` Parquet files of about the
    same number of rows (Spark's round-robin repartition; default: the
    SparkContext's defaultParallelism). Use a multiple of the number of
    ranks, so every rank gets the same number of files. Returns ``path``."""
    if num_files is None:
        num_files = df.sparkSession.sparkContext.defaultParallelism
    if not isinstance(num_files, int) or num_files < 1:
        raise ValueError(f"write_parquet: num_files must be a positive int, got {num_files!r}")
    df.repartition(num_files).write.mode(mode).parquet(path)
    return path


def _rank_size(rank, size):
    if rank is not None and size is not None:
        return rank, size
    from tfring import basics

    if basics.is_initialized():
        return (basics.rank() if rank is None else rank,
                basics.size() if size is None else size)
    from tfring import _tunables

    env_rank, env_size = _tunables.raw("TFRING_RANK"), _tunables.raw("TFRING_SIZE")
    if not env_rank or not env_size:
        raise ValueError("read_shard: pass rank and size, or call tfring.init() first")
    return (int(env_rank) if rank is None else rank, int(env_size) if size is None else size)


def _parquet_files(path):
    files = sorted(f for f in glob.glob(os.path.join(path, "*.parquet"))
                   if not os.path.basename(f).startswith(("_", ".")))
    if not files:
        raise FileNotFoundError(f"read_shard: no Parquet files in {path!r} "
                                "(write them with tfring.spark.write_parquet)")
    return files


def shard_files(path, rank=None, size=None):
    """The Parquet files under ``path`` that ``rank`` of ``size`` reads:
    files rank, rank+size, ... in name order. Fewer files than ranks is an
    error naming both counts (a rank would get no data)."""
    rank, size = _rank_size(rank, size)
    files = _parquet_files(path)
    if len(files) < size:
        raise ValueError(f"read_shard: {path!r} holds {len(files)} Parquet files for {size} "
                         f"ranks; write at least {size} (write_parquet(df, path, num_files=...))")
    return files[rank::size]


def read_shard(path, columns=None, rank=None, size=None):
    """This rank's rows as a pyarrow Table (its files of ``shard_files``)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    tables = [pq.read_table(f, columns=columns) for f in shard_files(path, rank, size)]
    return pa.concat_tables(tables) if len(tables) > 1 else tables[0]


def _column(table, name):
    from tfring.spark.common import tensor_codec

    col = table.column(name).combine_chunks()
    if tensor_codec.is_binary(col.type):
        # An array or vector column as KerasEstimator.fit writes it.
        meta = tensor_codec.parquet_field_metadata(table.schema, name)
        if meta is None:
            raise ValueError(f"make_dataset: column {name!r} holds byte strings, not numbers")
        return tensor_codec.decode(col, name, meta["dtype"], meta["shape"])
    try:
        return col.to_numpy(zero_copy_only=False)
    except (TypeError, ValueError):
        return np.asarray(col.to_pylist())


def make_dataset(path, feature_columns, label_column=None, batch_size=32, shuffle=False,
                 seed=0, rank=None, size=None, dtype="float32"):
    """(tf.data.Dataset, steps): this rank's shard in batches of
    ``batch_size``, features stacked into one ``(batch, len(feature_columns))``
    array of ``dtype`` (a single list/array column is taken as it is), with
    the labels when ``label_column`` is given. ``steps`` is the same on every
    rank: the smallest shard's number of whole batches, agreed with an
    allreduce (tfring must be initialized, with more than one rank); the
    dataset repeats, so pass ``steps_per_epoch=steps`` to ``model.fit``."""
    import tensorflow as tf

    if isinstance(feature_columns, str):
        feature_columns = [feature_columns]
    cols = list(feature_columns) + ([label_column] if label_column else [])
    table = read_shard(path, columns=cols, rank=rank, size=size)
    first = _column(table, feature_columns[0])
    if len(feature_columns) == 1 and (first.ndim > 1 or not np.issubdtype(first.dtype,
                                                                          np.number)):
        x = (first if first.ndim > 1 else np.stack(first)).astype(dtype)  # one array column
    else:
        x = np.stack([_column(table, c) for c in feature_columns], axis=1).astype(dtype)
    y = _column(table, label_column) if label_column else None
    steps = _agreed_steps(len(x) // batch_size)
    if steps == 0:
        raise ValueError(f"make_dataset: a rank's shard of {path!r} has fewer than "
                         f"batch_size={batch_size} rows")
    ds = tf.data.Dataset.from_tensor_slices((x, y) if y is not None else x)
    if shuffle:
        ds = ds.shuffle(len(x), seed=seed, reshuffle_each_iteration=True)
    return ds.batch(batch_size, drop_remainder=True).repeat(), steps


def _agreed_steps(mine):
    from tfring import _core, basics

    if not basics.is_initialized() or basics.size() == 1:
        return mine
    got = _core.allreduce(np.array([mine], np.int64), name="tfring.spark.steps", op="min")
    return int(np.asarray(got)[0])
