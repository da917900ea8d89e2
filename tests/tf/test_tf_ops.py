"""The TensorFlow ops on 2 and 4 ranks: every op in eager, tf.function and
tf.compat.v1 session modes against numpy references, for every dtype TF
allows for it; gradients of every op; and the op-level contracts (not merged
or folded, not chained inside tf.function, deterministic names, compiled by
XLA (tests/tf/test_xla.py has the rest), clear errors on mismatches and on a TF
version mismatch).

Importing TensorFlow costs seconds per rank, so each world size is one job
whose ranks run every check (tests/workers/tf_ops.py); the tests below
report the checks one by one.
"""

import importlib.util
import os
import sys

import pytest

import tf_util

TESTS = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
SIZES = [2, 4]
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


def job(size):
    """Runs every check on `size` ranks once; returns per-rank results."""
    if size not in _jobs:
        sys.path.insert(0, TESTS)
        from multiproc import run_ranks

        results = run_ranks(size, WORKER, [],
                            env=RANK_ENV, timeout=JOB_TIMEOUT)
        _jobs[size] = results
    return _jobs[size]


def _outcome(size, check):
    from multiproc import rank_results

    return rank_results(job(size), check)


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


PACKING_ALGOS = ["oneshot", "hier"]
_packing_job = {}


def packing_job():
    """{algo: each rank's results}: the packing algorithms one after
    the other on the ranks of one launch (a pass each: set
    TFRING_ALLREDUCE_ALGO, init, run the check, shutdown)."""
    if not _packing_job:
        sys.path.insert(0, TESTS)
        from multiproc import run_passes

        env = dict(RANK_ENV, TFRING_FUSION_THRESHOLD="4K")
        passes = [{"TFRING_ALLREDUCE_ALGO": algo} for algo in PACKING_ALGOS]
        res = run_passes(3, WORKER, passes, ["--only", "grouped_under_packing_algorithms"],
                         env=env, timeout=JOB_TIMEOUT)
        _packing_job.update(zip(PACKING_ALGOS, res))
    return _packing_job


@pytest.mark.parametrize("algo", PACKING_ALGOS)
def test_grouped_allreduce_under_packing_algorithms(algo):
    """The algorithms that pack fused tensors get a grouped request in
    pieces of at most the fusion threshold (4 KiB here), a larger part
    alone in place, with and without a prescale."""
    for r, results in enumerate(packing_job()[algo]):
        o = results["grouped_under_packing_algorithms"]
        assert not o["error"], f"rank {r}:\n{o['error']}"
        assert set(o["value"]) == {algo}, o["value"]


@pytest.mark.parametrize("size", SIZES)
def test_ranks_exit_cleanly(size):
    for r in job(size):
        assert r.returncode == 0, (
            f"rank {r.rank} exited {r.returncode}\n{r.stderr[-3000:]}")
