"""tfring.spark.common.tensor_codec: array columns stored as BINARY rows of
their values' bytes, and the reader on such files, in this process (no
Spark; pyarrow writes the files). The reference for a row's bytes is
numpy's own ``tobytes`` of the row in little-endian order."""

import json
import os

import numpy as np
import pytest

pa = pytest.importorskip("pyarrow")
import pyarrow.fs as pafs  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from tfring.spark.common import metadata as md  # noqa: E402
from tfring.spark.common import reader as rd  # noqa: E402
from tfring.spark.common import tensor_codec as tc  # noqa: E402

FS = pafs.LocalFileSystem()


def _lists(values):
    """A (nested) arrow list array of ``values`` (rows, *shape), as Spark
    writes an array column."""
    arr = pa.array(values.reshape(-1))
    for width in reversed(values.shape[1:]):
        n = len(arr) // width
        arr = pa.ListArray.from_arrays(pa.array(np.arange(n + 1, dtype=np.int32) * width), arr)
    return arr


def _meta(dtype, shape):
    return {"spark_type": md.ARRAY, "dtype": dtype, "shape": list(shape), "sql_type": "{}"}


@pytest.mark.parametrize("dtype,shape", [("float32", (3,)), ("float64", (2, 3)),
                                         ("int64", (4,)), ("int8", (5,)), ("bool", (2, 2))])
def test_rows_are_their_values_bytes_and_decode_back(dtype, shape):
    rng = np.random.default_rng(len(shape) + len(dtype))
    values = (rng.standard_normal((40, *shape)) * 50).astype(dtype)
    ids = np.arange(40)
    batch = pa.record_batch({"id": ids, "x": _lists(values)}).slice(5, 23)  # not at offset 0
    (out,) = tc.encode_batch(batch, {"x": _meta(dtype, shape)})
    assert out.schema.field("x").type == pa.binary() and out.column("id").to_pylist() == \
        ids[5:28].tolist()
    want = [row.astype(np.dtype(dtype).newbyteorder("<")).tobytes() for row in values[5:28]]
    assert out.column("x").to_pylist() == want
    back = tc.decode(out.column("x").slice(3, 11), "x", dtype, shape)
    assert back.dtype == np.dtype(dtype) and back.shape == (11, *shape)
    np.testing.assert_array_equal(back, values[8:19])


def test_a_batch_past_int32_offsets_is_split():
    values = np.arange(60, dtype=np.float32).reshape(20, 3)
    batch = pa.record_batch({"x": _lists(values)})
    old = tc._MAX_BYTES
    tc._MAX_BYTES = 7 * 12  # 7 rows of 12 bytes
    try:
        parts = list(tc.encode_batch(batch, {"x": _meta("float32", (3,))}))
    finally:
        tc._MAX_BYTES = old
    assert [p.num_rows for p in parts] == [7, 7, 6]
    got = np.concatenate([tc.decode(p.column("x"), "x", "float32", (3,)) for p in parts])
    np.testing.assert_array_equal(got, values)


def test_rows_of_another_length_or_null_are_refused_naming_the_column():
    short = pa.array([b"\0" * 12, b"\0" * 8], pa.binary())
    with pytest.raises(ValueError, match=r"column 'feat'.*12 bytes \(float32 of shape \(3,\)\)"):
        tc.decode(short, "feat", "float32", (3,))
    with pytest.raises(ValueError, match="column 'feat' holds 1 null"):
        tc.decode(pa.array([b"\0" * 12, None], pa.binary()), "feat", "float32", (3,))
    with pytest.raises(ValueError, match="column 'feat' holds byte strings.*no metadata"):
        rd.column_to_numpy(pa.array([b"\0" * 12], pa.binary()), "feat", [3], None)
    schema = pa.schema([pa.field("blob", pa.binary())])
    with pytest.raises(ValueError, match="column 'blob' holds byte strings, not numbers"):
        md.arrow_metadata(schema, None, ["blob"])


def _write(dirpath, sizes, encode):
    """Files of consecutive ids; x = (id, 2 id, 3 id) as list<double>, or
    as BINARY tensors carrying their metadata as Spark leaves it (the
    Spark row metadata in the footer)."""
    files, i = [], 0
    meta = _meta("float64", (3,))
    for k, n in enumerate(sizes):
        ids = np.arange(i, i + n, dtype=np.int64)
        x = np.stack([ids, 2 * ids, 3 * ids], 1).astype(np.float64)
        batch = pa.record_batch({"id": ids, "x": _lists(x), "y": ids.astype(np.float32)})
        if encode:
            (batch,) = tc.encode_batch(batch, {"x": meta})
            spark = {"type": "struct", "fields": [
                {"name": "x", "type": "binary", "nullable": False,
                 "metadata": tc.spark_field_metadata(meta)}]}
            batch = batch.replace_schema_metadata(
                {b"org.apache.spark.sql.parquet.row.metadata": json.dumps(spark).encode()})
        path = os.path.join(dirpath, f"part-{k:05d}.parquet")
        pq.write_table(pa.Table.from_batches([batch]), path, row_group_size=4)
        files.append(path)
        i += n
    return files


@pytest.mark.parametrize("shuffle", [False, True])
def test_the_reader_gives_the_same_batches_from_tensors_as_from_lists(tmp_path, shuffle):
    os.makedirs(tmp_path / "l")
    os.makedirs(tmp_path / "t")
    lists = _write(str(tmp_path / "l"), [9, 7, 8], encode=False)
    tensors = _write(str(tmp_path / "t"), [9, 7, 8], encode=True)
    cols = {"id": [], "x": [3], "y": []}

    def batches(files, dtypes):
        r = rd.ShardReader(FS, files, cols, 4, shuffle=shuffle, buffer_rows=6, seed=3,
                           dtypes=dtypes)
        return [b for e in range(2) for b in r.batches(e, 5)]

    want = batches(lists, None)
    got = batches(tensors, {"x": "float64"})
    assert len(got) == len(want) == 10
    for g, w in zip(got, want):
        assert set(g) == set(w)
        for c in w:
            assert g[c].dtype == w[c].dtype
            np.testing.assert_array_equal(g[c], w[c])
        np.testing.assert_array_equal(g["x"], g["id"][:, None] * np.array([1.0, 2.0, 3.0]))

    # transformation_fn sees per-row arrays either way.
    def fn(pdf):
        assert isinstance(pdf["x"].iloc[0], np.ndarray) and pdf["x"].iloc[0].shape == (3,)
        pdf["x"] = pdf["x"].map(lambda v: v * 10)
        return pdf

    r = rd.ShardReader(FS, tensors, cols, 4, transformation_fn=fn, dtypes={"x": "float64"})
    first = next(r.batches(0, 1))
    np.testing.assert_array_equal(first["x"], first["id"][:, None] * np.array([10.0, 20, 30]))

    # fit_on_parquet without a metadata file reads the column's metadata
    # back from the footer.
    schema = pq.ParquetFile(tensors[0]).schema_arrow
    assert md.arrow_metadata(schema, None, ["x"])["x"] == _meta("float64", (3,))


def test_make_dataset_reads_tensor_columns_as_list_columns(tmp_path):
    import tfring.spark

    os.makedirs(tmp_path / "l")
    os.makedirs(tmp_path / "t")
    _write(str(tmp_path / "l"), [9, 7], encode=False)
    _write(str(tmp_path / "t"), [9, 7], encode=True)
    got = {}
    for kind in ("l", "t"):
        ds, steps = tfring.spark.make_dataset(str(tmp_path / kind), ["x"], "y", batch_size=4,
                                              rank=0, size=1)
        got[kind] = [(x.numpy(), y.numpy()) for x, y in ds.take(steps)]
    assert len(got["t"]) == len(got["l"]) == 4
    ids = np.arange(16, dtype=np.float64)
    for (xt, yt), (xl, yl), k in zip(got["t"], got["l"], range(4)):
        np.testing.assert_array_equal(xt, xl)
        np.testing.assert_array_equal(yt, yl)
        want = ids[4 * k:4 * k + 4, None] * np.array([1.0, 2.0, 3.0])
        np.testing.assert_array_equal(xt, want.astype(np.float32))
