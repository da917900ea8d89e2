"""alltoall with ragged splits and join with uneven data, on real ranks,
checked against numpy references each rank builds from shared seeds
(tests/workers/alltoall_join.py). The modes of one rank count run in one
job (one launch; the core-only modes before TensorFlow is imported),
shared by the tests that read them."""

import functools

import pytest

from multiproc import check_ok, run_ranks

# The modes each launch runs, in order.
MODES = {2: ("alltoall", "alltoall_tf"), 3: ("alltoall", "badsplits", "join_core",
                                             "alltoall_tf", "join_tf"),
         4: ("alltoall", "alltoall_tf")}


@functools.lru_cache(maxsize=None)
def _job(n):
    outs = check_ok(run_ranks(n, "alltoall_join.py", [",".join(MODES[n])],
                              timeout=120 * len(MODES[n])))
    for rank, out in enumerate(outs):
        assert out is not None and sorted(out) == sorted(MODES[n]), (rank, out)
    return outs


def _mode(n, mode):
    return [out[mode] for out in _job(n)]


def _all_ok(outs):
    for rank, out in enumerate(outs):
        assert out is not None, f"rank {rank} reported nothing"
        for name, res in out.items():
            assert res.get("ok"), f"rank {rank} check {name}: {res}"


@pytest.mark.parametrize("n", [2, 3, 4])
def test_alltoall_core_ragged(n):
    _all_ok(_mode(n, "alltoall"))


@pytest.mark.parametrize("n", [2, 3, 4])
def test_alltoall_tf_eager_function_gradient(n):
    _all_ok(_mode(n, "alltoall_tf"))


def test_alltoall_bad_splits_fail_on_every_rank():
    _all_ok(_mode(3, "badsplits"))


@pytest.mark.parametrize("mode", ["join_core", "join_tf"])
def test_join_uneven_shards_three_ranks(mode):
    outs = _mode(3, mode)
    _all_ok(outs)
    # Rank 1 has the most steps, so it is the last to join, on every rank.
    assert [o["steps"]["last"] for o in outs] == [1, 1, 1]


def test_join_one_rank():
    _all_ok(check_ok(run_ranks(1, "alltoall_join.py", ["join_one"], timeout=120)))
