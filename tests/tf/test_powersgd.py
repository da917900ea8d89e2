"""Compression.powersgd against a float64 numpy PowerSGD (tests/
powersgd_ref.py, simulating every rank) on a job of 2 ranks
(tests/workers/powersgd.py runs every check in one launch): the compressor
eagerly and in tf.function over warm-up, warm start and error feedback
(and without them, with op=Sum and an orthogonalization epsilon);
DistributedGradientTape in a tf.function step; tfring.keras's
DistributedOptimizer; model.fit with RingAllreduceCallback;
tf.compat.v1 graphs (DistributedOptimizer and tfring.rewrite()); sparse and float16
gradients; checkpoints of the compressor and of the optimizer tracking it
continue as the uninterrupted run; elastic sync; the errors it raises.
Every rank must get the same results (equal digests)."""

import functools

import pytest

from tf_util import RANK_ENV, tf_available

pytestmark = pytest.mark.skipif(
    not tf_available(),
    reason="TensorFlow or tfring's op library (_tfring_ops.so) missing")

SIZE = 2
TOL = 2e-5


@functools.lru_cache(maxsize=1)
def _job():
    from multiproc import run_ranks

    return run_ranks(SIZE, "powersgd.py", env=RANK_ENV, timeout=240)


def _outs(check):
    from multiproc import rank_results

    outs = rank_results(_job(), check)
    for r, out in enumerate(outs):
        assert out["ok"], f"rank {r}: {out.get('error')}"
    return outs


def _matches_reference(check, tol=TOL, steps=None):
    outs = _outs(check)
    for r, out in enumerate(outs):
        assert out["err"] < tol, (r, out)
        if steps is not None:
            assert out["steps"] == steps, (r, out)
    assert len({o["digest"] for o in outs}) == 1, "ranks got different results"
    return outs


def test_eager_warm_up_warm_start_error_feedback():
    outs = _matches_reference("eager", steps=6)
    # One reduction's counter; state for the two matrices worth compressing
    # (24x20 and 16x36; 20 is a vector and 30x2 gains too little).
    assert outs[0]["counts"] == [6] and outs[0]["slots"] == 2


def test_function_fresh_q_no_error_feedback_sum():
    _matches_reference("function", steps=4)


def test_distributed_gradient_tape_in_function():
    _matches_reference("tape", steps=5)


def test_keras_distributed_optimizer():
    _matches_reference("keras_optimizer", steps=4)


def test_fit_with_callback():
    outs = _matches_reference("fit", tol=1e-4)
    for out in outs:
        assert out["counts"] == [4], out
        # Restored from a ResumableCheckpointCallback file: 4 + 1 steps.
        assert out["resumed_epoch"] == 1 and out["resumed_counts"] == [5], out


def test_tf1_graph_optimizer_and_rewrite():
    outs = _outs("v1_graph")
    for how in ("optimizer", "rewrite"):
        per_rank = [o[how] for o in outs]
        for r, out in enumerate(per_rank):
            assert out["err"] < TOL and out["steps"] == 4, (how, r, out)
            assert out["counts"] == [4], (how, r, out)
        assert len({o["digest"] for o in per_rank}) == 1, how


def test_sparse_gradients():
    for out in _matches_reference("sparse", steps=1):
        assert out["gathered_ok"] and out["slots"] == 1, out


def test_half_gradients_computed_in_float32():
    outs = _matches_reference("half", tol=2e-3)
    assert outs[0]["dtypes"] == ["float16"] * 3


def test_checkpoint_restores_and_continues():
    for out in _outs("checkpoint"):
        assert out["same"] and out["counts"] == [6], out
        assert out["restored_slots"] == 2, out


def test_optimizer_checkpoint_carries_state():
    for out in _outs("checkpoint_optimizer"):
        assert out["same"] and out["counts"] == [5], out


def test_elastic_sync():
    outs = _matches_reference("elastic", steps=6)
    for out in outs:
        assert out["kept_error"] > 0, out
        assert out["counts"] == [6], out


def test_errors():
    out = _outs("errors")[0]
    assert out["min"].startswith("ValueError") and "min" in out["min"], out
    assert out["min_step"].startswith("ValueError") and "PowerSGD" in out["min_step"]
    assert out["int"].startswith("TypeError") and "int32" in out["int"], out
    assert out["allreduce"].startswith("TypeError"), out
    assert "DistributedGradientTape" in out["allreduce"], out
