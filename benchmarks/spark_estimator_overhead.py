"""What KerasEstimator.fit costs over the same training written by hand
with tfring.spark.run on Parquet files already written.

    python benchmarks/spark_estimator_overhead.py [--rows 20000] [--features 32]
        [--batch 64] [--epochs 4] [--num-proc 2] [--master local-cluster[2,2,1024]]
        [--out result.json]

One Spark application, one DataFrame (spark.range rows, `features` columns
of doubles as an array, a label), a small MLP, SGD, no shuffling. In order:

  1. estimator, cold: the first fit, whose ranks land in Python workers
     that have not imported TensorFlow yet;
  2. then, on warm workers, alternating twice: the estimator (its Parquet
     reused, as fitting one DataFrame again does), and the baseline:
     tfring.spark.run of a function that reads the estimator's training
     files with tfring.spark.make_dataset (each rank's shard in memory),
     compiles the same model with DistributedOptimizer and fits it with
     BroadcastGlobalVariablesCallback and MetricAverageCallback;
  3. the estimator with shuffle=True (its row buffer) once.

Per run: total (call to return), startup (call to the end of rank 0's
first step, wall clock), its parts (the driver before Spark: checks and
data prep; Spark until rank 0's function starts; rank 0's imports;
init/compile/data setup; first step with tracing), the median step and
the mean epoch after the first (steps plus every epoch-end callback: the
estimator's checkpoint and publishing), and the time after training (the
model back to the driver). Prints a table and writes JSON with --out.
"""

import argparse
import json
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))


def _model(features):
    import keras

    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input((features,)), keras.layers.Dense(64, activation="relu"),
                             keras.layers.Dense(64, activation="relu"), keras.layers.Dense(1)])


def baseline(path, features, batch, epochs, lr):
    """The hand-written job each rank runs: the estimator's training without
    the estimator."""
    t0, t0_wall = time.monotonic(), time.time()
    warm = "keras" in sys.modules
    import keras

    import tfring.keras as tk
    import tfring.spark
    from tfring.spark.keras.remote import _timer_class

    marks = {"imported": time.monotonic()}
    tk.init()
    marks["initialized"] = time.monotonic()
    keras.backend.clear_session()
    model = _model(features)
    model.compile(optimizer=tk.DistributedOptimizer(keras.optimizers.SGD(lr * tk.size())),
                  loss="mse")
    marks["compiled"] = time.monotonic()
    ds, steps = tfring.spark.make_dataset(path, ["x"], "y", batch_size=batch)
    marks["readers"] = time.monotonic()
    timer = _timer_class()(marks)
    model.fit(ds, steps_per_epoch=steps, epochs=epochs, verbose=0,
              callbacks=[timer, tk.callbacks.BroadcastGlobalVariablesCallback(0),
                         tk.callbacks.MetricAverageCallback()])
    marks["fit_end"] = time.monotonic()
    if tk.rank() != 0:
        return None
    timing = {k: round(v - t0, 4) for k, v in marks.items()}
    timing.update(timer.summary(), start_wall=t0_wall, warm_worker=warm, steps=steps)
    return {"timing": timing, "weights": [w.tolist() for w in model.get_weights()[-1:]]}


class TimedBackend:
    """SparkBackend, noting when run() is called."""

    def __init__(self, num_proc):
        from tfring.spark.common.backend import SparkBackend

        self.inner = SparkBackend(num_proc=num_proc, verbose=0)
        self.run_called = None

    def run(self, fn, args=(), kwargs=None, env=None):
        self.run_called = time.time()
        return self.inner.run(fn, args, kwargs, env)

    def num_processes(self):
        return self.inner.num_processes()


def _row(kind, t_call, t_run, t_return, timing):
    start = timing["start_wall"]
    return {
        "run": kind,
        "total_s": t_return - t_call,
        "startup_s": start + timing["first_step_end"] - t_call,
        "driver_before_spark_s": t_run - t_call,
        "spark_to_rank_s": start - t_run,
        "rank_imports_s": timing["imported"],
        "rank_setup_s": timing["readers"] - timing["imported"],
        "first_step_s": timing["first_step_end"] - timing["readers"],
        "step_ms": 1e3 * timing.get("step_s", float("nan")),
        "epoch_s": timing.get("epoch_s", float("nan")),
        "after_training_s": t_return - (start + timing["fit_end"]),
        "rank_result_s": timing.get("result_ready", timing["fit_end"]) - timing["fit_end"],
        "warm_worker": timing.get("warm_worker"),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=20000)
    parser.add_argument("--features", type=int, default=32)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--num-proc", type=int, default=2)
    parser.add_argument("--master", default="local-cluster[2,2,1024]")
    parser.add_argument("--work-dir", default=None)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()

    import tempfile

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    import keras
    import pyspark
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    import tfring.spark
    from tfring.spark.common.store import Store
    from tfring.spark.keras import KerasEstimator

    pyspark.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    spark = (SparkSession.builder.master(args.master).appName("estimator-overhead")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "4").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    work = args.work_dir or tempfile.mkdtemp(prefix="tfring-overhead-")
    store = Store.create(work)
    cols = [F.rand(k) for k in range(args.features)]
    df = spark.range(args.rows).select(F.array(*cols).alias("x"),
                                       sum(cols[: min(4, args.features)]).alias("y"))
    lr = 0.01
    rows = []

    def fit(kind, shuffle=False):
        backend = TimedBackend(args.num_proc)
        est = KerasEstimator(backend=backend, store=store, model=_model(args.features),
                             optimizer=keras.optimizers.SGD(lr), loss="mse",
                             feature_cols=["x"], label_cols=["y"], batch_size=args.batch,
                             epochs=args.epochs, shuffle=shuffle, verbose=0,
                             partitions_per_process=4)
        t = time.time()
        est.fit(df)
        rows.append(_row(kind, t, backend.run_called, time.time(), est._last_timing))
        print(json.dumps(rows[-1]), flush=True)

    def hand_written():
        (d,) = [p for p in os.listdir(work) if p.startswith("intermediate_train_data.")
                and not p.endswith(".json")]
        t = time.time()
        res = tfring.spark.run(baseline, args=(os.path.join(work, d), args.features, args.batch,
                                               args.epochs, lr),
                               num_proc=args.num_proc, verbose=0)[0]
        rows.append(_row("tfring.spark.run", t, t, time.time(), res["timing"]))
        print(json.dumps(rows[-1]), flush=True)

    fit("estimator (cold workers)")
    for _ in range(2):
        fit("estimator")
        hand_written()
    fit("estimator, shuffle=True", shuffle=True)

    keys = ["total_s", "startup_s", "driver_before_spark_s", "spark_to_rank_s",
            "rank_imports_s", "rank_setup_s", "first_step_s", "step_ms", "epoch_s",
            "after_training_s", "rank_result_s"]
    print(f"\n{args.rows} rows x {args.features} features, batch {args.batch} per rank, "
          f"{args.num_proc} ranks, {args.epochs} epochs, master {args.master}")
    short = {"driver_before_spark_s": "driver", "spark_to_rank_s": "to_rank",
             "rank_imports_s": "imports", "rank_setup_s": "setup", "first_step_s": "1st_step",
             "after_training_s": "after", "rank_result_s": "rank_result"}
    print(f"{'run':26}" + "".join(f"{short.get(k, k.removesuffix('_s')):>12}" for k in keys))
    for r in rows:
        print(f"{r['run']:26}" + "".join(f"{r[k]:12.3f}" for k in keys))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), "runs": rows, "time": time.strftime("%Y-%m-%d %H:%M"),
                       "host_cpus": os.cpu_count()}, f, indent=1)
    spark.stop()
    _ = np  # numpy is the executors' too


if __name__ == "__main__":
    main()
