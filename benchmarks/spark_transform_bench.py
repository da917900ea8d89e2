"""KerasModel.transform throughput against per-row prediction, same model,
same DataFrame, same Spark, same run.

    python benchmarks/spark_transform_bench.py                 # 100k rows
    python benchmarks/spark_transform_bench.py --rows 20000 --baseline-rows 1000
    python benchmarks/spark_transform_bench.py --extra-columns 8   # a wider DataFrame
    python benchmarks/spark_transform_bench.py --json out.json

The DataFrame: `--rows` rows of an id, a `--features`-long Spark ML
vector and `--extra-columns` doubles (generated in the JVM, cached and
counted before any timing), in `--partitions` partitions. The model: an MLP (`--hidden` units, two
layers, one scalar output) whose label is a double. Every method is run
once on a small slice first (each Python worker imports TensorFlow and
loads the model then), then timed writing all its rows to Spark's `noop`
sink, which evaluates every row and keeps none, in `--rounds` interleaved
rounds (best and median reported):

  transform        KerasModel.transform: an Arrow UDF over the feature
                   column, one predict_on_batch call per Arrow batch
  mapInArrow       the same calls in DataFrame.mapInArrow, which also
                   carries every other column through Python
  predict_batch    pyspark.ml.functions.predict_batch_udf (pandas batches),
                   the same calls
  per-row          a Python UDF calling model.predict_on_batch on one row
                   at a time, as Horovod's KerasModel predicts; timed on
                   the first `--baseline-rows` rows only (its rows/s is
                   the same at any count: one call per row), reported as
                   rows/s, never as a 100k-row time

All methods load the model through the same per-worker cache and run
TensorFlow on one thread per task. Prints rows/s for each and the speed-up
of transform over the per-row baseline.
"""

import argparse
import json
import os
import platform
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))


def _args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=int, default=100_000)
    p.add_argument("--baseline-rows", type=int, default=4_000,
                   help="rows the per-row baseline predicts (its rows/s is per row)")
    p.add_argument("--features", type=int, default=32)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--partitions", type=int, default=4)
    p.add_argument("--extra-columns", type=int, default=0,
                   help="double columns besides id and the features, carried along")
    p.add_argument("--master", default="local[2]")
    p.add_argument("--methods", default="transform,mapInArrow,predict_batch,per-row")
    p.add_argument("--rounds", type=int, default=3, help="rounds of timed runs, each round "
                   "running every method once (best and median reported)")
    p.add_argument("--json", help="write the results here too")
    return p.parse_args()


def _spark(master):
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master(master).appName("tfring-transform-bench")
             .config("spark.ui.enabled", "false")
             .config("spark.driver.memory", "2g")
             .config("spark.ui.showConsoleProgress", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _frame(spark, rows, features, partitions, extra):
    from pyspark.ml.functions import array_to_vector
    from pyspark.sql import functions as F

    df = spark.range(0, rows, 1, partitions).select(
        "id", array_to_vector(F.array(*[F.rand(seed=i) for i in range(features)]))
        .alias("features"), *[F.randn(seed=1000 + i).alias(f"x{i}") for i in range(extra)])
    df = df.cache()
    df.count()
    return df


def _model(features, hidden):
    import keras

    keras.utils.set_random_seed(0)
    inp = keras.Input((features,))
    h = keras.layers.Dense(hidden, activation="relu")(inp)
    h = keras.layers.Dense(hidden, activation="relu")(h)
    return keras.Model(inp, keras.layers.Dense(1)(h))


def _keras_model(model, df):
    from tfring.spark.keras.model import KerasModel

    meta = {"features": {"spark_type": "vector", "dtype": "float64",
                         "shape": [model.inputs[0].shape[1]],
                         "sql_type": df.schema["features"].dataType.json()},
            "label": {"spark_type": "scalar", "dtype": "float64", "shape": [],
                      "sql_type": '"double"'}}
    return KerasModel(model=model, feature_columns=["features"], label_columns=["label"],
                      _metadata=meta)


def _loader(model):
    """(key, broadcast-free payload) for the per-worker model cache."""
    from tfring.spark.keras import _predict

    data = _predict.model_bytes(model)
    return _predict.model_key(data, None, None), data


def per_row(df, model):
    """Horovod's way: one predict_on_batch per row, in a Python UDF."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import DoubleType

    key, data = _loader(model)
    payload = df.sparkSession.sparkContext.broadcast(data)

    def predict(v):
        from tfring.spark.keras import _predict

        m = _predict.cached_model(key, payload, None, None)
        return float(m.predict_on_batch(v.toArray().reshape(1, -1))[0, 0])

    return df.withColumn("label__output", F.udf(predict, DoubleType())("features"))


def map_in_arrow(df, model):
    """The same batched calls in mapInArrow: every column crosses into
    Python and back."""
    from pyspark.ml.functions import vector_to_array
    from pyspark.sql.types import DoubleType, StructField, StructType

    key, data = _loader(model)
    payload = df.sparkSession.sparkContext.broadcast(data)
    src = df.select(*[vector_to_array(c, "float32").alias(c) if c == "features" else c
                      for c in df.columns])
    schema = StructType(src.schema.fields + [StructField("label__output", DoubleType())])
    at = src.columns.index("features")

    def predict(batches):
        import pyarrow as pa

        from tfring.spark.keras import _predict

        m = _predict.cached_model(key, payload, None, None)
        for b in batches:
            x = _predict.arrow_to_numpy(b.column(at), "features", None, "float32")
            y = np.asarray(m.predict_on_batch(x)).reshape(-1).astype(np.float64)
            yield pa.RecordBatch.from_arrays(b.columns + [pa.array(y)], names=schema.names)

    return src.mapInArrow(predict, schema)


def predict_batch(df, model):
    """pyspark.ml.functions.predict_batch_udf over the same model."""
    from pyspark.ml.functions import predict_batch_udf, vector_to_array
    from pyspark.sql.types import DoubleType

    key, data = _loader(model)
    payload = df.sparkSession.sparkContext.broadcast(data)

    def make_predict_fn():
        from tfring.spark.keras import _predict

        m = _predict.cached_model(key, payload, None, None)

        def fn(x):
            return np.asarray(m.predict_on_batch(x)).reshape(-1).astype(np.float64)

        return fn

    features = model.inputs[0].shape[1]
    udf = predict_batch_udf(make_predict_fn, return_type=DoubleType(), batch_size=10_000,
                            input_tensor_shapes=[[features]])
    return df.withColumn("label__output", udf(vector_to_array("features", "float32")))


def _run(out):
    t0 = time.perf_counter()
    out.write.format("noop").mode("overwrite").save()
    return time.perf_counter() - t0


def main():
    args = _args()
    spark = _spark(args.master)
    df = _frame(spark, args.rows, args.features, args.partitions, args.extra_columns)
    model = _model(args.features, args.hidden)
    km = _keras_model(model, df)
    methods = {"transform": km.transform, "mapInArrow": lambda d: map_in_arrow(d, model),
               "predict_batch": lambda d: predict_batch(d, model),
               "per-row": lambda d: per_row(d, model)}
    chosen = [m for m in args.methods.split(",") if m]
    warm = df.limit(args.partitions * 100).repartition(args.partitions).cache()
    warm.count()
    # Warm every method first (each Python worker imports TensorFlow and
    # loads the model), then time them in interleaved rounds, so a change
    # in the machine's load hits them alike.
    warmup = {name: _run(methods[name](warm)) for name in chosen}
    counts = {name: args.rows for name in chosen}
    frames = {name: df for name in chosen}
    if "per-row" in chosen:
        sub = df.limit(args.baseline_rows).repartition(args.partitions).cache()
        counts["per-row"] = sub.count()
        frames["per-row"] = sub
    times = {name: [] for name in chosen}
    for _ in range(args.rounds):
        for name in chosen:
            times[name].append(_run(methods[name](frames[name])))
    results = {}
    for name in chosen:
        rows, best = counts[name], min(times[name])
        med = sorted(times[name])[len(times[name]) // 2]
        results[name] = {"rows": rows, "seconds": best, "rows_per_s": rows / best,
                         "median_rows_per_s": rows / med, "warmup_s": warmup[name],
                         "all_seconds": times[name]}
        print(f"{name:14s} {rows:8d} rows in {best:8.2f} s  {rows / best:12,.0f} rows/s  "
              f"(median {rows / med:,.0f}; warm-up {warmup[name]:.1f} s)", flush=True)
    if "transform" in results and "per-row" in results:
        t, b = results["transform"], results["per-row"]
        ratio = t["rows_per_s"] / b["rows_per_s"]
        median = t["median_rows_per_s"] / b["median_rows_per_s"]
        results["speedup_transform_over_per_row"] = ratio
        results["median_speedup_transform_over_per_row"] = median
        print(f"transform / per-row: {ratio:.1f}x best, {median:.1f}x median")
    info = {"rows": args.rows, "features": args.features, "hidden": args.hidden,
            "extra_columns": args.extra_columns, "rounds": args.rounds,
            "partitions": args.partitions, "master": args.master,
            "cpus": os.cpu_count(), "load_avg": os.getloadavg(),
            "python": platform.python_version(), "pyspark": spark.version}
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"config": info, "results": results}, f, indent=1)
    print(json.dumps({"config": info, "results": results}))
    spark.stop()


if __name__ == "__main__":
    main()
