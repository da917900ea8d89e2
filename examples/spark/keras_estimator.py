"""A DataFrame -> KerasEstimator.fit -> transform -> save/load flow on a
local Spark, with synthetic data (docs/spark-estimator.md).

    python examples/spark/keras_estimator.py [--num-proc 2] [--epochs 5]
                                             [--work-dir /tmp/tfring-estimator]

Needs pyspark, pyarrow and Java 17+ (pip install tfring[spark]). On a
cluster, point --master at it and --work-dir at a path every executor sees
(a shared mount, hdfs://..., s3://...).
"""

import argparse
import os
import sys
import tempfile

import keras
from pyspark.ml.feature import VectorAssembler
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from tfring.spark.common.store import Store
from tfring.spark.keras import KerasEstimator, KerasModel


def make_data(spark, rows):
    """price = 3*size - 2*age + 0.5*rooms + noise, with a categorical
    `kind`, as a features vector (VectorAssembler) plus an array column."""
    i = F.col("id")
    df = spark.range(rows).select(
        i, (F.rand(1) * 2 - 1).alias("size"), (F.rand(2) * 2 - 1).alias("age"),
        (F.rand(3) * 2 - 1).alias("rooms"), (i % 3).alias("kind"))
    df = df.withColumn("price", 3 * F.col("size") - 2 * F.col("age") + 0.5 * F.col("rooms")
                       + 0.3 * F.col("kind") + 0.05 * F.randn(4))
    df = VectorAssembler(inputCols=["size", "age", "rooms"], outputCol="features").transform(df)
    return df.select("id", "features", F.array(F.col("kind").cast("double")).alias("kind_arr"),
                     "price")


def make_model():
    """Two inputs (the features vector and the kind), one output."""
    features = keras.Input((3,), name="features")
    kind = keras.Input((1,), name="kind")
    h = keras.layers.Concatenate()([features, kind])
    h = keras.layers.Dense(16, activation="relu")(h)
    return keras.Model([features, kind], keras.layers.Dense(1, name="price")(h))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--master", default=None, help="Spark master (default: local[N])")
    parser.add_argument("--num-proc", type=int, default=2, help="training ranks")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--rows", type=int, default=4000)
    parser.add_argument("--work-dir", default=None,
                        help="the store's path (default: a temporary folder)")
    args = parser.parse_args()

    # The executors run this interpreter, which has tfring.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (SparkSession.builder.master(args.master or f"local[{args.num_proc}]")
             .appName("tfring-keras-estimator").config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .getOrCreate())
    work_dir = args.work_dir or tempfile.mkdtemp(prefix="tfring-estimator-")
    store = Store.create(work_dir)

    df = make_data(spark, args.rows)
    train_df, test_df = df.randomSplit([0.9, 0.1], seed=0)

    estimator = KerasEstimator(
        num_proc=args.num_proc, store=store, model=make_model(),
        optimizer=keras.optimizers.Adam(0.01),  # unscaled: x num_proc on the ranks
        loss="mse", metrics=["mae"],
        feature_cols=["features", "kind_arr"], label_cols=["price"],
        validation=0.1, batch_size=32, epochs=args.epochs, random_seed=1,
        run_id="example", verbose=2)
    keras_model = estimator.fit(train_df)
    history = keras_model.getHistory()
    print("val_loss per epoch:", [round(v, 4) for v in history["val_loss"]])

    pred = keras_model.transform(test_df)
    pred.select("id", "price", "price__output").show(5)
    mae = pred.select(F.avg(F.abs(F.col("price") - F.col("price__output")))).first()[0]
    print(f"test MAE: {mae:.4f}")

    path = os.path.join(work_dir, "model")
    keras_model.write().overwrite().save(path)
    loaded = KerasModel.load(path)
    again = loaded.transform(test_df).select(F.avg(F.abs(F.col("price")
                                                         - F.col("price__output")))).first()[0]
    print(f"saved to {path}; the loaded model's test MAE: {again:.4f}")
    print(f"checkpoint of the run: {store.get_checkpoints('example')}")
    spark.stop()


if __name__ == "__main__":
    main()
