"""KerasEstimator streaming a large Parquet data set: each rank's memory
growth, and its step time against the same model fed from memory.

    python benchmarks/spark_streaming_bench.py [--gb 2] [--features 256] [--batch 256]
        [--num-proc 2] [--files 20] [--steps 0] [--runs stream,stream-shuffle,memory]
        [--master local[2]] [--work-dir DIR] [--keep] [--json result.json]

1. Writes a synthetic data set of about --gb GiB with pyarrow, straight to
   the store's training path (store.get_train_data_path()): --files files
   of equal rows, an `x` column of --features float32 and a float32 label
   `y` (the sum of the first four features), snappy, row groups of about
   64 MiB. x is stored as fit's prepare stores it, BINARY rows of the
   values' bytes with the column's metadata (--format tensor,
   tfring/spark/common/tensor_codec.py), or as the Parquet LIST that
   df.write.parquet makes of an array column (--format list). No metadata
   file: fit_on_parquet reads the column metadata from the Parquet schema.
2. Starts Spark (--master, default local[2]) and warms its Python workers
   (each imports TensorFlow, Keras and tfring.keras), so that the runs
   measure training rather than first imports. Then a short first stream
   fit (stream-first, 3 x --skip steps) in those workers: the first fit's
   memory (pyarrow's import, tf.data's and Keras' first use) counts in the
   memory target; its steps do not count in the step ratio.
3. The runs, one epoch each, the same model (benchmarks/spark_estimator_overhead.py's
   MLP: features-64-64-1), SGD, batch --batch per rank, the same steps
   (the smallest shard's whole batches, or --steps):
     stream          KerasEstimator.fit_on_parquet, inmemory_cache_all=False,
                     shuffle=False: each rank streams its files;
     stream-shuffle  the same with shuffle=True (its default row buffer);
     memory          tfring.spark.run of a function that reads the rank's
                     shard (the same files) into numpy, then fits the same
                     model on tf.data.Dataset.from_tensor_slices of it
                     (.batch(--batch); --memory-feed batches: of the arrays
                     viewed as (batches, batch, ...), one slice per step),
                     with DistributedOptimizer and the estimator's two
                     tfring callbacks.
   A RankProbe callback rides along in every rank. It is unpickled when the
   rank's Spark task starts (before the rank's function runs), notes the
   process's RSS then and resets the kernel's peak RSS (VmHWM, through
   /proc/self/clear_refs; Spark reuses Python workers, so the process's
   own peak would include earlier jobs). At train begin it notes RSS; at
   train end the peak since the task start. Step time: the time between
   consecutive batch ends (data wait, step and allreduce), leaving out the
   first --skip steps; median and mean.
4. The reader alone: rank 0's shard through the estimator's ShardReader in
   the driver process, no training: its ms per batch and MB/s, the data
   path's own cost.

Targets: every rank's peak within 1 GiB of its RSS at the task start
(stream), and stream's median and mean step at most 1.2x memory's. Prints
a table, the load average before and its highest during each run, and
writes JSON with --json.

Measured on 2026-12-02 (2-vCPU VM, load average 1.1-3.2 during the runs,
each rank bound to one core), `python benchmarks/spark_streaming_bench.py`
(2.00 GiB, x as BINARY tensors as fit writes them, 4080 steps of 256 per
rank, --memory-feed rows):

  run             growth MiB (start->peak)  step median / mean ms  ratio median / mean
  stream-first    166 (722 -> 888)          3.40 / 3.93            (60 steps)
  stream          117-125 (880 -> 1004)     3.01 / 3.83            0.87x / 1.05x
  stream-shuffle  354-369 (985 -> 1353)     2.94 / 4.29            0.85x / 1.17x
  memory          4426-4443 (-> 5646)       3.45 / 3.65

A second run right after: 0.83x / 0.98x streamed, 0.77x / 1.00x shuffled
(memory 4.21 / 4.53 ms, load 0.0-3.6). The reader alone streamed rank 0's
shard at 809 MB/s (0.33 ms a batch; 664 MB/s in the second run).
Stream's CPU time was 14.6-14.8 s, stream-shuffle's 15.6-15.8 s, memory's
16.4-16.6 s for the same steps. The same bench on the same day before the
BINARY tensor columns, the aligned tf.data feed and the feed's move off
Dataset.from_generator (whose op turns off malloc's adaptive mmap
threshold in the rank, so that every large allocation faults its pages
in) gave 1.58x and 1.76x mean (load 1.1-2.1).
"""

import argparse
import json
import os
import resource
import sys
import tempfile
import time

import keras
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import spark_estimator_overhead as overhead  # noqa: E402  (its model)

MIB = 1 << 20
GROWTH_TARGET_MIB = 1024
STEP_RATIO_TARGET = 1.2


def _proc_status():
    """VmRSS and VmHWM of this process, in bytes."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                out[line.split(":")[0]] = int(line.split()[1]) * 1024
    return out


class RankProbe(keras.callbacks.Callback):
    """Memory and step times of one rank (module docstring, step 3); writes
    <out_dir>/<label>-rank<r>.json at train end."""

    def __init__(self, out_dir, label, skip):
        super().__init__()
        self.out_dir, self.label, self.skip = out_dir, label, skip

    def __setstate__(self, state):
        # Runs where the task unpickles its job: the start of the rank.
        self.__dict__.update(state)
        self.warm = "tfring.keras" in sys.modules
        self.rss_task = _proc_status()["VmRSS"]
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # VmHWM := VmRSS
            self.hwm_reset = True
        except OSError:
            self.hwm_reset = False
        self.t_task = time.monotonic()
        self.ends = []

    def on_train_begin(self, logs=None):
        self.rss_train = _proc_status()["VmRSS"]
        self.t_train = time.monotonic()
        ru = resource.getrusage(resource.RUSAGE_SELF)
        self.cpu_train = ru.ru_utime + ru.ru_stime

    def on_train_batch_end(self, batch, logs=None):
        self.ends.append(time.monotonic())

    def on_train_end(self, logs=None):
        import tfring.keras as tk

        now = time.monotonic()
        st = _proc_status()
        ru = resource.getrusage(resource.RUSAGE_SELF)
        steps = np.diff(self.ends)[self.skip:]
        out = {
            "run": self.label, "rank": tk.rank(), "pid": os.getpid(), "warm": self.warm,
            "hwm_reset": self.hwm_reset,
            "rss_task_mib": self.rss_task / MIB, "rss_train_mib": self.rss_train / MIB,
            "peak_mib": st["VmHWM"] / MIB, "rss_end_mib": st["VmRSS"] / MIB,
            "growth_task_mib": (st["VmHWM"] - self.rss_task) / MIB,
            "growth_train_mib": (st["VmHWM"] - self.rss_train) / MIB,
            "steps": len(self.ends),
            "step_median_ms": 1e3 * float(np.median(steps)) if len(steps) else float("nan"),
            "step_mean_ms": 1e3 * float(np.mean(steps)) if len(steps) else float("nan"),
            "step_p90_ms": 1e3 * float(np.percentile(steps, 90)) if len(steps) else float("nan"),
            "setup_s": self.t_train - self.t_task, "train_s": now - self.t_train,
            "train_cpu_s": ru.ru_utime + ru.ru_stime - self.cpu_train,
        }
        with open(os.path.join(self.out_dir, f"{self.label}-rank{out['rank']}.json"), "w") as f:
            json.dump(out, f)


class LoadSampler:
    """The 1-minute load average every `every` seconds while a run lasts
    (the machine's other work shows in it)."""

    def __init__(self, every=2.0):
        import threading

        self.samples, self._stop = [os.getloadavg()[0]], threading.Event()
        self._thread = threading.Thread(target=self._loop, args=(every,), daemon=True)
        self._thread.start()

    def _loop(self, every):
        while not self._stop.wait(every):
            self.samples.append(os.getloadavg()[0])

    def stop(self):
        self._stop.set()
        self._thread.join()
        self.samples.append(os.getloadavg()[0])
        return {"load_before": self.samples[0], "load_max": max(self.samples),
                "load_mean": float(np.mean(self.samples)), "load_after": self.samples[-1]}


def warm_up():
    """Imports what the runs import, in a reused Python worker."""
    import tensorflow  # noqa: F401

    import tfring.keras as tk

    tk.init()
    return tk.rank()


def from_memory(files, features, batch, steps, lr, probe, model_fn, feed="rows"):
    """The rank's shard read into numpy, then model.fit on it (module
    docstring, step 3, memory)."""
    import pyarrow.parquet as pq
    import tensorflow as tf

    import tfring.keras as tk
    from tfring.spark.common import reader as rd

    tk.init()
    keras.backend.clear_session()
    xs, ys = [], []
    for path in rd.shard_files(files, tk.rank(), tk.size()):
        t = pq.read_table(path, columns=["x", "y"])
        xs.append(rd.column_to_numpy(t.column("x"), "x", [features], "float32"))
        ys.append(rd.arrow_to_numpy(t.column("y"), "y", []).reshape(-1, 1))
        del t
    x, y = np.concatenate(xs), np.concatenate(ys)
    del xs, ys
    model = model_fn(features)
    model.compile(optimizer=tk.DistributedOptimizer(keras.optimizers.SGD(lr * tk.size())),
                  loss="mse")
    if feed == "rows":  # tf.data slices rows and batches them again: about 0.3 ms a batch
        ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(batch, drop_remainder=True)
    else:  # one slice per batch of a (batches, batch, ...) view
        n = len(x) // batch * batch
        ds = tf.data.Dataset.from_tensor_slices((x[:n].reshape(-1, batch, features),
                                                 y[:n].reshape(-1, batch, 1)))
    ds = ds.prefetch(tf.data.AUTOTUNE)
    model.fit(ds, steps_per_epoch=steps, epochs=1, verbose=0, shuffle=False,
              callbacks=[probe, tk.callbacks.BroadcastGlobalVariablesCallback(0),
                         tk.callbacks.MetricAverageCallback()])
    keras.backend.clear_session()
    return len(x)


def write_data(path, gb, features, num_files, compression, fmt="tensor", seed=0):
    """The synthetic data set (module docstring, step 1). Returns
    (rows per file, bytes on disk, seconds)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tfring.spark.common import tensor_codec

    row_bytes = 4 * features + 4
    rows = int(gb * (1 << 30)) // row_bytes // num_files
    group = max(1, (64 << 20) // row_bytes)
    os.makedirs(path, exist_ok=True)
    rng = np.random.default_rng(seed)
    offsets = pa.array(np.arange(0, (rows + 1) * features, features, dtype=np.int32))
    t0 = time.monotonic()
    for i in range(num_files):
        x = rng.standard_normal((rows, features), dtype=np.float32)
        y = x[:, :4].sum(axis=1)
        col = pa.ListArray.from_arrays(offsets, pa.array(x.reshape(-1)))
        batch = pa.record_batch({"x": col, "y": pa.array(y)})
        if fmt == "tensor":  # as KerasEstimator.fit's prepare writes it
            meta = {"spark_type": "array", "dtype": "float32", "shape": [features],
                    "sql_type": '{"type":"array","elementType":"float","containsNull":true}'}
            (batch,) = tensor_codec.encode_batch(batch, {"x": meta})
            x_field = pa.field("x", pa.binary(), False,
                               tensor_codec.spark_field_metadata(meta))
            batch = pa.record_batch(batch.columns, schema=pa.schema(
                [x_field, batch.schema.field("y")]))
        table = pa.Table.from_batches([batch])
        pq.write_table(table, os.path.join(path, f"part-{i:05d}.parquet"),
                       compression=compression, use_dictionary=False, row_group_size=group)
        del x, y, col, table
    size = sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path))
    return rows, size, time.monotonic() - t0


def reader_alone(files, features, batch, steps, num_proc):
    """Rank 0's shard through ShardReader in this process (module
    docstring, step 4): (ms per batch, MB/s)."""
    import pyarrow.fs as pafs

    from tfring.spark.common import reader as rd

    r = rd.ShardReader(pafs.LocalFileSystem(), rd.shard_files(files, 0, num_proc),
                       {"x": [features], "y": []}, batch, dtypes={"x": "float32"})
    t0, n = time.monotonic(), 0
    for b in r.batches(0, steps):
        n += b["x"].nbytes + b["y"].nbytes
    dt = time.monotonic() - t0
    return 1e3 * dt / steps, n / dt / 1e6


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gb", type=float, default=2.0, help="GiB of data (on disk)")
    parser.add_argument("--features", type=int, default=256)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--num-proc", type=int, default=2)
    parser.add_argument("--files", type=int, default=20)
    parser.add_argument("--steps", type=int, default=0,
                        help="steps per rank (0: the smallest shard's whole batches)")
    parser.add_argument("--skip", type=int, default=20, help="first steps left out of timing")
    parser.add_argument("--runs", default="stream,stream-shuffle,memory",
                        help="comma list of stream, stream-shuffle, memory (in that order)")
    parser.add_argument("--memory-feed", choices=["rows", "batches"], default="rows",
                        help="memory run: from_tensor_slices of rows then .batch(), or of "
                             "pre-batched arrays")
    parser.add_argument("--compression", default="snappy")
    parser.add_argument("--format", choices=["tensor", "list"], default="tensor",
                        help="x as BINARY tensors (what fit's prepare writes) or as a Parquet "
                             "LIST (what df.write.parquet writes for an array column)")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--work-dir", default=None)
    parser.add_argument("--keep", action="store_true", help="keep the data set")
    parser.add_argument("--no-reader", action="store_true", help="skip the reader-alone pass")
    parser.add_argument("--json", default=None, metavar="PATH")
    args = parser.parse_args()
    runs = [r for r in args.runs.split(",") if r]
    unknown = set(runs) - {"stream", "stream-shuffle", "memory"}
    if unknown:
        parser.error(f"unknown run(s) {sorted(unknown)}")

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    import pyspark
    from pyspark.sql import SparkSession

    import tfring.spark
    from tfring.spark.common.store import Store
    from tfring.spark.keras import KerasEstimator

    work = args.work_dir or tempfile.mkdtemp(prefix="tfring-streaming-")
    store = Store.create(work)
    data_path = store.get_localized_path(store.get_train_data_path())
    probe_dir = os.path.join(work, "probe")
    os.makedirs(probe_dir, exist_ok=True)
    rows_per_file, disk_bytes, write_s = write_data(data_path, args.gb, args.features,
                                                   args.files, args.compression, args.format)
    files = sorted(os.path.join(data_path, f) for f in os.listdir(data_path)
                   if f.endswith(".parquet"))
    shard_rows = [rows_per_file * len(files[r::args.num_proc]) for r in range(args.num_proc)]
    steps = args.steps or min(shard_rows) // args.batch
    print(f"data: {disk_bytes / (1 << 30):.2f} GiB on disk in {len(files)} files "
          f"({args.compression}, x as {args.format}), {rows_per_file * len(files):,} rows "
          f"x {args.features} "
          f"float32 + label, written in {write_s:.1f} s; {steps} steps of {args.batch} rows "
          f"per rank ({steps * args.batch * args.num_proc / (rows_per_file * len(files)):.0%} "
          "of the rows)", flush=True)

    for mod in (sys.modules[__name__], overhead):
        pyspark.cloudpickle.register_pickle_by_value(mod)
    spark = (SparkSession.builder.master(args.master).appName("estimator-streaming")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    t = time.monotonic()
    tfring.spark.run(warm_up, num_proc=args.num_proc, verbose=0)
    print(f"workers warmed in {time.monotonic() - t:.1f} s", flush=True)

    lr, results = 0.01, []
    for run, run_steps in [("stream-first", min(steps, 3 * args.skip))] + \
            [(r, steps) for r in runs]:
        probe = RankProbe(probe_dir, run, args.skip)
        load, t = LoadSampler(), time.monotonic()
        if run == "memory":
            tfring.spark.run(from_memory, args=(files, args.features, args.batch, steps, lr,
                                                probe, overhead._model, args.memory_feed),
                             num_proc=args.num_proc, verbose=0)
        else:
            est = KerasEstimator(num_proc=args.num_proc, store=store,
                                 model=overhead._model(args.features),
                                 optimizer=keras.optimizers.SGD(lr), loss="mse",
                                 feature_cols=["x"], label_cols=["y"], batch_size=args.batch,
                                 epochs=1, train_steps_per_epoch=run_steps,
                                 shuffle=run == "stream-shuffle", inmemory_cache_all=False,
                                 callbacks=[probe], verbose=0, random_seed=0)
            est.fit_on_parquet()
        wall, loads = time.monotonic() - t, load.stop()
        for r in range(args.num_proc):
            with open(os.path.join(probe_dir, f"{run}-rank{r}.json")) as f:
                row = json.load(f)
            row.update(wall_s=wall, **loads)
            results.append(row)
            print(json.dumps(row), flush=True)

    reader = None
    if not args.no_reader:
        load = LoadSampler()
        ms, mbs = reader_alone(files, args.features, args.batch, steps, args.num_proc)
        reader = {"ms_per_batch": ms, "mb_per_s": mbs, **load.stop()}
    spark.stop()

    cols = [("rank", "rank", "d"), ("warm", "warm", ""), ("rss_task_mib", "start", ".0f"),
            ("rss_train_mib", "train0", ".0f"), ("peak_mib", "peak", ".0f"),
            ("growth_task_mib", "growth", ".0f"), ("growth_train_mib", "gr_train", ".0f"),
            ("step_median_ms", "step_med", ".3f"), ("step_mean_ms", "step_mean", ".3f"),
            ("step_p90_ms", "step_p90", ".3f"), ("train_s", "train_s", ".1f"),
            ("train_cpu_s", "cpu_s", ".1f"), ("wall_s", "wall_s", ".1f"),
            ("load_before", "load0", ".1f"), ("load_max", "load_max", ".1f")]
    print(f"\n{args.num_proc} ranks, batch {args.batch}, {steps} steps, master {args.master}; "
          "memory in MiB (start: RSS at the task start; train0: at train begin; peak: VmHWM "
          "since the task start; growth: peak - start), steps in ms")
    print(f"{'run':15}" + "".join(f"{h:>10}" for _, h, _ in cols))
    for r in results:
        print(f"{r['run']:15}" + "".join(f"{format(r[k], f):>10}" for k, _, f in cols))

    def worst(run, key, fn=max):
        vals = [r[key] for r in results if r["run"] == run]
        return fn(vals) if vals else None

    summary = {}
    for run in ("stream-first", "stream", "stream-shuffle"):
        growth = worst(run, "growth_task_mib")
        if growth is None:
            continue
        summary[f"{run}_growth_mib"] = growth
        verdict = "met" if growth <= GROWTH_TARGET_MIB else "MISSED"
        print(f"{run}: largest rank peak growth {growth:.0f} MiB "
              f"(target <= {GROWTH_TARGET_MIB}): {verdict}")
        if "memory" in runs and run != "stream-first":
            for stat in ("median", "mean"):
                a, b = worst(run, f"step_{stat}_ms"), worst("memory", f"step_{stat}_ms")
                summary[f"{run}_step_{stat}_ratio"] = a / b
                print(f"{run}: {stat} step {a:.3f} ms vs memory {b:.3f} ms (slowest rank) = "
                      f"{a / b:.2f}x (target <= {STEP_RATIO_TARGET}x): "
                      f"{'met' if a / b <= STEP_RATIO_TARGET else 'MISSED'}")
    if reader:
        print(f"reader alone (rank 0's shard, driver process): {reader['ms_per_batch']:.3f} ms "
              f"per batch, {reader['mb_per_s']:.0f} MB/s (load {reader['load_before']:.1f}-"
              f"{reader['load_max']:.1f})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "rows": rows_per_file * len(files),
                       "disk_bytes": disk_bytes, "write_s": write_s, "files": len(files),
                       "steps": steps,
                       "runs": results, "reader_alone": reader, "summary": summary,
                       "time": time.strftime("%Y-%m-%d %H:%M"), "host_cpus": os.cpu_count()},
                      f, indent=1)
    if not args.keep:
        import shutil

        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
