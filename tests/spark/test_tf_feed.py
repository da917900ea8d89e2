"""tfring.spark.common.tf_feed: reader batches into tf.data through aligned,
pooled buffers, in this process (no Spark). The reference is the reader's
own numpy batches."""

import gc
import os

import numpy as np
import pytest

pa = pytest.importorskip("pyarrow")
tf = pytest.importorskip("tensorflow")
import pyarrow.fs as pafs  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from tfring.spark.common import reader as rd  # noqa: E402
from tfring.spark.common import tf_feed  # noqa: E402


def test_a_buffer_is_reused_only_once_nothing_refers_to_it():
    pool = tf_feed.AlignedPool(keep=2)
    a = pool.take((5, 7), np.float32)
    assert a.ctypes.data % 64 == 0 and a.shape == (5, 7) and a.dtype == np.float32
    b = pool.take((5, 7), np.float32)  # a is alive: another buffer
    assert not np.shares_memory(a, b)
    a[...] = 1.0
    view = a[2:]
    del a
    c = pool.take((5, 7), np.float32)  # a's buffer is still seen through view
    assert not np.shares_memory(c, view) and not np.shares_memory(c, b)
    del view, b
    gc.collect()
    d = pool.take((35,), np.float32)  # same bytes: one of the two kept buffers
    assert d.ctypes.data % 64 == 0
    assert len(pool._raw[35 * 4]) == 2  # at most `keep` kept


def _write(path, rows, features):
    x = np.arange(rows * features, dtype=np.float32).reshape(rows, features)
    values = pa.array(x.reshape(-1))
    offsets = pa.array(np.arange(rows + 1, dtype=np.int32) * features)
    table = pa.table({"x": pa.ListArray.from_arrays(offsets, values),
                      "y": np.arange(rows, dtype=np.float64)})
    pq.write_table(table, path, row_group_size=97)


@pytest.mark.parametrize("shuffle", [False, True])
def test_the_dataset_yields_the_readers_batches_while_earlier_ones_are_held(tmp_path, shuffle):
    # 64-row batches of 1 KiB rows: 16 batches an element, so 300 steps
    # take 19 elements through a pool that keeps 8 buffers a size. Every
    # tensor yielded is held to the end: a buffer reused while TensorFlow
    # still held it would change an earlier batch.
    path = str(tmp_path / "part-00000.parquet")
    _write(path, 20000, 256)
    cols = {"x": [256], "y": []}

    def reader():
        return rd.ShardReader(pafs.LocalFileSystem(), [path], cols, 64, shuffle=shuffle, seed=5,
                              buffer_rows=500)

    want = list(reader().batches(0, 300))

    def element(b):
        return b["x"], b["y"].astype(np.float32).reshape(-1, 1)

    sig = (tf.TensorSpec((64, 256), tf.float32), tf.TensorSpec((64, 1), tf.float32))
    ds = tf_feed.tf_dataset(reader(), 300, 0, element, sig)
    held = list(ds)
    assert len(held) == 300
    for (x, y), w in zip(held, want):
        np.testing.assert_array_equal(x.numpy(), w["x"])
        np.testing.assert_array_equal(y.numpy()[:, 0], w["y"].astype(np.float32))
