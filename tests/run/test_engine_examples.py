"""Horovod's Spark and Ray examples with only their imports changed
(examples/horovod_style_spark.py, examples/horovod_style_ray.py), run as a
user runs them: against a real Spark (local-cluster: two executor JVMs on
this host) and a real local Ray. Their results are checked against
references computed here: the ranks' own metrics averaged in numpy, the
returned checkpoint evaluated in numpy float64, the warm-up schedule's
learning rate, and the trained model's accuracy on fresh data.

Both start an engine (Spark ~20-30 s, Ray ~10 s) and train a small Keras
model in two ranks, so both are slow.
"""

import hashlib
import importlib.util
import json
import os
import re
import shutil
import sys

import numpy as np
import pytest

from tf_util import run_example, tf_available

needs_tf = pytest.mark.skipif(not tf_available(), reason="needs TensorFlow and tfring's op library")

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
EXAMPLES = os.path.join(ROOT, "examples")
TIMEOUT = 500


def _run(script, args, cwd, env=None):
    env = dict(os.environ, PYTHONUNBUFFERED="1", TF_CPP_MIN_LOG_LEVEL="2",
               PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]),
               **(env or {}))
    return run_example(script, args, cwd, env, TIMEOUT)


def _example(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(EXAMPLES, name + ".py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # defines functions; main runs under __main__ only
    return module


# ------------------------------------------------------------------ Spark --

def _bn(x, gamma, beta, mean, var, eps=1e-3):
    return gamma * (x - mean) / np.sqrt(var + eps) + beta


def _forward(model, ex, table, max_sales):
    """The Rossmann-style model of horovod_style_spark.py in float64 numpy,
    in inference mode (dropout off, batch normalization's moving
    statistics): log sales predicted from the columns of ``table``."""
    import keras

    cols = {c: np.asarray(table.column(c).to_numpy(), np.float64) for c in ex.all_cols}
    parts = [np.asarray(model.get_layer("emb_" + c).get_weights()[0], np.float64)
             [cols[c].astype(np.int64)] for c in ex.categorical_cols]
    bn = next(layer for layer in model.layers
              if isinstance(layer, keras.layers.BatchNormalization))
    gamma, beta, mean, var = (np.asarray(w, np.float64) for w in bn.get_weights())
    cont = np.stack([cols[c] for c in ex.continuous_cols], axis=1)
    h = np.concatenate(parts + [_bn(cont, gamma, beta, mean, var, bn.epsilon)], axis=1)
    dense = [layer for layer in model.layers if isinstance(layer, keras.layers.Dense)]
    for layer in dense[:-1]:
        w, b = (np.asarray(v, np.float64) for v in layer.get_weights())
        h = np.maximum(h @ w + b, 0.0)
    w, b = (np.asarray(v, np.float64) for v in dense[-1].get_weights())
    return (1.0 / (1.0 + np.exp(-(h @ w + b)))) * np.log(max_sales) * 1.2


def _rmspe(log_true, log_pred):
    """The example's exp_rmspe of one batch. Its labels have shape (batch,)
    and the predictions (batch, 1), so (in Horovod's example as here) the
    metric's arithmetic broadcasts to (batch, batch): every label against
    every prediction of the batch."""
    t, p = log_true[None, :], log_pred[:, None]
    pct = ((np.exp(t) - np.exp(p)) / np.exp(t)) ** 2
    keep = np.broadcast_to(t > 0.001, pct.shape)
    return np.sqrt(pct[keep].sum() / keep.sum())


@needs_tf
@pytest.mark.slow
def test_horovod_spark_rossmann_run_example(tmp_path):
    pytest.importorskip("pyspark", reason="pyspark is not installed")
    if not (os.environ.get("JAVA_HOME") or shutil.which("java")):
        pytest.skip("Spark needs Java 17+ (no `java` on the PATH)")
    import keras
    import pyarrow.parquet as pq

    import tfring.spark

    batch, epochs, size = 50, 4, 2
    ckpt = tmp_path / "best.keras"
    out = _run("horovod_style_spark.py", [
        "--training-master", "local-cluster[2,1,1024]", "--num-proc", str(size),
        "--epochs", str(epochs), "--rows", "2000", "--width", "32",
        "--batch-size", str(batch), "--learning-rate", "0.002",
        "--data-dir", f"file://{tmp_path}", "--local-checkpoint-file", str(ckpt)],
        tmp_path, env={"PYSPARK_PYTHON": sys.executable})

    digests = dict(re.findall(r"rank (\d) trainable weights sha256 (\w+)", out))
    assert sorted(digests) == ["0", "1"], out[-3000:]
    assert len(set(digests.values())) == 1, f"the ranks' models differ: {digests}"

    # MetricAverageCallback: the history the driver got back is, epoch by
    # epoch, the mean of the ranks' own metrics.
    own = {}
    for m in re.finditer(r'(\{"rank": \d.*\})\s*$', out, re.M):
        row = json.loads(m.group(1))
        own[(row["rank"], row["epoch"])] = row
    assert sorted(own) == [(r, e) for r in range(size) for e in range(epochs)], sorted(own)
    history = json.loads(re.search(r"^HISTORY (.*)$", out, re.M).group(1))
    for key in ("loss", "exp_rmspe", "val_loss", "val_exp_rmspe"):
        want = [np.mean([own[(r, e)][key] for r in range(size)]) for e in range(epochs)]
        np.testing.assert_allclose(history[key], want, rtol=1e-5, err_msg=key)
    assert history["loss"][-1] < history["loss"][0]

    # The checkpoint rank 0 kept (save_best_only on the averaged metric),
    # evaluated here in float64 on rank 0's validation shard, batch by batch
    # as Keras does, gives rank 0's own metric of the best epoch.
    best = int(np.argmin(history["val_exp_rmspe"]))
    ex = _example("horovod_style_spark")
    model = keras.models.load_model(str(ckpt), compile=False, custom_objects={
        "exp_rmspe": lambda t, p: p, "act_sigmoid_scaled": lambda x: x})
    train = pq.read_table(str(tmp_path / "train_df.parquet"))
    max_sales = float(np.max(train.column("Sales").to_numpy()))
    val = tfring.spark.read_shard(str(tmp_path / "val_df.parquet"), rank=0, size=size)
    val_rows = pq.read_table(str(tmp_path / "val_df.parquet")).num_rows
    steps = int(val_rows / batch / size)
    pred = _forward(model, ex, val, max_sales)[:, 0]
    log_true = np.log(np.asarray(val.column("Sales").to_numpy(), np.float64))
    per_batch = [_rmspe(log_true[i * batch:(i + 1) * batch], pred[i * batch:(i + 1) * batch])
                 for i in range(steps)]
    np.testing.assert_allclose(np.mean(per_batch), own[(0, best)]["val_exp_rmspe"], rtol=2e-4)
    mae = np.mean(np.abs(log_true[:steps * batch] - pred[:steps * batch]))
    l2 = 0.00005 * sum(float(np.sum(np.asarray(layer.get_weights()[0], np.float64) ** 2))
                       for layer in model.layers if isinstance(layer, keras.layers.Dense)
                       and layer.kernel_regularizer is not None)
    np.testing.assert_allclose(mae + l2, own[(0, best)]["val_loss"], rtol=2e-4)


# -------------------------------------------------------------------- Ray --

@needs_tf
@pytest.mark.slow
def test_horovod_ray_tensorflow2_mnist_example(tmp_path):
    pytest.importorskip("ray", reason="ray is not installed")
    import tfring.keras

    size, epochs, warmup = 2, 2, 3
    out = _run("horovod_style_ray.py", [
        "--num-hosts", "1", "--num-workers-per-host", str(size), "--cpus-per-worker", "1",
        "--num-epochs", str(epochs), "--steps", "60", "--batch-size", "32",
        "--checkpoint-dir", str(tmp_path)], tmp_path)
    got = json.loads(re.findall(r"^(\{\"ranks\".*\})$", out, re.M)[-1])
    assert got["ranks"] == size
    assert got["loss"][-1] < got["loss"][0], got["loss"]
    # Goyal et al.'s warm-up, as Horovod defines it: from lr to lr * size
    # over `warmup` epochs, linearly; after `epochs` of them:
    base = 0.001
    np.testing.assert_allclose(got["learning_rate"],
                               base * (1 + (size - 1) * epochs / warmup), rtol=1e-6)
    # Only rank 0 wrote checkpoints, one per epoch; the last is the model
    # every rank ended with.
    assert sorted(os.listdir(tmp_path)) == [f"checkpoint-{e}.keras" for e in (1, 2)]
    model = tfring.keras.load_model(str(tmp_path / "checkpoint-2.keras"))
    digest = hashlib.sha256(b"".join(np.ascontiguousarray(w).tobytes()
                                     for w in model.get_weights())).hexdigest()
    assert digest == got["weights_sha256"]
    # It learned: on digits neither rank saw, far above chance (0.1).
    images, labels = _example("horovod_style_ray").synthetic_mnist(seed=99, n=500)
    probs = model.predict(images[..., None].astype(np.float32) / 255.0, verbose=0)
    assert np.mean(np.argmax(probs, axis=1) == labels) > 0.5
