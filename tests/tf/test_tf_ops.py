"""The TensorFlow ops on 3 ranks (2 and 4 too with TFRING_TEST_SLOW=1): every op in eager, tf.function and
tf.compat.v1 session modes against numpy references, for every dtype TF
allows for it; gradients of every op; and the op-level contracts (not merged
or folded, not chained inside tf.function, deterministic names, compiled by
XLA (tests/tf/test_xla.py has the rest), clear errors on mismatches and on a TF
version mismatch).

Importing TensorFlow costs seconds per rank, so each world size is one job
whose ranks run every check (tests/workers/tf_ops.py); the tests below
report the checks one by one. The 3-rank job also runs the packing
algorithms' passes (below) on the same ranks.
"""

import dataclasses
import importlib.util
import json
import os
import sys

import pytest

import tf_util

TESTS = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
SIZES = [3, pytest.param(2, marks=pytest.mark.slow), pytest.param(4, marks=pytest.mark.slow)]
PACKING_SIZE = 3
JOB_TIMEOUT = 300

# Quiet, thread-limited ranks (the test box may have 2 cores for 4 ranks),
# and a collective's deadline short enough for the mismatch checks.
RANK_ENV = dict(tf_util.RANK_ENV, TFRING_TIMEOUT="60")

# The check names (the worker's list, read without importing TensorFlow).
_spec = importlib.util.spec_from_file_location(
    "tf_ops_worker", os.path.join(TESTS, "workers", "tf_ops.py"))
_worker_mod = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_worker_mod)
CHECKS, EXTRA_CHECKS = _worker_mod.CHECKS, _worker_mod.EXTRA_CHECKS
WORKER = os.path.join(TESTS, "workers", "tf_ops.py")


pytestmark = pytest.mark.skipif(
    not tf_util.tf_available(),
    reason="TensorFlow or tfring's op library (_tfring_ops.so) missing")


_jobs = {}

PACKING_ALGOS = ["oneshot", "hier"]


def _packing_passes():
    """The algorithms that pack fused tensors, a pass each, after the main
    pass on the PACKING_SIZE job (a pass sets TFRING_ALLREDUCE_ALGO, inits,
    runs the check, shuts down)."""
    return [{"TFRING_ALLREDUCE_ALGO": algo, "TFRING_FUSION_THRESHOLD": "4K",
             "TEST_ONLY": "grouped_under_packing_algorithms"} for algo in PACKING_ALGOS]


def job(size):
    """Runs every check on `size` ranks once; returns per-rank results."""
    if size not in _jobs:
        sys.path.insert(0, TESTS)
        from multiproc import run_ranks

        passes = [{}] + (_packing_passes() if size == PACKING_SIZE else [])
        results = run_ranks(size, WORKER, [], env=dict(RANK_ENV, TEST_PASSES=json.dumps(passes)),
                            timeout=JOB_TIMEOUT * len(passes))
        _jobs[size] = results
    return _jobs[size]


def _pass_result(r, k):
    """Rank result r's report of pass k (None when it reported none: its
    exit code tells)."""
    return r.result[k] if isinstance(r.result, list) and len(r.result) > k else None


def _pass(size, k):
    """The ranks' reports of pass k of the job of `size`."""
    return [_pass_result(r, k) for r in job(size)]


def _outcome(size, check):
    from multiproc import rank_results

    return rank_results([dataclasses.replace(r, result=_pass_result(r, 0)) for r in job(size)],
                        check)


@pytest.mark.parametrize("check", CHECKS)
@pytest.mark.parametrize("size", SIZES)
def test_check(size, check):
    outs = _outcome(size, check)
    failed = [(r, o["error"]) for r, o in enumerate(outs) if o["error"]]
    assert not failed, "\n".join(f"rank {r}:\n{e}" for r, e in failed)


@pytest.mark.parametrize("size", SIZES)
def test_function_names_agree_across_ranks(size):
    names = [o["value"] for o in _outcome(size, "function_names")]
    assert all(n == names[0] for n in names), names
    assert len(set(names[0])) == len(names[0]), names[0]


@pytest.mark.parametrize("algo", PACKING_ALGOS)
def test_grouped_allreduce_under_packing_algorithms(algo):
    """The algorithms that pack fused tensors get a grouped request in
    pieces of at most the fusion threshold (4 KiB here), a larger part
    alone in place, with and without a prescale."""
    k = 1 + PACKING_ALGOS.index(algo)
    for r, results in enumerate(_pass(PACKING_SIZE, k)):
        assert results is not None, f"rank {r} reported no pass {k}: see test_ranks_exit_cleanly"
        o = results["grouped_under_packing_algorithms"]
        assert not o["error"], f"rank {r}:\n{o['error']}"
        assert set(o["value"]) == {algo}, o["value"]


@pytest.mark.parametrize("size", SIZES)
def test_ranks_exit_cleanly(size):
    for r in job(size):
        assert r.returncode == 0, (
            f"rank {r.rank} exited {r.returncode}\n{r.stderr[-3000:]}")
