"""The same Keras training run as a tfring job three ways, side by side in
one run: under tfring-run's machinery (tfring.runner.run), inside Spark
(tfring.spark.run, one barrier stage) and on Ray (tfring.ray.RayExecutor).

    python benchmarks/engines_bench.py                      # all three, 2 ranks
    python benchmarks/engines_bench.py --engines runner,ray --steps 50 --json out.json

Every engine runs the same function: a fixed-seed model, each rank's own
data shard in a fixed order, model.fit with RingAllreduceCallback. Per
engine it reports:
  call s     the whole call on the driver, ranks started to results back
  startup s  call s less the slowest rank's time inside the function
  init s     the slowest rank's tfring.init() (the rendezvous)
  step ms    median per-step time of the slowest rank (after 3 warm-up steps)
  same       whether its final weights equal tfring-run's bit for bit
and each engine's start-up and step time over tfring-run's. The engines'
own start (a SparkSession, a Ray head) is timed apart ("engine start s")
and left out of the call.
"""

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

STEPS_DEFAULT = 30


def train(steps, batch):
    """Runs in every rank; returns its timings and final weights."""
    t0 = time.perf_counter()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras
    import tensorflow as tf

    import tfring.keras as tk

    t_import = time.perf_counter()
    tk.init()
    t_init = time.perf_counter()
    rank, size = tk.rank(), tk.size()
    tf.random.set_seed(1234)
    keras.utils.set_random_seed(1234)
    rng = np.random.default_rng(100 + rank)  # each rank its own shard
    x = rng.normal(size=(steps * batch, 64)).astype("float32")
    y = (x[:, :8].sum(axis=1, keepdims=True) > 0).astype("float32")
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(128, activation="relu"),
                              keras.layers.Dense(128, activation="relu"),
                              keras.layers.Dense(1, activation="sigmoid")])
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="binary_crossentropy")

    class StepTimes(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            self.t = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            times.append(time.perf_counter() - self.t)

    times = []
    model.fit(x, y, batch_size=batch, epochs=1, shuffle=False, verbose=0,
              callbacks=[tk.callbacks.BroadcastGlobalVariablesCallback(0),
                         tk.callbacks.RingAllreduceCallback(), StepTimes()])
    weights = [w.numpy() if hasattr(w, "numpy") else np.asarray(w)
               for w in model.get_weights()]
    tk.shutdown()
    return {"rank": rank, "size": size, "import_s": t_import - t0, "init_s": t_init - t_import,
            "inside_s": time.perf_counter() - t0, "step_s": times[3:] or times,
            "weights": weights}


def run_runner(np_, steps, batch):
    import tfring.runner

    return None, lambda: tfring.runner.run(train, args=(steps, batch), num_proc=np_), None


def run_spark(np_, steps, batch):
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    import tfring.spark

    t0 = time.perf_counter()
    spark = (SparkSession.builder.master(f"local-cluster[{np_},1,1024]")
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.executor.memory", "1g").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    started = time.perf_counter() - t0
    return (started,
            lambda: tfring.spark.run(train, args=(steps, batch), num_proc=np_, verbose=0),
            spark.stop)


def run_ray(np_, steps, batch):
    import ray

    from tfring.ray import RayExecutor

    t0 = time.perf_counter()
    ray.init(num_cpus=np_, include_dashboard=False, log_to_driver=False)
    started = time.perf_counter() - t0
    def call():
        ex = RayExecutor(RayExecutor.create_settings(timeout_s=120), num_workers=np_)
        ex.start()
        try:
            return ex.run(train, args=[steps, batch])
        finally:
            ex.shutdown()
    return started, call, ray.shutdown


ENGINES = {"runner": run_runner, "spark": run_spark, "ray": run_ray}


def measure(name, np_, steps, batch):
    started, call, stop = ENGINES[name](np_, steps, batch)
    try:
        t0 = time.perf_counter()
        results = call()
        call_s = time.perf_counter() - t0
    finally:
        if stop:
            stop()
    assert [r["rank"] for r in results] == list(range(np_)), [r["rank"] for r in results]
    for r in results[1:]:  # data parallel: every rank ends with rank 0's weights
        assert all(np.array_equal(a, b) for a, b in zip(r["weights"], results[0]["weights"])), \
            f"{name}: rank {r['rank']}'s weights differ from rank 0's"
    return {"engine": name, "engine_start_s": started, "call_s": call_s,
            "startup_s": call_s - max(r["inside_s"] for r in results),
            "init_s": max(r["init_s"] for r in results),
            "step_ms": 1e3 * max(statistics.median(r["step_s"]) for r in results),
            "weights": results[0]["weights"]}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--engines", default="runner,spark,ray")
    p.add_argument("--np", type=int, default=2)
    p.add_argument("--steps", type=int, default=STEPS_DEFAULT)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--json", default="")
    a = p.parse_args()
    names = a.engines.split(",")
    if "runner" not in names:
        names.insert(0, "runner")  # the reference
    rows = [measure(n, a.np, a.steps, a.batch) for n in names]
    ref = rows[0]
    print(f"{a.np} ranks, {a.steps} steps of batch {a.batch} per rank\n")
    print("| engine | engine start s | call s | startup s | init s | step ms | "
          "startup / tfring-run | step / tfring-run | weights == tfring-run |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---|")
    for r in rows:
        same = all(np.array_equal(x, y) for x, y in zip(r["weights"], ref["weights"]))
        r["same_weights"] = bool(same)
        es = "-" if r["engine_start_s"] is None else f"{r['engine_start_s']:.2f}"
        print(f"| {r['engine']} | {es} | {r['call_s']:.2f} | {r['startup_s']:.2f} | "
              f"{r['init_s']:.2f} | {r['step_ms']:.2f} | {r['startup_s'] / ref['startup_s']:.2f} "
              f"| {r['step_ms'] / ref['step_ms']:.2f} | {'yes' if same else 'NO'} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"np": a.np, "steps": a.steps, "batch": a.batch,
                       "rows": [{k: v for k, v in r.items() if k != "weights"} for r in rows]},
                      f, indent=2)
    if not all(r["same_weights"] for r in rows):
        sys.exit("the engines' models differ from tfring-run's")


if __name__ == "__main__":
    main()
