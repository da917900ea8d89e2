"""tfring.keras on 2 ranks (Keras 3): RingAllreduceCallback alone, with a
ModelCheckpoint, validation data, a model restored from a checkpoint on
rank 0 only, and a tf.data input with steps_per_epoch; the Horovod-style
DistributedOptimizer + BroadcastGlobalVariablesCallback +
MetricAverageCallback + LearningRateWarmupCallback; saving a model compiled
with DistributedOptimizer; the callback bound to tf_keras (if installed).

Equivalence: 2 ranks with half of each batch end where 1 process on the
full batch does, within 1e-5 (absolute, float32 weights, a few SGD-momentum
steps), and all ranks end with bitwise identical weights.

One job (tests/workers/keras_fit.py) runs every check; TF import is slow.
"""

import os
import sys

import numpy as np
import pytest

from tf_util import JOB_TIMEOUT, RANK_ENV, tf_available

TESTS = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))


pytestmark = pytest.mark.skipif(
    not tf_available("keras"),
    reason="TensorFlow, Keras or tfring's op library (_tfring_ops.so) missing")


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    sys.path.insert(0, TESTS)
    from multiproc import run_ranks

    shared = tmp_path_factory.mktemp("keras_fit")
    results = run_ranks(2, "keras_fit.py", [str(shared)], env=RANK_ENV,
                        timeout=JOB_TIMEOUT)
    return results, shared


def outcome(job, check):
    results, _ = job
    from multiproc import rank_results

    outs = rank_results(results, check)
    for rank, out in enumerate(outs):
        assert out["ok"], f"rank {rank}: {out.get('error')}"
    return outs


def assert_equivalent(outs, tol=1e-5):
    assert outs[0]["max_diff"] <= tol, (
        f"2 ranks x half batch differ from 1 process x full batch by "
        f"{outs[0]['max_diff']:.3g} (tolerance {tol})")
    assert len({o["digest"] for o in outs}) == 1, "ranks ended with different weights"


def test_fit_matches_one_process_and_ranks_agree(job):
    assert_equivalent(outcome(job, "fit"))


def test_fit_once_per_epoch_traces_once(job):
    outs = outcome(job, "fit_per_epoch")
    assert_equivalent(outs)
    assert all(o["retraced_after_alone"] for o in outs)
    assert [o["functions"] for o in outs] == [1] * len(outs)


def test_model_built_by_its_first_batch_is_broadcast(job):
    outs = outcome(job, "fit_unbuilt")
    for name in ("ring", "ring_one_batch", "hvd", "hvd_one_batch"):
        assert len({o[name] for o in outs}) == 1, f"{name}: ranks differ"


def test_fit_metrics_are_averaged_over_ranks(job):
    outs = outcome(job, "fit")
    h0, h1 = outs[0]["history"], outs[1]["history"]
    assert h0 == h1
    assert {"loss", "mae", "val_loss", "val_mae"} <= set(h0)
    for key, values in h0.items():
        for epoch, value in enumerate(values):
            local = [o["local"][epoch][key] for o in outs]
            assert local[0] != local[1], "ranks saw the same local metric"
            assert value == pytest.approx(np.mean(local), rel=1e-6)


def test_only_rank0_prints_and_writes_checkpoints(job):
    outs = outcome(job, "fit")
    assert outs[0]["checkpoint_written"]
    assert not outs[1]["checkpoint_written"]
    results, shared = job
    assert (shared / "rank0" / "ckpt.weights.h5").exists()
    assert not (shared / "rank1" / "ckpt.weights.h5").exists()
    assert "Epoch 1/2" in results[0].stdout
    assert "Epoch" not in results[1].stdout and "loss:" not in results[1].stdout


def test_restored_model_state_is_broadcast(job):
    outs = outcome(job, "restored")
    assert_equivalent(outs)
    # The iteration count restored on rank 0 reached rank 1: 2 epochs of 4
    # steps before, 4 steps now.
    assert [o["iterations"] for o in outs] == [12, 12]


def test_steps_per_epoch(job):
    assert_equivalent(outcome(job, "steps_per_epoch"))


def test_horovod_style_pieces(job):
    outs = outcome(job, "horovod_style")
    assert_equivalent(outs)
    # Warm-up (Goyal et al.), Horovod's formula: from about initial_lr /
    # size, linear per batch (the rate at the end of each batch), to
    # initial_lr on the last batch of warmup_epochs=2, then constant.
    steps, lrs = outs[0]["steps"], outs[0]["lrs"]
    assert lrs == outs[1]["lrs"]
    want = [0.1 / 2 * ((e + (b + 1) / steps) * (2 - 1) / 2 + 1) if e < 2
            else 0.1
            for e in range(3) for b in range(steps)]
    assert lrs == pytest.approx(want, rel=1e-6)
    # MetricAverageCallback averaged the epoch metrics.
    h = outs[0]["history"]
    assert h["loss"] == outs[1]["history"]["loss"]
    local = [o["local"][0]["loss"] for o in outs]
    assert h["loss"][0] == pytest.approx(np.mean(local), rel=1e-6)
    assert h["learning_rate"][-1] == pytest.approx(0.1)


def test_saved_distributed_optimizer_loads_plain(job):
    for out in outcome(job, "save_load_distributed_optimizer"):
        assert out["plain"], out["class"]
        assert out["class"].endswith(".Adam")


def test_tf_keras_callback(job):
    outs = outcome(job, "tf_keras")
    if "skipped" in outs[0]:
        pytest.skip(outs[0]["skipped"])
    assert_equivalent(outs)
