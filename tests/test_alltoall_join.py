"""alltoall with ragged splits and join with uneven data, on real ranks,
checked against numpy references each rank builds from shared seeds
(tests/workers/alltoall_join.py)."""

import pytest

from multiproc import check_ok, run_ranks


def _all_ok(outs):
    for rank, out in enumerate(outs):
        assert out is not None, f"rank {rank} reported nothing"
        for name, res in out.items():
            assert res.get("ok"), f"rank {rank} check {name}: {res}"


@pytest.mark.parametrize("n", [2, 3, 4])
def test_alltoall_core_ragged(n):
    _all_ok(check_ok(run_ranks(n, "alltoall_join.py", ["alltoall"], timeout=180)))


@pytest.mark.parametrize("n", [2, 3, 4])
def test_alltoall_tf_eager_function_gradient(n):
    _all_ok(check_ok(run_ranks(n, "alltoall_join.py", ["alltoall_tf"], timeout=240)))


def test_alltoall_bad_splits_fail_on_every_rank():
    _all_ok(check_ok(run_ranks(3, "alltoall_join.py", ["badsplits"], timeout=240)))


@pytest.mark.parametrize("mode", ["join_core", "join_tf"])
def test_join_uneven_shards_three_ranks(mode):
    outs = check_ok(run_ranks(3, "alltoall_join.py", [mode], timeout=240))
    _all_ok(outs)
    # Rank 1 has the most steps, so it is the last to join, on every rank.
    assert [o["steps"]["last"] for o in outs] == [1, 1, 1]


def test_join_one_rank():
    _all_ok(check_ok(run_ranks(1, "alltoall_join.py", ["join_one"], timeout=120)))
