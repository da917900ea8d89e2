"""tfring.spark.common.store: Store.create's choice, Horovod's path getters,
file operations that never leave a half-written file under its name, and
what travels to the Spark tasks. In this process, no Spark."""

import os
import pickle

import pytest

pytest.importorskip("pyarrow")
pytest.importorskip("pyspark")

from tfring.spark.common.fs_store import FilesystemStore, LocalStore  # noqa: E402
from tfring.spark.common.hdfs_store import HDFSStore  # noqa: E402
from tfring.spark.common.store import Store  # noqa: E402


def test_create_picks_the_store_by_path(tmp_path):
    assert type(Store.create(str(tmp_path))) is LocalStore
    assert type(Store.create(f"file://{tmp_path}")) is LocalStore
    assert type(Store.create("hdfs://nn:8020/user/me")) is HDFSStore
    s3 = Store.create("s3a://bucket/prefix")  # opens nothing until used
    assert type(s3) is FilesystemStore
    assert s3.get_train_data_path() == "s3a://bucket/prefix/intermediate_train_data"
    local = s3.get_localized_path(s3.get_train_data_path())
    assert local == "bucket/prefix/intermediate_train_data"
    # The class names import from store.py, as from Horovod's module.
    from tfring.spark.common.store import HDFSStore as H
    from tfring.spark.common.store import LocalStore as L

    assert (H, L) == (HDFSStore, LocalStore)


def test_unknown_schemes_and_missing_packages_are_named():
    with pytest.raises(ValueError, match="neither pyarrow.fs nor fsspec opens the scheme 'nope'"):
        Store.create("nope://x/y")
    pytest.importorskip("fsspec")
    try:
        import ocifs  # noqa: F401
    except ImportError:
        with pytest.raises(ValueError, match=r"oci://b/p.*pip install ocifs"):
            Store.create("oci://b/p")


def test_horovods_paths(tmp_path):
    store = Store.create(str(tmp_path))
    root = f"file://{tmp_path}"
    assert store.prefix_path == root
    assert store.get_train_data_path() == f"{root}/intermediate_train_data"
    assert store.get_val_data_path(3) == f"{root}/intermediate_val_data.3"
    assert store.get_test_data_path("a") == f"{root}/intermediate_test_data.a"
    assert store.get_run_path("r1") == f"{root}/runs/r1" == store.get_checkpoint_path("r1")
    assert store.get_logs_path("r1") == f"{root}/runs/r1/logs"
    assert store.get_checkpoint_filename() == "checkpoint.keras"
    assert store.get_data_metadata_path(store.get_train_data_path(2)) == \
        f"{root}/intermediate_train_data.2.metadata.json"
    assert store.get_localized_path(store.get_run_path("r1")) == str(tmp_path / "runs" / "r1")
    quiet = Store.create(str(tmp_path), save_runs=False, train_path=str(tmp_path / "t"))
    assert quiet.get_checkpoint_path("r") is None and quiet.get_logs_path("r") is None
    assert quiet.get_train_data_path() == f"file://{tmp_path}/t" and not quiet.saving_runs()


def test_hdfs_urls():
    s = HDFSStore("hdfs://namenode01:8020/user/test/tfring")
    assert s.prefix_path == "hdfs://namenode01:8020/user/test/tfring"
    assert s.get_localized_path(s.get_run_path("x")) == "/user/test/tfring/runs/x"
    assert s._hdfs_kwargs["host"] == "namenode01" and s._hdfs_kwargs["port"] == 8020
    s = HDFSStore("hdfs:///user/test/tfring")
    assert s.get_train_data_path() == "hdfs:///user/test/tfring/intermediate_train_data"
    assert s._hdfs_kwargs["host"] == "default" and s._hdfs_kwargs["port"] == 0
    s = HDFSStore("/user/test/tfring", user="me")
    assert s.prefix_path == "hdfs:///user/test/tfring" and s._hdfs_kwargs["user"] == "me"
    with pytest.raises(ValueError, match="not an hdfs:// URL"):
        HDFSStore("s3://bucket/x")


def test_file_operations_are_atomic_and_list_only_whole_files(tmp_path):
    store = Store.create(str(tmp_path))
    run = store.get_run_path("r")
    store.write_text(f"{run}/a/notes.txt", "hi")
    assert store.read(f"{run}/a/notes.txt") == b"hi" and store.exists(f"{run}/a")
    store.write_bytes(f"{run}/checkpoint.keras", b"v1")
    store.write_bytes(f"{run}/checkpoint.keras", b"v2")  # replaces it
    local = tmp_path / "local.bin"
    local.write_bytes(b"x" * 10_000)
    store.upload(str(local), f"{run}/logs/events")
    assert store.read(f"{run}/checkpoint.keras") == b"v2"
    assert store.list_files(run) == [f"{run}/checkpoint.keras"]
    assert store.list_files(run, recursive=True) == [f"{run}/a/notes.txt",
                                                     f"{run}/checkpoint.keras",
                                                     f"{run}/logs/events"]
    # A writer that died mid-file leaves only a hidden temporary name, which
    # neither get_checkpoints nor get_parquet_files reports, and which
    # remove_temporary_files clears.
    (tmp_path / "runs" / "r" / ".checkpoint.keras.tmp-0123").write_bytes(b"PK half")

    class NotBytes:
        pass

    with pytest.raises(TypeError):  # the write fails after the file was opened
        store.write_bytes(f"{run}/other.keras", NotBytes())
    assert not store.exists(f"{run}/other.keras")
    assert store.get_checkpoints("r") == [f"{run}/checkpoint.keras"]
    assert store.remove_temporary_files(run) == 1
    assert sorted(os.listdir(tmp_path / "runs" / "r")) == ["a", "checkpoint.keras", "logs"]
    store.delete(f"{run}/a")
    assert not store.exists(f"{run}/a")
    store.delete(f"{run}/missing")  # nothing to do


def test_parquet_datasets(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    store = Store.create(str(tmp_path))
    path = store.get_train_data_path()
    assert not store.is_parquet_dataset(path)
    os.makedirs(tmp_path / "intermediate_train_data")
    for name in ("part-00001.parquet", "part-00000.parquet"):
        pq.write_table(pa.table({"a": [1, 2]}), tmp_path / "intermediate_train_data" / name)
    for name in ("_SUCCESS", ".part-00000.parquet.crc"):
        (tmp_path / "intermediate_train_data" / name).write_bytes(b"")
    assert store.is_parquet_dataset(path)
    assert store.get_parquet_files(path) == [f"{path}/part-00000.parquet",
                                             f"{path}/part-00001.parquet"]
    assert store.get_parquet_dataset(path).read().num_rows == 4


def test_sync_copies_what_changed(tmp_path):
    store = Store.create(str(tmp_path / "store"))
    local = tmp_path / "out"
    (local / "logs").mkdir(parents=True)
    (local / "logs" / "a").write_text("1")
    sync = store.sync_fn("r")
    sync(str(local))
    assert store.read(store.get_run_path("r") + "/logs/a") == b"1"
    os.remove(tmp_path / "store" / "runs" / "r" / "logs" / "a")
    sync(str(local))  # unchanged: not copied again
    assert not store.exists(store.get_run_path("r") + "/logs/a")
    (local / "logs" / "a").write_text("22")
    sync(str(local))
    assert store.read(store.get_run_path("r") + "/logs/a") == b"22"


def test_the_store_travels_without_its_filesystem(tmp_path):
    store = Store.create(str(tmp_path))
    store.write_text(store.get_run_path("r") + "/x", "1")
    assert store._filesystem is not None
    copy = pickle.loads(pickle.dumps(store))
    assert copy._filesystem is None and copy.read(store.get_run_path("r") + "/x") == b"1"
    pytest.importorskip("fsspec")
    mem = Store.create("memory://tfring-test/prefix")
    assert type(mem) is FilesystemStore
    mem.write_text(mem.get_run_path("q") + "/y", "2")
    assert mem.list_files(mem.get_run_path("q")) == [mem.get_run_path("q") + "/y"]
    assert pickle.loads(pickle.dumps(mem)).read(mem.get_run_path("q") + "/y") == b"2"
