"""KerasEstimator as a Spark ML writable/readable stage, on spark_util's
shared session: save/load round trips of the params and the untrained
model (alone, through Spark's own metadata reader, inside a Pipeline and
on an fsspec filesystem), tfring's own callbacks (loaded again in a new
process and Spark session, without initialising tfring), and the values
that cannot be saved, refused at save naming them. No fit runs by default;
the slow tests fit a loaded estimator and a loaded Pipeline against the
original, and a loaded estimator with tfring's callbacks.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

pyspark = pytest.importorskip("pyspark", reason="pyspark is not installed (pip install pyspark)")
keras = pytest.importorskip("keras")

from pyspark.ml import Pipeline  # noqa: E402
from pyspark.ml.feature import VectorAssembler  # noqa: E402

from tfring.compression import Compression  # noqa: E402
from tfring.spark.common.backend import SparkBackend  # noqa: E402
from tfring.spark.common.store import Store  # noqa: E402
from tfring.spark.keras import KerasEstimator  # noqa: E402

pyspark.cloudpickle.register_pickle_by_value(sys.modules[__name__])

from spark_util import session  # noqa: E402


@pytest.fixture(scope="module")
def spark():
    return session()


def doubled_tanh(x):
    return 2.0 * keras.ops.tanh(x)


CUSTOM = {"doubled_tanh": doubled_tanh}


@keras.saving.register_keras_serializable(package="tfring_tests")
class StopAtLoss(keras.callbacks.Callback):
    """A callback Keras can serialize: get_config, from_config, registered."""

    def __init__(self, threshold=0.0):
        super().__init__()
        self.threshold = threshold

    def on_epoch_end(self, epoch, logs=None):
        if (logs or {}).get("loss", np.inf) < self.threshold:
            self.model.stop_training = True

    def get_config(self):
        return {"threshold": self.threshold}

    @classmethod
    def from_config(cls, config):  # (keras.callbacks.Callback has none)
        return cls(**config)


def _model():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, activation=doubled_tanh),
                              keras.layers.Dense(1)])
    rng = np.random.default_rng(5)
    model.set_weights([rng.standard_normal(w.shape).astype(w.dtype)
                       for w in model.get_weights()])
    return model


def _estimator(tmp_path, **kw):
    schedule = keras.optimizers.schedules.PiecewiseConstantDecay([4, 8], [0.1, 0.05, 0.01])
    args = dict(num_proc=2, store=Store.create(str(tmp_path / "store")), model=_model(),
                optimizer=keras.optimizers.SGD(schedule, momentum=0.9),
                loss=keras.losses.Huber(delta=0.5),
                metrics=["mae", keras.metrics.RootMeanSquaredError()],
                custom_objects=CUSTOM, feature_cols=["x"], label_cols=["y"], batch_size=8,
                epochs=3, validation=0.25, shuffle=64, random_seed=11, run_id="saved",
                label_shapes=[[1]], gradient_compression=Compression.fp16,
                callbacks=[StopAtLoss(0.01)], backend_env={"A": "1"}, verbose=0)
    args.update(kw)
    return KerasEstimator(**args)


def _comparable(name, value):
    """A param value in a form == compares: Keras objects as their
    configs, the store as its type and prefix."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if name == "store":
        return type(value), value.prefix_path
    if name == "gradient_compression":
        return value
    if isinstance(value, (list, tuple)):
        return [_comparable(name, v) for v in value]
    if isinstance(value, dict):
        return {k: _comparable(name, v) for k, v in value.items()}
    return type(value), keras.saving.serialize_keras_object(value)


def _assert_same_estimator(a, b):
    assert type(b) is KerasEstimator and b.uid == a.uid
    for p in a.params:
        if p.name == "model":
            continue
        assert b.isSet(p.name) == a.isSet(p), p.name
        assert b.hasDefault(p.name) == a.hasDefault(p), p.name
        if a.isDefined(p):
            assert (_comparable(p.name, b.getOrDefault(p.name))
                    == _comparable(p.name, a.getOrDefault(p))), p.name
    ma, mb = a.getModel(), b.getModel()
    assert mb.to_json() == ma.to_json()
    for x, y in zip(ma.get_weights(), mb.get_weights(), strict=True):
        assert x.dtype == y.dtype and np.array_equal(x, y)  # bit for bit


def test_save_load_round_trips_params_and_model(spark, tmp_path):
    est = _estimator(tmp_path)
    path = str(tmp_path / "est")
    est.save(path)
    assert sorted(os.listdir(path)) == ["metadata", "model.keras"]
    with pytest.raises(FileExistsError, match=r"already exists.*write\(\)\.overwrite\(\)"):
        est.save(path)
    est.write().overwrite().save(path)

    # Custom objects are recorded by name; without them the load says which.
    with pytest.raises(Exception, match=r"doubled_tanh.*custom_objects="):
        KerasEstimator.load(path)
    loaded = KerasEstimator.load(path, custom_objects=CUSTOM)
    _assert_same_estimator(est, loaded)
    assert loaded.getCustomObjects() == CUSTOM
    assert loaded.getStore() is not est.getStore()  # recreated from its prefix
    assert loaded.getCallbacks()[0].threshold == 0.01
    assert loaded.getGradientCompression() is Compression.fp16
    _assert_same_estimator(est, KerasEstimator.read(CUSTOM).load("file://" + path))

    with open(os.path.join(path, "metadata", "part-00000")) as f:  # Spark's layout
        meta = json.loads(f.readline())
    assert meta["class"] == "tfring.spark.keras.estimator.KerasEstimator"
    assert meta["paramMap"]["store"] == est.getStore().prefix_path
    assert meta["paramMap"]["gradient_compression"] == "fp16"
    assert meta["tfring"]["customObjects"] == {"doubled_tanh": f"{__name__}.doubled_tanh"}

    # As a Pipeline stage, beside a Java one: Spark's own readers load it
    # (DefaultParamsReader.loadMetadata, then KerasEstimator.load). Pipeline.load
    # takes no custom objects: they come from a custom_object_scope.
    assembler = VectorAssembler(inputCols=["a", "b", "c"], outputCol="x")
    Pipeline(stages=[assembler, est]).save(str(tmp_path / "pipe"))
    with keras.saving.custom_object_scope(CUSTOM):
        stages = Pipeline.load(str(tmp_path / "pipe")).getStages()
    assert [type(s) for s in stages] == [VectorAssembler, KerasEstimator]
    assert stages[0].getInputCols() == ["a", "b", "c"]
    _assert_same_estimator(est, stages[1])
    assert stages[1].getCustomObjects() == CUSTOM  # found in the scope

    pytest.importorskip("fsspec")
    est.save("memory://tfring-test/est")
    _assert_same_estimator(est, KerasEstimator.load("memory://tfring-test/est",
                                                    custom_objects=CUSTOM))


def test_what_cannot_be_saved_is_refused_naming_it(spark, tmp_path):
    path = str(tmp_path / "est")
    est = _estimator(tmp_path)
    est.save(path)
    # A callback Keras cannot serialize: refused before the folder is
    # touched, so the saved estimator stays whole.
    est.setCallbacks([StopAtLoss(0.5), keras.callbacks.EarlyStopping(patience=2)])
    with pytest.raises(ValueError, match=r"the callback EarlyStopping \(callbacks\[1\], "
                                         r"keras\.src\.callbacks\.early_stopping\."
                                         r"EarlyStopping\) cannot be saved.*get_config"):
        est.write().overwrite().save(path)
    assert [c.threshold for c in KerasEstimator.load(path, CUSTOM).getCallbacks()] == [0.01]
    with pytest.raises(ValueError, match=r"callback EarlyStopping \(callbacks\[1\]"):
        Pipeline(stages=[est]).save(str(tmp_path / "pipe"))

    est.setCallbacks([])
    est.setCheckpointCallback(keras.callbacks.ModelCheckpoint("x.keras"))
    with pytest.raises(ValueError, match=r"callback ModelCheckpoint \(checkpoint_callback"):
        est.save(str(tmp_path / "other"))
    est.setCheckpointCallback(None)
    est.setTransformationFn(lambda pdf: pdf)
    with pytest.raises(ValueError, match=r"the transformation_fn param .* cannot be saved"):
        est.save(str(tmp_path / "other"))
    est.setTransformationFn(None)
    est.setGradientCompression(Compression.powersgd())
    with pytest.raises(ValueError, match="gradient_compression .* cannot be saved"):
        est.save(str(tmp_path / "other"))
    assert not os.path.exists(tmp_path / "other")

    # The backend is not saved (it holds a live SparkContext), and says so.
    est = _estimator(tmp_path, num_proc=None, backend=SparkBackend(num_proc=2))
    with pytest.warns(UserWarning, match="the backend is not saved"):
        est.save(str(tmp_path / "with_backend"))
    loaded = KerasEstimator.load(str(tmp_path / "with_backend"), CUSTOM)
    assert loaded.getBackend() is None and loaded.getNumProc() is None


def _tfring_callbacks():
    """tfring's own callbacks, with arguments other than their defaults, and
    a BestModelCheckpoint for checkpoint_callback."""
    from tfring.keras import callbacks as tkc

    return ([tkc.MetricAverageCallback(device="/cpu:0"),
             tkc.LearningRateWarmupCallback(0.05, warmup_epochs=1, verbose=1),
             tkc.LearningRateScheduleCallback(0.05, 0.5, start_epoch=1, end_epoch=3),
             tkc.BroadcastGlobalVariablesCallback(0, device="/cpu:0")],
            tkc.BestModelCheckpoint(monitor="loss", mode="min"))


# Loads a saved estimator in a new process and a new Spark session, where
# nothing has imported tfring.keras (the loader registers tfring's
# callbacks), and prints its callbacks' Keras configs and whether tfring
# was initialised.
_LOAD_FRESH = r"""
import json, sys
sys.path[:0] = sys.argv[2:4]  # tests/spark, tests
import keras
import spark_util
spark = spark_util.session()
import tfring
import test_estimator_persistence as t
from tfring.spark.keras import KerasEstimator
imported = "tfring.keras.callbacks" in sys.modules
est = KerasEstimator.load(sys.argv[1], custom_objects=t.CUSTOM)
print("RESULT " + json.dumps({
    "imported_before_load": imported,
    "initialized": tfring.is_initialized(),
    "callbacks": [keras.saving.serialize_keras_object(c) for c in est.getCallbacks()],
    "checkpoint_callback": keras.saving.serialize_keras_object(est.getCheckpointCallback()),
}))
"""


def _saved_with_tfring_callbacks(tmp_path):
    """An estimator holding tfring's callbacks (and a BestModelCheckpoint),
    saved: (estimator, checkpoint callback, path)."""
    callbacks, best = _tfring_callbacks()
    est = _estimator(tmp_path, callbacks=[StopAtLoss(0.01), *callbacks],
                     checkpoint_callback=best)
    path = str(tmp_path / "est")
    est.save(path)
    return est, best, path


def test_tfring_callbacks_save_and_load_with_equal_configs(spark, tmp_path):
    import tfring

    est, best, path = _saved_with_tfring_callbacks(tmp_path)
    with open(os.path.join(path, "metadata", "part-00000")) as f:
        saved = json.loads(f.readline())["paramMap"]
    assert [c["__keras_config__"]["registered_name"] for c in saved["callbacks"]] == [
        "tfring_tests>StopAtLoss", "tfring>MetricAverageCallback",
        "tfring>LearningRateWarmupCallback", "tfring>LearningRateScheduleCallback",
        "tfring>BroadcastGlobalVariablesCallback"]

    loaded = KerasEstimator.load(path, CUSTOM)  # (this process: configs compared)
    _assert_same_estimator(est, loaded)
    assert [type(c) for c in loaded.getCallbacks()] == [type(c) for c in est.getCallbacks()]
    assert loaded.getCallbacks()[3].multiplier(3) == 0.25  # 0.5 ** (3 - 1)
    if not tfring.is_initialized():  # (an earlier test in this process may have)
        est.save(str(tmp_path / "again"))
        KerasEstimator.load(str(tmp_path / "again"), CUSTOM)
        assert not tfring.is_initialized()


@pytest.mark.slow
def test_tfring_callbacks_load_in_a_fresh_process_and_session(spark, tmp_path):
    # A new process (its own JVM, about 30 s): loading imports tfring's
    # callbacks itself and does not start the runtime.
    est, best, path = _saved_with_tfring_callbacks(tmp_path)
    here = os.path.dirname(os.path.abspath(__file__))
    env = {**os.environ, "TFRING_TEST_SPARK_MASTER": "local[1]"}
    proc = subprocess.run([sys.executable, "-c", _LOAD_FRESH, path, here, os.path.dirname(here)],
                          env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads([x for x in proc.stdout.splitlines() if x.startswith("RESULT ")][-1][7:])
    assert out["imported_before_load"] is False
    assert out["initialized"] is False  # loading does not start the runtime
    assert out["callbacks"] == [keras.saving.serialize_keras_object(c)
                                for c in est.getCallbacks()]
    assert out["checkpoint_callback"] == keras.saving.serialize_keras_object(best)


def test_a_tfring_callback_with_a_callable_argument_is_refused_naming_it(spark, tmp_path):
    from tfring.keras import callbacks as tkc

    est = _estimator(tmp_path, callbacks=[
        tkc.MetricAverageCallback(),
        tkc.LearningRateScheduleCallback(0.1, lambda epoch: 0.5 ** epoch)])
    with pytest.raises(ValueError, match=r"the callback LearningRateScheduleCallback "
                                         r"\(callbacks\[1\], tfring\.keras\.callbacks\."
                                         r"LearningRateScheduleCallback\) cannot be saved: .*"
                                         r"its multiplier argument .* Python callable.*"
                                         r"setCallbacks"):
        est.save(str(tmp_path / "est"))
    assert not os.path.exists(tmp_path / "est")


def _frame(spark, n=96):
    from pyspark.sql import functions as F

    i = F.col("id")
    a, b, c = F.sin(i * 0.37), F.cos(i * 0.11), (i % 7) / 7.0 - 0.5
    return spark.range(n).select(a.alias("a"), b.alias("b"), c.alias("c"),
                                 F.array(a, b, c).alias("x"),
                                 (1.5 * a - 2.0 * b + 0.5 * c).alias("y"))


@pytest.mark.slow
def test_a_loaded_estimator_and_pipeline_fit_as_the_originals(spark, tmp_path):
    df = _frame(spark)
    kw = dict(shuffle=False, validation=None, epochs=2, partitions_per_process=2,
              gradient_compression=None)
    est = _estimator(tmp_path, run_id="original", **kw)
    est.save(str(tmp_path / "est"))
    loaded = KerasEstimator.load(str(tmp_path / "est"), CUSTOM).setRunId("loaded")
    a, b = est.fit(df), loaded.fit(df)
    for x, y in zip(a.getModel().get_weights(), b.getModel().get_weights(), strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(a.getHistory()["loss"], b.getHistory()["loss"], rtol=1e-6)

    # A loaded Pipeline (assembler, estimator) fits and transforms. (Each
    # fit of a Pipeline writes its assembled rows to Parquet afresh, and the
    # files' row order may differ between writes, so the weights are not
    # compared with the original Pipeline's.)
    assembler = VectorAssembler(inputCols=["a", "b", "c"], outputCol="v")
    Pipeline(stages=[assembler, _estimator(tmp_path, run_id="pipe", feature_cols=["v"], **kw)]
             ).save(str(tmp_path / "pipe"))
    with keras.saving.custom_object_scope(CUSTOM):
        again = Pipeline.load(str(tmp_path / "pipe"))
    fitted = again.fit(df)
    km = fitted.stages[1]
    assert km.getRunId() == "pipe" and len(km.getHistory()["loss"]) == 2
    assert km.getModel().get_config() == again.getStages()[1].getModel().get_config()
    pred = np.array([r[0] for r in fitted.transform(df).select("y__output").collect()])
    assert pred.shape == (96,) and np.isfinite(pred).all()


@pytest.mark.slow
def test_a_loaded_estimator_trains_with_equal_tfring_callbacks(spark, tmp_path):
    df = _frame(spark)
    callbacks, best = _tfring_callbacks()
    est = _estimator(tmp_path, run_id="tfring_cbs", optimizer=keras.optimizers.SGD(0.05),
                     callbacks=callbacks, checkpoint_callback=best, shuffle=False,
                     validation=None, epochs=3, partitions_per_process=2,
                     gradient_compression=None)
    est.save(str(tmp_path / "est"))
    loaded = KerasEstimator.load(str(tmp_path / "est"), CUSTOM).setRunId("tfring_cbs_loaded")
    a, b = est.fit(df), loaded.fit(df)
    for x, y in zip(a.getModel().get_weights(), b.getModel().get_weights(), strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-7)
    ha, hb = a.getHistory(), b.getHistory()
    assert sorted(ha) == sorted(hb) and {"lr", "learning_rate"} <= set(ha)
    for key in ha:
        np.testing.assert_allclose(ha[key], hb[key], rtol=1e-6)
