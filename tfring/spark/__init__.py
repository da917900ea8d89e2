"""tfring in Spark: a tfring job whose ranks are the tasks of one Spark
barrier stage, with Horovod's horovod.spark API. The estimator, which
trains a Keras model on a DataFrame, is ``tfring.spark.keras``
(KerasEstimator, KerasModel); this module is the function-level API.

    import tfring.spark

    def train(lr):
        import tfring.keras as tk
        tk.init()
        ...  # the same training code as under tfring-run
        return model.get_weights()

    weights = tfring.spark.run(train, args=(0.01,), num_proc=4)  # rank order

Data from a DataFrame reaches the ranks without passing the driver:
``write_parquet(df, path)`` on the driver, ``read_shard`` / ``make_dataset``
in ``fn`` (tfring/spark/data.py). ``run_elastic`` is not supported in Spark
and says what to use instead. See docs/spark.md.
"""

from tfring.spark.data import make_dataset, read_shard, shard_files, write_parquet
from tfring.spark.runner import SparkJobError, run, run_elastic

__all__ = ["SparkJobError", "make_dataset", "read_shard", "run", "run_elastic",
           "shard_files", "write_parquet"]
