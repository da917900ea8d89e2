"""tfring.spark.keras.KerasEstimator on a real local Spark (spark_util's
shared session: local-cluster[2,2,512]).

The default run keeps one end-to-end fit: 2 ranks, a linear model, SGD,
no shuffling. The ranks' data order is the reader's documented one (files
sorted by name, rank r reads files r, r+2, ..., rows in order, whole
batches, the smallest shard's steps), so the test rebuilds each rank's
batches from the Parquet files fit wrote, and trains the same model in
numpy float64 with the ranks' averaged gradient and the learning rate
scaled by 2: the weights and the history must match. Then the driver-side
checks, which fail before any Spark job. The rest is slow
(TFRING_TEST_SLOW=1): resume, validation, sample weights, the cache,
transformation_fn, a failing rank, several inputs and outputs, vectors.
"""

import json
import os
import sys

import numpy as np
import pytest

pyspark = pytest.importorskip("pyspark", reason="pyspark is not installed (pip install pyspark)")
pytest.importorskip("pyarrow")
keras = pytest.importorskip("keras")

import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402

from tfring.spark import SparkJobError  # noqa: E402
from tfring.spark.common.backend import SparkBackend  # noqa: E402
from tfring.spark.common.store import Store  # noqa: E402
from tfring.spark.keras import KerasEstimator, KerasModel  # noqa: E402

# Callbacks and transformation functions defined here run on the executors.
pyspark.cloudpickle.register_pickle_by_value(sys.modules[__name__])

from spark_util import session  # noqa: E402

W0 = np.array([[0.1], [0.2], [-0.1]])
B0 = np.array([0.05])
N = 200


@pytest.fixture(scope="module")
def spark():
    return session()


def _frame(spark, n=N):
    """Rows computed in the JVM (no Python worker): id, x (3 doubles), y,
    w (a weight), v (every 4th row true)."""
    i = F.col("id")
    a, b, c = F.sin(i * 0.37), F.cos(i * 0.11), (i % 7) / 7.0 - 0.5
    return spark.range(n).select(
        i, F.array(a, b, c).alias("x"),
        (1.5 * a - 2.0 * b + 0.5 * c + 0.1 * F.sin(i * 1.7)).alias("y"),
        (0.5 + (i % 3)).cast("double").alias("w"), (i % 4 == 0).alias("v"))


def _linear():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.set_weights([W0.astype("float32"), B0.astype("float32")])
    return model


def _data_dirs(root, kind="train"):
    return sorted(d for d in os.listdir(root)
                  if d.startswith(f"intermediate_{kind}_data.") and not d.endswith(".json"))


def _rank_rows(store_dir, size, cols=("x", "y"), kind="train", d=None):
    """Each rank's rows in its reading order: sorted files, r::size."""
    if d is None:
        (d,) = _data_dirs(store_dir, kind)
    files = sorted(f for f in os.listdir(os.path.join(store_dir, d)) if f.endswith(".parquet"))
    out = []
    for r in range(size):
        tables = [pq.read_table(os.path.join(store_dir, d, f)) for f in files[r::size]]
        out.append({c: np.concatenate([_values(t.column(c)) for t in tables]) for c in cols})
    return out


def _values(column):
    """A column's rows as float64; array columns are stored as BINARY rows
    of float64 bytes (tensor_codec.py), scalars as they are."""
    rows = column.to_pylist()
    if pa.types.is_binary(column.type):
        return np.stack([np.frombuffer(r, "<f8") for r in rows])
    return np.asarray(rows, np.float64)


def _reference(shards, lr, batch, epochs, weights=None, steps=None, scale=None):
    """Data-parallel SGD in float64: per step, each rank's MSE gradient on
    its batch, averaged, applied with lr * scale (default: the number of
    ranks). ``lr`` is a float or a function of the step (counted over the
    whole run from 0, as Keras' optimizer.iterations). Returns (W, b,
    per-epoch loss averaged over ranks and steps)."""
    size = len(shards)
    scale = size if scale is None else scale
    steps = steps or min(len(s["y"]) // batch for s in shards)
    w, b = W0.copy(), B0.copy()
    history = []
    step = 0
    for _ in range(epochs):
        losses = []
        for k in range(steps):
            rate = (lr(step) if callable(lr) else lr) * scale
            step += 1
            gw, gb = np.zeros_like(w), np.zeros_like(b)
            for s in shards:
                sl = slice(k * batch, (k + 1) * batch)
                x, y = s["x"][sl], s["y"][sl][:, None]
                sw = s[weights][sl][:, None] if weights else np.ones_like(y)
                err = x @ w + b - y
                losses.append(float(np.mean(sw * err ** 2)))
                gw += 2.0 / batch * x.T @ (sw * err)
                gb += 2.0 / batch * np.sum(sw * err, axis=0)
            w -= rate * gw / size
            b -= rate * gb / size
        history.append(float(np.mean(losses)))
    return w, b, history


def _estimator(store, **kw):
    args = dict(num_proc=2, store=store, model=_linear(),
                optimizer=keras.optimizers.SGD(0.05), loss="mse", feature_cols=["x"],
                label_cols=["y"], batch_size=8, epochs=2, shuffle=False,
                partitions_per_process=2, verbose=0, random_seed=7)
    args.update(kw)
    return KerasEstimator(**args)


def test_fit_matches_data_parallel_sgd_in_numpy(spark, tmp_path):
    store = Store.create(str(tmp_path / "store"))
    df = _frame(spark)
    km = _estimator(store, run_id="ref").fit(df)
    assert isinstance(km, KerasModel)

    shards = _rank_rows(str(tmp_path / "store"), 2)
    assert sum(len(s["y"]) for s in shards) == N  # every row written once
    w, b, history = _reference(shards, lr=0.05, batch=8, epochs=2)
    got_w, got_b = km.getModel().get_weights()
    np.testing.assert_allclose(got_w, w, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(got_b, b, rtol=1e-4, atol=1e-6)
    # The history is the ranks' average (MetricAverageCallback).
    assert list(km.getHistory()) == ["loss"]
    np.testing.assert_allclose(km.getHistory()["loss"], history, rtol=1e-4)
    # The returned optimizer has the unscaled rate; the metadata is the contract.
    assert float(km.getModel().optimizer.learning_rate) == pytest.approx(0.05)
    meta = km._get_metadata()
    assert meta["x"] == {"spark_type": "array", "dtype": "float64", "shape": [3],
                         "sql_type": df.schema["x"].dataType.json()}
    assert meta["y"]["spark_type"] == "scalar" and meta["y"]["shape"] == []
    # Rank 0's checkpoint after the last epoch is in the run's folder.
    assert store.get_checkpoints("ref") == [store.get_run_path("ref") + "/checkpoint.keras"]


def _decay(step):
    """ExponentialDecay(0.05, decay_steps=4, decay_rate=0.5) in float64."""
    return 0.05 * 0.5 ** (step / 4)


def _decay_schedule():
    return keras.optimizers.schedules.ExponentialDecay(0.05, decay_steps=4, decay_rate=0.5)


def test_a_learning_rate_schedule_is_scaled_by_the_ranks(spark, tmp_path):
    """SGD with ExponentialDecay on 2 ranks: the ranks step with
    schedule(step) * 2 (the numpy reference; the unscaled schedule ends
    elsewhere). The checkpoint holds the scaled schedule; the returned
    model, and the model of the finished run fit again, the user's own."""
    from tfring.spark.keras import _serialize

    root = tmp_path / "store"
    store = Store.create(str(root))
    df = _frame(spark, n=64)
    est = _estimator(store, optimizer=keras.optimizers.SGD(_decay_schedule()), epochs=1,
                     run_id="sched")
    km = est.fit(df)

    shards = _rank_rows(str(root), 2)
    steps = min(len(s["y"]) for s in shards) // 8
    assert steps >= 3  # the schedule decays within the epoch
    w, b, history = _reference(shards, _decay, batch=8, epochs=1)
    got_w, got_b = km.getModel().get_weights()
    np.testing.assert_allclose(got_w, w, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(got_b, b, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(km.getHistory()["loss"], history, rtol=1e-4)
    unscaled_w, _, _ = _reference(shards, _decay, batch=8, epochs=1, scale=1)
    assert not np.allclose(got_w, unscaled_w, rtol=1e-3, atol=1e-5)

    user = keras.optimizers.schedules.serialize(_decay_schedule())
    opt = km.getModel().optimizer
    assert opt.get_config()["learning_rate"] == user
    assert int(opt.iterations) == steps
    assert float(opt.learning_rate) == pytest.approx(_decay(steps), rel=1e-6)

    ckpt = _serialize.bytes_to_model(store.read(store.get_checkpoints("sched")[0]))
    scaled = ckpt.optimizer.get_config()["learning_rate"]
    assert scaled["class_name"] == "ScaledLearningRateSchedule"
    assert scaled["config"] == {"schedule": user, "multiplier": 2.0}
    assert float(ckpt.optimizer.learning_rate) == pytest.approx(2 * _decay(steps), rel=1e-6)

    again = est.fit(df)  # the run is complete: its checkpoint, without training
    assert again.getModel().optimizer.get_config()["learning_rate"] == user
    np.testing.assert_array_equal(again.getModel().get_weights()[0], got_w)


class _InverseTime(keras.optimizers.schedules.LearningRateSchedule):
    """A custom schedule, not registered: base / (1 + step)."""

    def __init__(self, base=0.1):
        self.base = base

    def __call__(self, step):
        return self.base / (1.0 + keras.ops.cast(step, "float32"))

    def get_config(self):
        return {"base": self.base}


def test_the_ranks_scale_a_custom_schedule_given_in_custom_objects():
    """What each rank compiles (remote._compile, no Spark): the user's
    custom schedule, found through custom_objects, times the number of
    ranks; saved and loaded as the driver loads rank 0's model, the
    schedule unwraps to the user's."""
    from tfring.spark.keras import _schedule, _serialize, remote

    co = {"_InverseTime": _InverseTime}
    config, base_lr = _serialize.serialize_optimizer(keras.optimizers.SGD(_InverseTime(0.1)))
    assert base_lr is None
    spec = remote.TrainSpec(optimizer=config, base_lr=None, backward_passes_per_step=1,
                            gradient_compression=None, custom_objects=co, loss="mse",
                            loss_weights=None, metrics=[])
    model = _linear()
    assert remote._compile(spec, model, 3) == (None, True)
    for step in (0, 5):
        model.optimizer.iterations.assign(step)
        assert float(model.optimizer.learning_rate) == pytest.approx(0.3 / (1 + step))

    loaded = _serialize.bytes_to_model(_serialize.model_to_bytes(model), co)
    loaded.optimizer.iterations.assign(4)
    assert float(loaded.optimizer.learning_rate) == pytest.approx(0.3 / 5)
    assert _schedule.unscale_optimizer(loaded.optimizer)
    assert float(loaded.optimizer.learning_rate) == pytest.approx(0.1 / 5)
    assert loaded.optimizer.get_config()["learning_rate"]["config"] == {"base": 0.1}
    assert not _schedule.unscale_optimizer(loaded.optimizer)  # one wrapper, unwrapped once


def _no_job_in(spark, group, fn):
    """Runs fn (which must raise) in a job group; returns the exception,
    checking that no Spark job ran."""
    sc = spark.sparkContext
    sc.setJobGroup(group, "driver-side checks")
    try:
        with pytest.raises(ValueError) as info:
            fn()
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)
    assert sc.statusTracker().getJobIdsForGroup(group) == []
    return str(info.value)


def test_bad_inputs_fail_on_the_driver_before_any_job(spark, tmp_path):
    store = Store.create(str(tmp_path / "store"))
    i = F.col("id")
    df = spark.range(10).select(i.cast("double").alias("a"), F.array(i, i, i).alias("x"),
                                i.cast("string").alias("s"), i.cast("double").alias("y"),
                                F.array(i, i).alias("y2"))

    with pytest.warns(UserWarning, match="reader_pool_type does nothing"):
        msg = _no_job_in(spark, "missing", lambda: _estimator(
            store, feature_cols=["nope"], reader_pool_type="process").fit(df))
    assert "'nope' is not in the DataFrame" in msg
    msg = _no_job_in(spark, "shape", lambda: _estimator(store, feature_cols=["a"]).fit(df))
    assert "feature column 'a' has per-row shape ()" in msg and "(3,)" in msg
    # The array column y2 needs its first row read (a job), but the scalar
    # feature's shape is known from the schema and fails first.
    msg = _no_job_in(spark, "schema-first", lambda: _estimator(
        store, label_cols=["y2"], feature_cols=["a"]).fit(df))
    assert "feature column 'a'" in msg
    msg = _no_job_in(spark, "string", lambda: _estimator(store, feature_cols=["s"]).fit(df))
    assert "column 's' has type string, not a number" in msg
    msg = _no_job_in(spark, "both", lambda: _estimator(
        store, backend=SparkBackend(num_proc=2)).fit(df))
    assert "backend or num_proc, not both" in msg
    msg = _no_job_in(spark, "count", lambda: _estimator(
        store, feature_cols=["x", "a"]).fit(df))
    assert "2 columns ['x', 'a'] but the model has 1 inputs" in msg
    msg = _no_job_in(spark, "validation", lambda: _estimator(store, validation="s").fit(df))
    assert "validation column 's' has type string" in msg
    # An array's length comes from the first row: one small job, no training.
    with pytest.raises(ValueError, match=r"label column 'y2' has per-row shape \(2,\), which "
                                         r"does not fit model output 0 of per-row shape \(1,\)"):
        _estimator(store, label_cols=["y2"]).fit(df)


def test_ragged_or_null_rows_fail_the_data_write_naming_the_column(spark, tmp_path):
    """Rows past the first are checked as the executors write them (no
    collect, no training job): the write fails naming the column."""
    i = F.col("id")
    store = Store.create(str(tmp_path / "store"))
    ragged = spark.range(10).select(
        F.when(i == 7, F.array(i, i)).otherwise(F.array(i, i, i)).cast("array<double>")
        .alias("x"), i.cast("double").alias("y"))
    with pytest.raises(ValueError, match=r"column 'x' has a null value, or an array whose "
                                         r"length differs from the first row's"):
        _estimator(store).fit(ragged)
    holes = spark.range(10).select(F.array(i, F.when(i != 4, i), i).cast("array<double>")
                                   .alias("x"), i.cast("double").alias("y"))
    with pytest.raises(ValueError, match="column 'x' has a null value"):
        _estimator(store).fit(holes)


# --- slow: the rest of the estimator's behaviour ----------------------------------------


@pytest.mark.slow
def test_resume_with_the_same_run_id(spark, tmp_path):
    """Two epochs, then the same run_id asked for four: it resumes after
    epoch 2 (weights and SGD momentum from the checkpoint) and ends where
    an uninterrupted four-epoch run ends."""
    df = _frame(spark)
    opt = keras.optimizers.SGD(0.02, momentum=0.9)
    store = Store.create(str(tmp_path / "store"))
    first = _estimator(store, optimizer=opt, run_id="r").fit(df)
    assert len(first.getHistory()["loss"]) == 2
    resumed = _estimator(store, optimizer=opt, run_id="r", epochs=4).fit(df)
    whole = _estimator(store, optimizer=opt, run_id="whole", epochs=4).fit(df)
    assert len(resumed.getHistory()["loss"]) == 4
    np.testing.assert_allclose(resumed.getHistory()["loss"][:2], first.getHistory()["loss"])
    np.testing.assert_allclose(resumed.getHistory()["loss"], whole.getHistory()["loss"],
                               rtol=1e-5)
    for a, b in zip(resumed.getModel().get_weights(), whole.getModel().get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
    # Nothing left to train: the checkpoint's model, without a Spark job.
    again = _estimator(store, optimizer=opt, run_id="r", epochs=4).fit(df)
    np.testing.assert_array_equal(again.getModel().get_weights()[0],
                                  resumed.getModel().get_weights()[0])


@pytest.mark.slow
def test_a_resumed_schedule_is_scaled_once(spark, tmp_path):
    """One epoch with a schedule, then the same run_id asked for two: the
    ranks go on from the checkpoint's step count with the schedule scaled
    once (not the checkpoint's scaled schedule scaled again), and end at
    the float64 reference of two epochs."""
    df = _frame(spark, n=64)
    root = tmp_path / "store"
    store = Store.create(str(root))
    opt = keras.optimizers.SGD(_decay_schedule())
    first = _estimator(store, optimizer=opt, run_id="s", epochs=1).fit(df)
    resumed = _estimator(store, optimizer=opt, run_id="s", epochs=2).fit(df)
    shards = _rank_rows(str(root), 2)
    w, b, history = _reference(shards, _decay, batch=8, epochs=2)
    np.testing.assert_allclose(resumed.getModel().get_weights()[0], w, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(resumed.getModel().get_weights()[1], b, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(resumed.getHistory()["loss"], history, rtol=1e-4)
    np.testing.assert_allclose(resumed.getHistory()["loss"][:1], first.getHistory()["loss"])
    opt = resumed.getModel().optimizer
    assert opt.get_config()["learning_rate"] == keras.optimizers.schedules.serialize(
        _decay_schedule())
    assert float(opt.learning_rate) == pytest.approx(_decay(int(opt.iterations)), rel=1e-6)


@pytest.mark.slow
def test_fit_on_parquet(spark, tmp_path):
    """On the data an earlier fit wrote (by its idx, from its metadata
    file), and on Parquet written by hand to the default path (metadata
    from the Parquet schema): the same numpy reference holds."""
    df = _frame(spark)
    root = tmp_path / "store"
    store = Store.create(str(root))
    _estimator(store, run_id="first").fit(df)
    (d,) = _data_dirs(str(root))
    idx = d.split(".", 1)[1]
    again = _estimator(store, run_id="second", epochs=1).fit_on_parquet(dataset_idx=idx)
    w, b, hist = _reference(_rank_rows(str(root), 2), 0.05, 8, 1)
    np.testing.assert_allclose(again.getModel().get_weights()[0], w, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(again.getHistory()["loss"], hist, rtol=1e-4)

    df.select("x", "y").repartition(4).write.parquet(store.get_train_data_path())
    mine = _estimator(store, run_id="third").fit_on_parquet()
    shards = _rank_rows(str(root), 2, d="intermediate_train_data")
    w, b, hist = _reference(shards, 0.05, 8, 2)
    np.testing.assert_allclose(mine.getModel().get_weights()[0], w, rtol=1e-4, atol=1e-6)
    assert mine._get_metadata()["x"]["shape"] == [3]
    with pytest.raises(ValueError, match="no Parquet training data"):
        _estimator(store).fit_on_parquet(dataset_idx="nothing")


@pytest.mark.slow
def test_validation_by_fraction_and_by_column(spark, tmp_path):
    df = _frame(spark)
    root = tmp_path / "by_column"
    km = _estimator(Store.create(str(root)), validation="v", val_batch_size=5).fit(df)
    assert set(km.getHistory()) == {"loss", "val_loss"}
    (val_dir,) = _data_dirs(str(root), "val")
    with open(os.path.join(root, val_dir + ".metadata.json")) as f:
        assert json.load(f)["rows"] == N // 4  # the rows where v is true
    root = tmp_path / "fraction"
    km = _estimator(Store.create(str(root)), validation=0.25).fit(df)
    assert len(km.getHistory()["val_loss"]) == 2
    rows = []
    for kind in ("train", "val"):
        (d,) = _data_dirs(str(root), kind)
        with open(os.path.join(root, d + ".metadata.json")) as f:
            rows.append(json.load(f)["rows"])
    assert sum(rows) == N and 20 <= rows[1] <= 80


@pytest.mark.slow
def test_sample_weights_cache_and_transformation_fn_match_numpy(spark, tmp_path):
    df = _frame(spark)
    root = tmp_path / "weights"
    km = _estimator(Store.create(str(root)), sample_weight_col="w").fit(df)
    shards = _rank_rows(str(root), 2, cols=("x", "y", "w"))
    w, b, hist = _reference(shards, 0.05, 8, 2, weights="w")
    np.testing.assert_allclose(km.getModel().get_weights()[0], w, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(km.getHistory()["loss"], hist, rtol=1e-4)

    root = tmp_path / "cache"
    km = _estimator(Store.create(str(root)), inmemory_cache_all=True, epochs=3).fit(df)
    w, b, _ = _reference(_rank_rows(str(root), 2), 0.05, 8, 3)
    np.testing.assert_allclose(km.getModel().get_weights()[0], w, rtol=1e-4, atol=1e-6)

    root = tmp_path / "transform"
    km = _estimator(Store.create(str(root)), transformation_fn=_halve_y).fit(df)
    shards = _rank_rows(str(root), 2)
    for s in shards:
        s["y"] = s["y"] / 2
    w, b, _ = _reference(shards, 0.05, 8, 2)
    np.testing.assert_allclose(km.getModel().get_weights()[0], w, rtol=1e-4, atol=1e-6)


def _halve_y(pdf):
    pdf["y"] = pdf["y"] / 2
    return pdf


class _Fail(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        import tfring

        if tfring.rank() == 1 and epoch == 1:
            raise RuntimeError("rank 1 fails on purpose")


class _HalfWrittenCheckpoint(keras.callbacks.ModelCheckpoint):
    """Rank 0's checkpoint writer dies halfway through its first file."""

    def on_epoch_end(self, epoch, logs=None):
        with open(self.filepath, "wb") as f:
            f.write(b"PK\x03\x04 half a zip")
        raise RuntimeError("checkpoint writer died")


@pytest.mark.slow
def test_a_failing_rank_is_named_and_leaves_no_complete_looking_checkpoint(spark, tmp_path):
    df = _frame(spark)
    store = Store.create(str(tmp_path / "store"))
    with pytest.raises(SparkJobError, match="rank 1 fails on purpose") as info:
        _estimator(store, run_id="f1", epochs=3, callbacks=[_Fail()]).fit(df)
    assert info.value.rank == 1
    # Rank 0 publishes each epoch's checkpoint after the epoch's metric
    # average, which rank 1 joins before it raises: the run's folder holds
    # rank 0's whole checkpoint after epoch 2 (it loads, and says so), and
    # nothing else that looks complete (a write the cancellation cut short
    # would be a hidden .tmp- file, removed by fit).
    from tfring.spark.keras import _serialize

    files = [f for f in store.list_files(store.get_run_path("f1"), recursive=True)
             if ".tmp-" not in f]
    assert files == [store.get_run_path("f1") + "/checkpoint.keras"]
    data = store.read(files[0])
    assert _serialize.read_tag(data)["epoch"] == 2
    _serialize.bytes_to_model(data)

    with pytest.raises(SparkJobError, match="checkpoint writer died") as info:
        _estimator(store, run_id="f2",
                   checkpoint_callback=_HalfWrittenCheckpoint("x.keras")).fit(df)
    assert info.value.rank == 0
    assert store.list_files(store.get_run_path("f2"), recursive=True) == []


@pytest.mark.slow
def test_two_inputs_two_outputs_and_vector_columns(spark, tmp_path):
    from pyspark.ml.feature import VectorAssembler

    i = F.col("id")
    df = spark.range(256).select(i, F.sin(i * 0.3).alias("p"), F.cos(i * 0.2).alias("q"),
                                 F.sin(i * 0.7).alias("r"), (i % 5).cast("double").alias("k"))
    df = VectorAssembler(inputCols=["p", "q"], outputCol="vec").transform(df)
    df = df.select("vec", F.array("r", "k", "p").alias("arr"),
                   (F.col("p") + F.col("r")).alias("t1"), F.array("q", "k").alias("t2"))
    a, b = keras.Input((2,)), keras.Input((3,))
    h = keras.layers.Concatenate()([a, b])
    model = keras.Model([a, b], [keras.layers.Dense(1, name="o1")(h),
                                 keras.layers.Dense(2, name="o2")(h)])
    km = KerasEstimator(num_proc=2, store=Store.create(str(tmp_path / "store")), model=model,
                        optimizer=keras.optimizers.Adam(0.01), loss=["mse", "mse"],
                        loss_weights=[1.0, 0.5], metrics=[["mae"], ["mae"]],
                        feature_cols=["vec", "arr"], label_cols=["t1", "t2"], batch_size=16,
                        epochs=3, verbose=0).fit(df)
    hist = km.getHistory()
    assert hist["loss"][-1] < hist["loss"][0]
    assert sorted(hist) == ["loss", "o1_loss", "o1_mae", "o2_loss", "o2_mae"]
    meta = km._get_metadata()
    assert meta["vec"]["spark_type"] == "vector" and meta["vec"]["shape"] == [2]
    assert meta["t2"] == {"spark_type": "array", "dtype": "float64", "shape": [2],
                          "sql_type": df.schema["t2"].dataType.json()}


@pytest.mark.slow
def test_the_example_runs(tmp_path):
    """examples/spark/keras_estimator.py as a user runs it (its own local
    Spark): fit, transform, save and load."""
    import re
    import subprocess

    script = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "spark",
                          "keras_estimator.py")
    out = subprocess.run([sys.executable, script, "--epochs", "2", "--rows", "1200",
                          "--work-dir", str(tmp_path / "work")], capture_output=True,
                         text=True, timeout=900, check=False)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    fitted = float(re.search(r"^test MAE: ([\d.]+)$", out.stdout, re.M).group(1))
    loaded = float(re.search(r"the loaded model's test MAE: ([\d.]+)$", out.stdout,
                             re.M).group(1))
    assert loaded == fitted and fitted < 1.0
    assert os.path.exists(tmp_path / "work" / "runs" / "example" / "checkpoint.keras")
