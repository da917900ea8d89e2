"""What the Spark estimators share (Horovod's horovod.spark.common): the
Store that holds their data and runs (store.py, fs_store.py,
hdfs_store.py), the Backend that runs training (backend.py), their params
(params.py), and the data path: prepare.py writes a DataFrame's columns to
Parquet in the store, reader.py streams each rank's files into batches,
metadata.py describes the columns. docs/spark-estimator.md has the whole
picture."""

from tfring.spark.common.backend import Backend, SparkBackend
from tfring.spark.common.fs_store import FilesystemStore, LocalStore
from tfring.spark.common.hdfs_store import HDFSStore
from tfring.spark.common.store import Store

__all__ = ["Backend", "FilesystemStore", "HDFSStore", "LocalStore", "SparkBackend", "Store"]
