"""Horovod's Keras API on tfring (`import tfring.keras as hvd`), each
check against a single-process reference on the full batch:

* SyncBatchNormalization on 2 and 4 ranks: outputs, input and gamma/beta
  gradients, moving statistics and inference with uneven local batches
  equal BatchNormalization on the concatenated batch (atol 1e-4, float32
  sums of squares); in fit, the weights and predictions equal one process
  with BatchNormalization on the full batch (2e-5);
* backward_passes_per_step=4 equals one step on the 4x batch, for the sum
  (Horovod's default: the same step at 4x the learning rate) and the
  average, in fit, in a custom loop eagerly and in tf.function, and with
  DistributedGradientTape; optimizer.iterations advances every pass;
* tfring.DistributedOptimizer(keras_optimizer) with Horovod's keywords;
* PartialDistributedGradientTape / PartialDistributedOptimizer leave the
  local layers' gradients unreduced;
* LearningRateScheduleCallback, BestModelCheckpoint, load_model and
  broadcast_global_variables;
* the tf_keras (tfring.keras.legacy) variants, when tf_keras is installed.

Tolerances: float32 weights after a few SGD steps, 2e-5 absolute.
"""

import os
import sys

import pytest

from tf_util import JOB_TIMEOUT, RANK_ENV, run_example, tf_available

TESTS = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))

pytestmark = pytest.mark.skipif(
    not tf_available("keras"),
    reason="TensorFlow, Keras or tfring's op library (_tfring_ops.so) missing")

CHECKS_2 = [
    "syncbn_layer_uneven", "syncbn_fit", "accumulate_fit_sum",
    "accumulate_fit_average", "accumulate_custom_loop_sum",
    "accumulate_custom_loop_average", "tfring_distributed_optimizer_keras",
    "partial_tape", "partial_optimizer_fit", "lr_schedule",
    "best_model_checkpoint", "load_model", "broadcast_global_variables",
    "legacy_accumulate_fit", "legacy_syncbn_and_callbacks",
]

_jobs = {}


def job(size, mode, tmp_path_factory):
    key = (size, mode)
    if key not in _jobs:
        sys.path.insert(0, TESTS)
        from multiproc import run_ranks

        shared = tmp_path_factory.mktemp(f"hvd_keras_{size}")
        _jobs[key] = run_ranks(size, "hvd_keras.py", [str(shared), mode],
                               env=RANK_ENV, timeout=JOB_TIMEOUT * 2)
    return _jobs[key]


def outcome(results, check):
    from multiproc import rank_results

    outs = rank_results(results, check)
    for rank, out in enumerate(outs):
        assert out["ok"], f"rank {rank}: {out.get('error')}"
        if "skipped" in out:
            pytest.skip(out["skipped"])
        assert out["max_diff"] <= out["tol"], (
            f"rank {rank}: {check} differs from the single-process "
            f"reference by {out['max_diff']:.3g} (tolerance {out['tol']})")
    return outs


@pytest.mark.parametrize("check", CHECKS_2)
def test_two_ranks(check, tmp_path_factory):
    outs = outcome(job(2, "all", tmp_path_factory), check)
    if "digest" in outs[0]:
        assert len({o["digest"] for o in outs}) == 1, "ranks differ"
    if check.startswith("accumulate_fit"):
        # Horovod advances optimizer.iterations on every backward pass.
        assert outs[0]["iterations"][:8] == list(range(1, 9))
    if check == "partial_tape":
        assert outs[0]["split"] == [2, 2]
    if check in ("partial_optimizer_fit", "legacy_syncbn_and_callbacks"):
        assert len({o["shared_digest"] for o in outs}) == 1
    if check == "partial_optimizer_fit":
        assert len({o["local_digest"] for o in outs}) == 2, (
            "the local layer trained on each rank's data alone")
    if check == "legacy_syncbn_and_callbacks":
        assert outs[0]["distributed"]
    if check == "load_model":
        assert outs[0]["distributed"] and outs[0]["class"] == "Adam"
        assert outs[0]["iterations_loaded"] > 0
    if check == "broadcast_global_variables":
        assert "model" in outs[0]["eager_error"]
    if check == "best_model_checkpoint":
        losses = outs[0]["losses"]
        assert min(losses) < losses[-1] or losses == sorted(losses)[::-1]


@pytest.mark.slow  # the 2-rank job runs both checks by default
@pytest.mark.parametrize("check", ["syncbn_layer_uneven", "syncbn_fit"])
def test_four_ranks_syncbn(check, tmp_path_factory):
    outs = outcome(job(4, "syncbn", tmp_path_factory), check)
    if "digest" in outs[0]:
        assert len({o["digest"] for o in outs}) == 1, "ranks differ"


def test_horovod_style_example_runs_under_tfring_run(tmp_path):
    """examples/horovod_style_keras.py (Horovod's Keras MNIST example with
    the import line changed) trains at 2 ranks via tfring-run: the loss
    falls, rank 0 alone writes checkpoints, and both ranks end with the
    same weights."""
    import re

    out = run_example("horovod_style_keras.py",
                      ["--epochs", "3", "--steps", "16", "--batch-size", "32"], tmp_path,
                      dict(os.environ, PYTHONUNBUFFERED="1", **RANK_ENV), JOB_TIMEOUT, np_=2)
    ends = re.findall(r"rank (\d) loss ([\d.]+) weights sha256 (\w+)", out)
    assert sorted(r for r, _, _ in ends) == ["0", "1"], out[-3000:]
    assert len({d for _, _, d in ends}) == 1, f"ranks differ: {ends}"
    assert float(ends[0][1]) < 2.0, f"the loss did not fall: {ends}"
    assert sorted(os.listdir(tmp_path)) == [
        "checkpoint-1.h5", "checkpoint-2.h5", "checkpoint-3.h5"]


_LEGACY_SYNCBN = """
import numpy as np, tensorflow as tf, tfring as hvd
from tfring.keras import legacy
hvd.init()
assert hvd.SyncBatchNormalization is legacy.SyncBatchNormalization
assert issubclass(hvd.SyncBatchNormalization, tf.keras.layers.BatchNormalization)
x = np.random.default_rng(7).normal(size=(6, 3)).astype(np.float32)
with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
    sync_bn = hvd.SyncBatchNormalization(axis=1, epsilon=1e-3)
    out = sync_bn(tf.constant(x), training=True)
    sess.run(tf.compat.v1.global_variables_initializer())
    got = sess.run(out)
    mean = sess.run(sync_bn.moving_mean)  # a tf_keras variable: fetchable
ref = (x - x.mean(0, dtype=np.float64)) / np.sqrt(x.var(0, dtype=np.float64) + 1e-3)
np.testing.assert_allclose(got, ref, atol=1e-5)
assert mean.shape == (3,) and np.isfinite(mean).all()
print("ok")
"""


@pytest.mark.skipif(not tf_available("tf_keras"), reason="tf_keras missing")
def test_top_level_syncbn_follows_tf_keras():
    """With TF_USE_LEGACY_KERAS=1 tf.keras is tf_keras, and Horovod's
    hvd.SyncBatchNormalization (a tf.keras layer) mixes with its layers and
    runs in a tf.compat.v1 Session: tfring.SyncBatchNormalization is then
    the tf_keras layer, normalizing as numpy does (one rank); otherwise it
    stays the Keras 3 one."""
    import subprocess

    env = dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="2")
    out = subprocess.run([sys.executable, "-c", _LEGACY_SYNCBN], env=env,
                         capture_output=True, text=True, timeout=JOB_TIMEOUT)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-3000:]
    env.pop("TF_USE_LEGACY_KERAS")
    code = ("import tfring, tfring.keras\n"
            "assert tfring.SyncBatchNormalization is tfring.keras.SyncBatchNormalization\n"
            "print('ok')")
    out = subprocess.run([sys.executable, "-c", code], env=env,
                         capture_output=True, text=True, timeout=JOB_TIMEOUT)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-3000:]
