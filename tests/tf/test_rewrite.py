"""tfring.rewrite on 2 ranks: tf.compat.v1 training graphs (two optimizers
through minimize, in-graph towers with AddN and Adam, plain
GradientDescent; dense and sparse gradients) and TF2 tf.function steps
(rewritten tf.function, decorator under tf.function, on="tape" with manual
updates).

Equivalence: 2 ranks with half of each batch end where 1 process on the
full batch does, within `tol` (absolute, float32: 1e-5, Adam 1e-4), and all
ranks end with bitwise identical variables. Ranks start from different
random values, so this also checks the broadcast from rank 0.

One job (tests/workers/tf_rewrite.py) runs every check; TF import is slow.
"""

import os
import sys

import pytest

from tf_util import JOB_TIMEOUT, RANK_ENV, tf_available

TESTS = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
REPO = os.path.dirname(TESTS)


pytestmark = pytest.mark.skipif(
    not tf_available(),
    reason="TensorFlow or tfring's op library (_tfring_ops.so) missing")

_job = {}


def results():
    if "r" not in _job:
        sys.path.insert(0, TESTS)
        from multiproc import run_ranks

        _job["r"] = run_ranks(2, "tf_rewrite.py", env=RANK_ENV,
                              timeout=JOB_TIMEOUT)
    return _job["r"]


def outcome(check):
    res = results()  # puts tests/ on sys.path
    from multiproc import rank_results

    outs = rank_results(res, check)
    for rank, out in enumerate(outs):
        assert out["ok"], f"rank {rank}: {out.get('error')}"
    return outs


def assert_equivalent(outs):
    assert outs[0]["max_diff"] <= outs[0]["tol"], (
        f"2 ranks x half batch differ from 1 process x full batch by "
        f"{outs[0]['max_diff']:.3g} (tolerance {outs[0]['tol']})")
    assert len({o["digest"] for o in outs}) == 1, "ranks ended with different variables"


@pytest.mark.parametrize("check", ["v1_two_optimizers", "v1_adam_towers",
                                   "v1_gradient_descent"])
def test_v1_graph_equivalence(check):
    outs = outcome(check)
    assert_equivalent(outs)
    assert outs[0]["moved"] > 1e-3, "training did not move the variables"


@pytest.mark.parametrize("check", ["v1_two_optimizers", "v1_adam_towers",
                                   "v1_gradient_descent"])
def test_v1_rewrites_exactly_the_applied_gradients(check):
    out = outcome(check)[0]
    rep, st = out["report"], out["structure"]
    # 4 dense gradients (2 kernels, 2 biases), 1 sparse (the embedding).
    assert rep["dense"] == 4 and rep["sparse"] == 1, rep["text"]
    assert rep["allreduce_ops"] >= 1 and rep["allgather_ops"] == 2
    # 5 variables (+ global step and optimizer slots) are broadcast.
    assert rep["broadcast"] >= 5
    # Every gradient input of every update comes through a ring op, and the
    # fused allreduces take exactly the 4 dense gradients.
    assert st["fed_locally"] == [], st
    assert st["fed_by_ring"], st
    assert len(st["ring_inputs"]) == 4, st
    assert {"RingGroupedAllreduce", "RingAllgather",
            "RingBroadcast"} <= set(st["ring_op_types"])
    # Idempotent: a second call finds the gradients already rerouted.
    assert rep["again_count"] == 0 and rep["again_already"] == 5


def test_v1_leaves_non_training_gradients_alone():
    st = outcome("v1_two_optimizers")[0]["structure"]
    assert st["norm_local"], "the gradient-norm summary was rerouted"


def test_v1_broadcast_op_after_restore():
    outs = outcome("v1_restore_broadcast_op")
    assert all(o["all_sevens"] for o in outs)


@pytest.mark.parametrize("check", ["tf2_function", "tf2_decorator",
                                   "tf2_tape_manual_updates"])
def test_tf2_function_equivalence(check):
    assert_equivalent(outcome(check))


def test_gradient_buckets_start_small_and_large_tensors_go_alone():
    from tfring._buckets import plan
    M = 1 << 20
    sizes = [M // 2, M // 2, M // 4, 30 * M, 5 * M, 5 * M, 20 * M, 2 * M, None]
    runs = plan(sizes, 64 * M)
    assert [i for r in runs for i in r] == list(range(len(sizes)))  # order kept, all there
    assert runs[0] == [0, 1]  # the first bucket closes at 1 MiB: it starts early
    assert [3] in runs  # larger than a bucket: alone, waits for nobody
    for r in runs[1:]:
        total = sum(sizes[i] or 0 for i in r)
        assert total <= 25 * M or len(r) == 1, (r, total)
    assert plan([100] * 5, 64 * M) == [[0, 1, 2, 3, 4]]  # a small model: one op
    assert plan([2 * M, M], 512 << 10) == [[0], [1]]  # an explicit threshold caps every bucket


def test_tape_in_a_function_reduces_buckets_in_backprop_order():
    # One grouped op per bucket, as tfring.rewrite builds: the head's small
    # gradient (produced first) goes alone in the first bucket, so it starts
    # while the rest of backprop runs; the three 1.44 MB gradients share
    # one op, not one op (and one hand-off back to TF) each.
    import json
    import subprocess

    env = dict(os.environ)
    env.update(RANK_ENV)
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    out = subprocess.run([sys.executable, os.path.join(TESTS, "workers", "tape_buckets.py")],
                         env=env, capture_output=True, text=True, timeout=JOB_TIMEOUT,
                         check=True).stdout
    ops = json.loads(out.strip().splitlines()[-1])
    grouped = [o["shapes"] for o in ops if o["type"] == "RingGroupedAllreduce"]
    assert grouped == [[[600, 10]], [[600, 600]] * 3], ops
    assert not [o for o in ops if o["type"] == "RingAllreduce"], ops
