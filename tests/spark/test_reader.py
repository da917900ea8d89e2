"""tfring.spark.common.reader: each rank's Parquet shard into batches, in
this process (no Spark): the files are written with pyarrow here.

Ranks are simulated by building one reader per rank; the agreed steps are
the smallest shard's whole batches, which reader.agreed_steps computes with
an allreduce in a real job."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

pa = pytest.importorskip("pyarrow")
import pyarrow.fs as pafs  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from tfring.spark.common import reader as rd  # noqa: E402
from tfring.spark.common import tf_feed  # noqa: E402

FS = pafs.LocalFileSystem()


def _write(dirpath, sizes, row_group_size=None, start=0):
    """Parquet files part-00000... of ``sizes`` rows: id, x (3 floats: id,
    2*id, 3*id), y = id as float, ids consecutive across files."""
    files, i = [], start
    for k, n in enumerate(sizes):
        ids = np.arange(i, i + n, dtype=np.int64)
        x = pa.FixedSizeListArray.from_arrays(
            pa.array(np.stack([ids, 2 * ids, 3 * ids], 1).reshape(-1).astype(np.float64)), 3)
        table = pa.table({"id": ids, "x": pa.ListArray.from_arrays(
            pa.array(np.arange(0, 3 * n + 1, 3, dtype=np.int32)), x.flatten()),
            "y": ids.astype(np.float32)})
        path = os.path.join(dirpath, f"part-{k:05d}.parquet")
        pq.write_table(table, path, row_group_size=row_group_size or max(n, 1))
        files.append(path)
        i += n
    return files


COLS = {"id": [], "x": [3], "y": []}


def _readers(files, size, batch_size, **kw):
    return [rd.ShardReader(FS, rd.shard_files(files, r, size), COLS, batch_size, rank=r, **kw)
            for r in range(size)]


def _ids(batches):
    return [b["id"].tolist() for b in batches]


def test_shards_are_disjoint_and_cover_every_row(tmp_path):
    files = _write(str(tmp_path), [7, 5, 9, 4, 6, 8, 3])
    for size in (1, 2, 3, 7):
        shards = [rd.shard_files(files, r, size) for r in range(size)]
        assert sorted(f for s in shards for f in s) == sorted(files)
        assert all(set(a).isdisjoint(b) for i, a in enumerate(shards) for b in shards[i + 1:])
        readers = _readers(files, size, 2)
        assert sum(r.num_rows() for r in readers) == 42
    with pytest.raises(ValueError, match="7 Parquet files for 8 ranks"):
        rd.shard_files(files, 0, 8)


def test_every_rank_runs_the_agreed_steps_and_each_epoch_is_a_fresh_pass(tmp_path):
    files = _write(str(tmp_path), [10, 3, 10, 9], row_group_size=4)
    readers = _readers(files, 2, 4)
    # rank 0: files 0 and 2 (20 rows, 5 batches); rank 1: files 1 and 3 (12 rows, 3).
    assert [r.steps_per_pass() for r in readers] == [5, 3]
    steps = min(r.steps_per_pass() for r in readers)
    for r in readers:
        epochs = [_ids(r.batches(e, steps)) for e in range(3)]
        assert all(len(e) == steps and all(len(b) == 4 for b in e) for e in epochs)
        # No shuffling: every epoch starts again at the first row of the shard.
        assert epochs[0] == epochs[1] == epochs[2]
    first = _ids(readers[0].batches(0, steps))
    # Files 0 then 2, a batch across the end of file 0:
    assert first == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 13, 14]]
    # Rank 0's remainder (rows 15..22 of file 2) is not seen in the epoch.
    assert _ids(readers[1].batches(0, 3)) == [[10, 11, 12, 23], [24, 25, 26, 27],
                                              [28, 29, 30, 31]]


def test_more_steps_than_a_pass_continue_with_a_fresh_pass(tmp_path):
    files = _write(str(tmp_path), [6])
    (r,) = _readers(files, 1, 4)
    assert _ids(r.batches(0, 3)) == [[0, 1, 2, 3], [0, 1, 2, 3], [0, 1, 2, 3]]
    with pytest.raises(ValueError, match="no whole batch of 8 rows"):
        list(rd.ShardReader(FS, files, COLS, 8).batches(0, 1))


def test_columns_become_numpy_arrays_of_their_per_row_shape(tmp_path):
    files = _write(str(tmp_path), [5])
    (r,) = _readers(files, 1, 5)
    (b,) = list(r.batches(0, 1))
    assert b["x"].shape == (5, 3) and b["x"].dtype == np.float64
    np.testing.assert_array_equal(b["x"][:, 1], 2 * np.arange(5))
    assert b["y"].dtype == np.float32 and b["id"].shape == (5,)
    nested = pa.array([[[1, 2], [3, 4], [5, 6]], [[7, 8], [9, 10], [11, 12]]])
    out = rd.arrow_to_numpy(nested, "n")
    assert out.shape == (2, 3, 2) and out[1, 2, 1] == 12
    sliced = pa.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]).slice(1, 2)
    np.testing.assert_array_equal(rd.arrow_to_numpy(sliced, "s"), [[3, 4], [5, 6]])
    with pytest.raises(ValueError, match="column 'r'.*between 1 and 2 values"):
        rd.arrow_to_numpy(pa.array([[1.0], [2.0, 3.0]]), "r")
    with pytest.raises(ValueError, match="column 'z' holds 1 null"):
        rd.arrow_to_numpy(pa.array([1.0, None]), "z")
    with pytest.raises(ValueError, match="column 'x': rows of shape"):
        rd.arrow_to_numpy(pa.array([[1.0, 2.0]]), "x", [3])


def test_buffer_shuffle_is_seeded_per_epoch_and_keeps_every_row_once(tmp_path):
    files = _write(str(tmp_path), [40, 40, 40, 40], row_group_size=10)

    def order(seed, epoch, **kw):
        (r,) = _readers(files, 1, 8, shuffle=True, seed=seed, read_rows=10, **kw)
        return [i for b in r.batches(epoch, 20) for i in b["id"]]

    a = order(1, 0, buffer_rows=16)
    assert a == order(1, 0, buffer_rows=16)  # same seed, same epoch: same order
    assert a != order(2, 0, buffer_rows=16)
    assert a != order(1, 1, buffer_rows=16)  # a new order every epoch
    assert sorted(a) == list(range(160)) and a != list(range(160))
    cached = order(1, 0, inmemory_cache_all=True)
    assert sorted(cached) == list(range(160)) and cached == order(1, 0,
                                                                  inmemory_cache_all=True)
    (off,) = _readers(files, 1, 8, shuffle=True, buffer_rows=0)
    assert [i for b in off.batches(3, 20) for i in b["id"]] == list(range(160))
    # One file of one row group is read in id order, 10 rows at a time: with
    # a buffer of 16 rows no row comes out more than 16 + 10 places early,
    # and rows are mixed from far apart.
    os.makedirs(tmp_path / "one")
    one = _write(str(tmp_path / "one"), [160])
    r = rd.ShardReader(FS, one, COLS, 8, shuffle=True, buffer_rows=16, seed=3, read_rows=10)
    got = [i for b in r.batches(0, 20) for i in b["id"]]
    assert sorted(got) == list(range(160))
    assert all(pos >= i - 26 for pos, i in enumerate(got))
    assert max(abs(pos - i) for pos, i in enumerate(got)) > 16


def test_inmemory_cache_and_transformation_fn(tmp_path):
    files = _write(str(tmp_path), [9, 7])
    seen = []

    def double_y(pdf):
        seen.append(len(pdf))
        pdf["y"] = pdf["y"] * 2
        return pdf

    (streamed,) = _readers(files, 1, 4, transformation_fn=double_y, read_rows=5)
    (cached,) = _readers(files, 1, 4, transformation_fn=double_y, inmemory_cache_all=True)
    s = list(streamed.batches(0, 4))
    assert seen == [5, 4, 5, 2]  # applied to every record batch read
    c0, c1 = list(cached.batches(0, 4)), list(cached.batches(1, 4))
    assert _ids(s) == _ids(c0) == _ids(c1)
    np.testing.assert_array_equal(np.concatenate([b["y"] for b in c1]), 2 * np.arange(16))
    assert s[0]["x"].shape == (4, 3)

    def drop(pdf):
        return pdf.drop(columns=["y"])

    (bad,) = _readers(files, 1, 4, transformation_fn=drop)
    with pytest.raises(ValueError, match=r"lacks column\(s\) \['y'\]"):
        list(bad.batches(0, 1))


def test_keras_fit_iterates_the_dataset_afresh_each_epoch(tmp_path):
    keras = pytest.importorskip("keras")
    files = _write(str(tmp_path), [20])
    (r,) = _readers(files, 1, 4)
    epochs_read = []
    real = r.batches

    def batches(epoch, steps):
        epochs_read.append(epoch)
        return real(epoch, steps)

    r.batches = batches
    import tensorflow as tf

    def element(b):
        return b["x"].astype(np.float32), b["y"].reshape(-1, 1)

    sig = (tf.TensorSpec((4, 3), tf.float32), tf.TensorSpec((4, 1), tf.float32))
    ds = tf_feed.tf_dataset(r, 3, 2, element, sig, end_epoch=5)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    model.fit(ds, steps_per_epoch=3, epochs=5, initial_epoch=2, verbose=0, shuffle=False)
    # One fresh pass per epoch, numbered from initial_epoch; nothing past the end.
    assert epochs_read == [2, 3, 4]


@pytest.mark.slow
def test_a_large_data_set_streams_in_bounded_memory(tmp_path):
    """TFRING_TEST_STREAM_GB (default 2) of Parquet read through one
    ShardReader, shuffling, in a fresh process: its peak RSS grows by far
    less than the data."""
    gb = float(os.environ.get("TFRING_TEST_STREAM_GB", "2"))
    rows_per_file = 100_000
    row_floats = 256  # 1 KiB a row
    n_files = max(2, int(gb * (1 << 30) / (rows_per_file * row_floats * 4)))
    rng = np.random.default_rng(0)
    block = rng.standard_normal((rows_per_file, row_floats)).astype(np.float32)
    for k in range(n_files):
        x = pa.FixedSizeListArray.from_arrays(pa.array(block.reshape(-1)), row_floats)
        pq.write_table(pa.table({"x": x, "y": np.full(rows_per_file, k, np.float32)}),
                       str(tmp_path / f"part-{k:05d}.parquet"), row_group_size=20_000,
                       compression="none")
    del block
    script = textwrap.dedent(f"""
        import glob, resource, sys
        import pyarrow.fs as pafs
        from tfring.spark.common import reader as rd
        files = sorted(glob.glob({str(tmp_path)!r} + "/*.parquet"))
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        r = rd.ShardReader(pafs.LocalFileSystem(), files, {{"x": [{row_floats}], "y": []}},
                           256, shuffle=True, buffer_rows=20_000, seed=1)
        n = 0
        for b in r.batches(0, r.steps_per_pass()):
            n += len(b["y"])
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        print(n, (peak - base) // 1024)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=1800)
    assert out.returncode == 0, out.stderr
    rows, grew_mib = map(int, out.stdout.split())
    data_mib = n_files * rows_per_file * row_floats * 4 >> 20
    assert rows == (n_files * rows_per_file // 256) * 256
    assert grew_mib < min(600, data_mib / 3), (grew_mib, data_mib)
