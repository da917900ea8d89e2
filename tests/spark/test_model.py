"""tfring.spark.keras.KerasModel: transform on a real Spark against the Keras
model's own predict, output column types, persistence.

The module's transforms share the run's SparkSession (spark_util) and so
its Python workers: TensorFlow is imported once per worker and later
transforms reuse it. Each DataFrame comes from `parallelize(rows, 2)`, so
its partitions, and with them the batches the model sees, are the same in
any session, which lets predictions compare bit for bit across sessions.
"""

import json
import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

pyspark = pytest.importorskip("pyspark", reason="pyspark is not installed (pip install pyspark)")
keras = pytest.importorskip("keras")

from pyspark.ml.linalg import DenseVector, Vectors, VectorUDT  # noqa: E402
from pyspark.sql import types as T  # noqa: E402

from spark_util import session  # noqa: E402
from tfring.spark.keras.model import KerasModel  # noqa: E402

# The custom activation below reaches the executors inside the transform's
# closure: ship this module's functions by value.
pyspark.cloudpickle.register_pickle_by_value(sys.modules[__name__])

ROWS = 60
DEADLINE_S = 300


@pytest.fixture(scope="module")
def spark():
    return session()


def scaled_tanh(x):
    return 2.0 * keras.ops.tanh(x)


def _metadata(df, kinds):
    """The estimator's _metadata for `df`'s columns (kind, dtype, shape)."""
    return {c: {"spark_type": k, "dtype": d, "shape": s, "sql_type": df.schema[c].dataType.json()}
            for c, (k, d, s) in kinds.items()}


def _data():
    """Columns of a multi-input, multi-output problem, as numpy arrays."""
    rng = np.random.default_rng(7)
    return {"vec": rng.standard_normal((ROWS, 4)),          # -> input (4,)
            "arr": rng.standard_normal((ROWS, 6)).astype(np.float32),  # -> input (2, 3)
            "num": rng.integers(0, 5, ROWS)}                 # -> input (1,)


def _multi_model():
    keras.utils.set_random_seed(3)
    a = keras.Input((4,), name="a")
    b = keras.Input((2, 3), name="b")
    c = keras.Input((1,), name="c")
    h = keras.layers.Concatenate()([a, keras.layers.Flatten()(b), c])
    h = keras.layers.Dense(16, activation=scaled_tanh)(h)
    outs = [keras.layers.Dense(1, name="score")(h),               # scalar double label
            keras.layers.Dense(3, name="probs")(h),               # vector label
            keras.layers.Reshape((2, 2))(keras.layers.Dense(4)(h)),  # array<float> label
            keras.layers.Dense(1, name="count")(h)]               # scalar long label
    return keras.Model([a, b, c], outs)


def _frame(spark, data):
    schema = T.StructType([
        T.StructField("id", T.LongType()), T.StructField("vec", VectorUDT()),
        T.StructField("arr", T.ArrayType(T.FloatType())), T.StructField("num", T.LongType()),
        T.StructField("name", T.StringType()), T.StructField("score", T.DoubleType()),
        T.StructField("probs", VectorUDT()), T.StructField("grid", T.ArrayType(T.FloatType())),
        T.StructField("count", T.LongType())])
    rows = []
    for i in range(ROWS):
        vec = (Vectors.dense(data["vec"][i]) if i % 2 else  # sparse vectors too
               Vectors.sparse(4, {j: float(v) for j, v in enumerate(data["vec"][i])}))
        rows.append((i, vec, [float(v) for v in data["arr"][i]], int(data["num"][i]), f"r{i}",
                     0.5, Vectors.dense([0.0, 1.0, 0.0]), [0.0] * 4, 3))
    return spark.createDataFrame(spark.sparkContext.parallelize(rows, 2), schema)


def _keras_model(spark, data=None):
    data = data or _data()
    df = _frame(spark, data)
    meta = _metadata(df, {"vec": ("vector", "float64", [4]), "arr": ("array", "float32", [6]),
                          "num": ("scalar", "int64", []), "score": ("scalar", "float64", []),
                          "probs": ("vector", "float64", [3]),
                          "grid": ("array", "float32", [4]), "count": ("scalar", "int64", [])})
    model = KerasModel(history={"loss": [0.5, 0.25]}, model=_multi_model(),
                       feature_columns=["vec", "arr", "num"],
                       label_columns=["score", "probs", "grid", "count"],
                       custom_objects={"scaled_tanh": scaled_tanh}, run_id="run-1",
                       _metadata=meta)
    return model, df, data


def _predict(model, data):
    """The Keras model's own predictions for every row, in one process."""
    return model.predict([data["vec"], data["arr"].reshape(-1, 2, 3),
                          data["num"].reshape(-1, 1).astype(np.float32)], verbose=0)


def _columns(rows, names):
    return {n: [r[n] for r in rows] for n in names}


def test_transform_matches_predict_with_typed_outputs(spark):
    km, df, data = _keras_model(spark)
    out = km.transform(df)
    # Every input column, then one output column per label typed by it.
    assert out.columns == df.columns + ["score__output", "probs__output", "grid__output",
                                        "count__output"]
    types = {f.name: f.dataType for f in out.schema.fields}
    assert types["score__output"] == T.DoubleType()
    assert isinstance(types["probs__output"], VectorUDT)
    assert types["grid__output"] == T.ArrayType(T.FloatType())
    assert types["count__output"] == T.LongType()

    rows = out.collect()
    want = _predict(km.getModel(), data)
    got = _columns(rows, out.columns)
    assert got["id"] == list(range(ROWS))  # each partition's rows in order
    assert got["name"] == [f"r{i}" for i in range(ROWS)]
    assert all(isinstance(v, DenseVector) for v in got["probs__output"])
    np.testing.assert_allclose(got["score__output"], want[0][:, 0], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(np.stack([v.toArray() for v in got["probs__output"]]), want[1],
                               rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(np.array(got["grid__output"]), want[2].reshape(ROWS, 4),
                               rtol=1e-6, atol=1e-6)
    # An integer label takes the prediction rounded.
    assert got["count__output"] == [int(v) for v in np.rint(want[3][:, 0])]

    # A single-input, single-output model, the output renamed.
    keras.utils.set_random_seed(5)
    inp = keras.Input((4,))
    one = keras.Model(inp, keras.layers.Dense(2)(inp))
    km1 = KerasModel(model=one, feature_columns=["vec"], label_columns=["probs"],
                     _metadata={"probs": {"spark_type": "array", "dtype": "float64",
                                          "shape": [2], "sql_type": '{"type":"array",'
                                          '"elementType":"double","containsNull":true}'}})
    km1.setOutputCols(["p"])
    got1 = km1.transform(df.select("id", "vec")).collect()
    assert [r["id"] for r in got1] == list(range(ROWS))
    np.testing.assert_allclose(np.array([r["p"] for r in got1]),
                               one.predict(data["vec"], verbose=0), rtol=1e-6, atol=1e-6)


def test_clear_errors_before_any_job(spark):
    km, df, _ = _keras_model(spark)
    with pytest.raises(ValueError, match=r"feature column\(s\) \['num'\] not in the DataFrame"):
        km.transform(df.drop("num"))
    with pytest.raises(ValueError, match=r"output column\(s\) \['score__output'\] already"):
        km.transform(df.withColumn("score__output", df["score"]))
    with pytest.raises(ValueError, match=r"3 input\(s\) but 2 feature column"):
        km.copy({km.feature_columns: ["vec", "arr"]}).transform(df)
    with pytest.raises(ValueError, match=r"4 output\(s\) but 1 label column"):
        km.copy({km.label_columns: ["score"], km.outputCols: ["s"]}).transform(df)


def test_model_key_ignores_the_time_of_saving():
    # One model saved twice (metadata.json records when) has one cache key,
    # so its transforms share a broadcast and each worker loads it once.
    from tfring.spark.keras import _predict

    model = _multi_model()
    a = _predict.model_bytes(model)
    time.sleep(1.1)
    b = _predict.model_bytes(model)
    assert a != b and _predict.model_key(a, None, None) == _predict.model_key(b, None, None)
    model.get_layer("count").kernel.assign(model.get_layer("count").kernel + 1.0)
    assert _predict.model_key(_predict.model_bytes(model), None, None) != \
        _predict.model_key(a, None, None)


def _assert_same_model(a, b):
    assert type(b) is KerasModel and b.uid == a.uid
    for name in ("getHistory", "getFeatureColumns", "getLabelColumns", "getOutputCols",
                 "getRunId", "_get_metadata"):
        assert getattr(b, name)() == getattr(a, name)(), name
    for x, y in zip(a.getModel().get_weights(), b.getModel().get_weights(), strict=True):
        assert x.dtype == y.dtype and np.array_equal(x, y)


def test_save_load_overwrite(spark, tmp_path):
    km, df, _ = _keras_model(spark)
    km.setOutputCols(["s", "p", "g", "c"])
    path = str(tmp_path / "km")
    km.save(path)
    assert sorted(os.listdir(path)) == ["metadata", "model.keras"]
    with pytest.raises(FileExistsError, match=r"already exists.*write\(\)\.overwrite\(\)"):
        km.save(path)
    with pytest.raises(FileExistsError, match="already exists"):
        km.write().save(path)
    km.write().overwrite().save(path)
    # Custom objects are recorded by name; without them the load says which.
    with pytest.raises(Exception, match=r"scaled_tanh.*custom_objects="):
        KerasModel.load(path)
    objs = {"scaled_tanh": scaled_tanh}
    loaded = KerasModel.load(path, custom_objects=objs)
    _assert_same_model(km, loaded)
    _assert_same_model(km, KerasModel.read(objs).load("file://" + path))
    assert loaded.getCustomObjects() == objs

    # Spark's own readers read the folder: a Pipeline holding it loads.
    from pyspark.ml import PipelineModel
    from pyspark.ml.util import DefaultParamsReader
    meta = DefaultParamsReader.loadMetadata(path, spark)
    assert meta["class"] == "tfring.spark.keras.model.KerasModel"
    assert meta["paramMap"]["run_id"] == "run-1"
    PipelineModel([km]).save(str(tmp_path / "pipe"))
    with keras.saving.custom_object_scope(objs):  # (a Pipeline's load takes no arguments)
        stage = PipelineModel.load(str(tmp_path / "pipe")).stages[0]
    _assert_same_model(km, stage)
    assert stage.getCustomObjects() == objs  # found in the scope, for transform to ship

    # Any fsspec filesystem: here fsspec's in-memory one.
    pytest.importorskip("fsspec")
    km.save("memory://tfring-test/km")
    _assert_same_model(km, KerasModel.load("memory://tfring-test/km", custom_objects=objs))

    # The loaded model predicts bit for bit as the saved one.
    cols = ["id", "s", "p", "g", "c"]
    assert (km.transform(df).select(cols).collect()
            == loaded.transform(df).select(cols).collect())


_CHILD = textwrap.dedent("""
    import json, os, sys
    here = os.environ["TFRING_TEST_DIR"]
    sys.path[:0] = [here, os.path.dirname(here)]
    import numpy as np
    from pyspark.sql import SparkSession
    import test_model as t
    from tfring.spark.keras.model import KerasModel

    spark = (SparkSession.builder.master("local[2]").appName("tfring-load-test")
             .config("spark.ui.enabled", "false").getOrCreate())
    km = KerasModel.load(sys.argv[1], custom_objects={"scaled_tanh": t.scaled_tanh})
    rows = km.transform(t._frame(spark, t._data())).collect()
    out = {c: np.array([r[c].toArray() if hasattr(r[c], "toArray") else r[c] for r in rows])
           for c in km.getOutputCols()}
    np.savez(sys.argv[2], **out)
    print(json.dumps({"run_id": km.getRunId(), "outputs": km.getOutputCols()}))
    spark.stop()
""")


@pytest.mark.slow
def test_load_in_a_new_process_and_session(spark, tmp_path):
    # Saved here, loaded by a fresh Python with its own local Spark: the
    # same rows, in the same partitions, predict bit for bit the same.
    km, df, _ = _keras_model(spark)
    path = str(tmp_path / "km")
    km.save(path)
    rows = km.transform(df).collect()
    del km
    env = dict(os.environ, TFRING_TEST_DIR=os.path.dirname(os.path.abspath(__file__)))
    env["PYSPARK_PYTHON"] = sys.executable
    r = subprocess.run([sys.executable, "-c", _CHILD, path, str(tmp_path / "out.npz")],
                       env=env, capture_output=True, text=True, timeout=DEADLINE_S)
    assert r.returncode == 0, r.stderr[-3000:]
    info = json.loads(r.stdout.strip().splitlines()[-1])
    assert info == {"run_id": "run-1", "outputs": ["score__output", "probs__output",
                                                   "grid__output", "count__output"]}
    got = np.load(tmp_path / "out.npz")
    for c in info["outputs"]:
        here = np.array([r[c].toArray() if hasattr(r[c], "toArray") else r[c] for r in rows])
        assert here.dtype == got[c].dtype and np.array_equal(here, got[c]), c


@pytest.mark.slow
def test_null_feature_is_named(spark):
    # Seen on the executors; the failed Python workers are replaced (their
    # successors import TensorFlow again, hence slow).
    from pyspark.sql import functions as F

    km, df, _ = _keras_model(spark)
    holes = df.withColumn("num", F.when(df["id"] == 3, None).otherwise(df["num"]))
    with pytest.raises(Exception, match=r"feature column 'num' holds null values"):
        km.transform(holes).collect()


@pytest.mark.slow
def test_fit_then_transform_and_save(spark, tmp_path):
    # The KerasModel that KerasEstimator.fit returns (a compiled model, its
    # _metadata from the training DataFrame) predicts as its Keras model
    # does, and saves and loads with its optimizer.
    from pyspark.ml.feature import VectorAssembler
    from pyspark.sql import functions as F

    from tfring.spark.common.store import Store
    from tfring.spark.keras import KerasEstimator

    i = F.col("id")
    df = spark.range(128).select(i, F.sin(i * 0.3).alias("p"), F.cos(i * 0.2).alias("q"),
                                 (F.sin(i * 0.3) * 2 + 1).alias("y"))
    df = VectorAssembler(inputCols=["p", "q"], outputCol="vec").transform(df).select(
        "id", "vec", "y", F.array("p", "q").alias("pq"))
    keras.utils.set_random_seed(1)
    inp = keras.Input((2,))
    est = KerasEstimator(num_proc=2, store=Store.create(str(tmp_path / "store")),
                         model=keras.Model(inp, keras.layers.Dense(1)(inp)),
                         optimizer=keras.optimizers.Adam(0.01), loss="mse",
                         feature_cols=["vec"], label_cols=["y"], batch_size=16, epochs=2,
                         verbose=0)
    km = est.fit(df)
    rows = km.transform(df).orderBy("id").collect()
    x = np.array([r["vec"].toArray() for r in rows])
    got = np.array([r["y__output"] for r in rows])
    assert km.transform(df).schema["y__output"].dataType == T.DoubleType()
    np.testing.assert_allclose(got, km.getModel().predict(x, verbose=0)[:, 0], rtol=1e-6,
                               atol=1e-6)
    km.save(str(tmp_path / "km"))
    loaded = KerasModel.load(str(tmp_path / "km"))
    assert loaded.getModel().optimizer is not None
    _assert_same_model(km, loaded)
