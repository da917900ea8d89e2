"""Bad input and faults: a clear error naming the tensor and the ranks, on
every rank that takes part, never a hang."""

import re

import pytest

from multiproc import check_ok, check_peer_failure, run_ranks


def _errors(n, scenario, env=None, timeout=60):
    return check_ok(run_ranks(n, "faults.py", [scenario], env=env, timeout=timeout))


@pytest.mark.parametrize("scenario,needle", [
    ("shape", "shape [4] on rank 0 vs [5] on rank 1"),
    ("dtype", "dtype float32 on rank 0 vs float64 on rank 2"),
    ("op", "reduce op sum on rank 0 vs max on rank 1"),
    ("root", "root rank 0 on rank 0 vs 1 on rank 1"),
    ("allgather_shape", "only the first dimension"),
])
def test_mismatch_is_an_error_on_every_rank(scenario, needle):
    res = _errors(3, scenario)
    for r, out in enumerate(res):
        assert out["error"] == "MismatchError", (r, out)
        assert needle in out["message"], (r, out["message"])
        assert "bad'" in out["message"]  # names the tensor


def test_mismatch_does_not_poison_later_collectives():
    res = _errors(2, "after_error")
    for out in res:
        assert out["error"] == "MismatchError"
        assert out["after"] == [2.0, 2.0, 2.0]


def test_missing_tensor_warns_then_errors_naming_the_missing_rank():
    res = run_ranks(3, "faults.py", ["missing"], timeout=60,
                    env={"TFRING_STALL_CHECK_TIME": "1", "TFRING_TIMEOUT": "4", "SLEEP": "9"})
    outs = check_ok(res)
    for r in (0, 2):
        assert outs[r]["error"] == "MismatchError", outs[r]
        msg = outs[r]["message"]
        assert "'lonely'" in msg and "not by ranks [1]" in msg and "ranks [0, 2]" in msg, msg
        assert outs[r]["elapsed"] < 30
    warned = [x for x in res if "missing ranks [1]" in x.stderr]
    assert warned, "no stall warning naming the missing rank"


def test_cached_name_with_a_new_shape_is_a_mismatch_on_every_rank():
    res = _errors(3, "cached_shape")
    for r, out in enumerate(res):
        assert out["error"] == "MismatchError", (r, out)
        assert "shape [4] on rank 0 vs [5] on rank 1" in out["message"], out["message"]
        assert "'grad/cached'" in out["message"]
        assert out["after"] == [3.0] * 8  # and the cached path works again


def test_duplicate_name_in_flight():
    res = _errors(2, "duplicate")
    for out in res:
        assert "already in flight" in out["message"] and "'twice'" in out["message"], out


def _refused_on_rank_0(tmp_path, scenario, name):
    """Rank 0 submits a grouped op while `name` is in flight there (rank 1
    submits only once rank 0 has tried): refused on rank 0 alone, naming
    it. Returns both ranks' reports."""
    out0, out1 = _errors(2, scenario, env={"FLAG": str(tmp_path / "tried")})
    assert out0["error"] == "InvalidArgumentError", out0
    assert "already in flight" in out0["message"] and f"'{name}'" in out0["message"], out0
    assert out1["error"] is None, out1
    return out0, out1


def test_batch_with_a_name_in_flight_takes_none_of_its_tensors(tmp_path):
    for out in _refused_on_rank_0(tmp_path, "duplicate_batch", "g.1"):
        # "g.0" was not left behind in flight by the refused batch.
        assert out["g.0"] == [2.0] * 3 and out["g.1"] == [2.0] * 4, out


def test_grouped_op_under_a_name_in_flight_is_refused(tmp_path):
    for out in _refused_on_rank_0(tmp_path, "duplicate_group", "p"):
        assert out["p"] == [2.0] * 4 and out["group"] == [[2.0] * 3, [2.0] * 4], out


@pytest.mark.parametrize("scenario", ["die_idle", "die_busy", "die_fast"])
@pytest.mark.parametrize("victim", [0, 2])
@pytest.mark.parametrize("transport", ["auto", "tcp"])
def test_dead_peer_fails_every_rank_fast(scenario, victim, transport):
    res = run_ranks(3, "faults.py", [scenario], timeout=60,
                    env={"VICTIM": victim, "TFRING_TIMEOUT": "60", "TFRING_TRANSPORT": transport})
    check_peer_failure(res, victim, within=10)


def test_rank_whose_links_drop_is_named_first_not_the_rank_that_noticed():
    # Rank 2's data links break while its process and coordinator connection
    # stay up: its ring neighbours see the links go and report it; the
    # coordinator's abort must lead with rank 2 on every survivor, and say
    # which rank saw it.
    res = run_ranks(4, "faults.py", ["cut_links"], timeout=90,
                    env={"VICTIM": 2, "TFRING_TIMEOUT": "60", "TFRING_TRANSPORT": "tcp"})
    check_peer_failure(res, 2, within=15)
    relayed = [r.result["message"] for r in res if r.rank != 2]
    assert any(re.match(r"rank 2: rank 2 \(\S+:\d+\) failed or became unreachable "
                        r"\(seen by rank [13]: ", m) for m in relayed), relayed


@pytest.mark.parametrize("victim", [0, 2])
def test_stopped_rank_is_named_within_the_timeout(victim):
    # SIGSTOP keeps every connection up: the survivors' own waits would time
    # out on whichever neighbour they wait for; the coordinator's pings (or,
    # for a stopped rank 0, their absence) name the stopped rank instead.
    res = run_ranks(3, "faults.py", ["stopped"], timeout=90,
                    env={"VICTIM": victim, "TFRING_TIMEOUT": "5"})
    check_peer_failure(res, victim, within=5 + 2)
    for r in res:
        if r.rank != victim:
            assert "stopped" in r.result["message"], r.result


def test_rank_0_shutdown_does_not_wait_for_ranks_still_busy():
    res = run_ranks(3, "faults.py", ["late_ranks"], timeout=90,
                    env={"TFRING_TIMEOUT": "60", "TFRING_HEARTBEAT_TIMEOUT": "2", "SLEEP": "8"})
    outs = check_ok(res)
    # Bounded by TFRING_HEARTBEAT_TIMEOUT, far from TFRING_TIMEOUT (60 s).
    assert outs[0]["shutdown_s"] < 30, outs[0]
    for out in outs[1:]:
        assert "can never complete: rank 0 has already shut down" in out["message"], out


def test_unnamed_calls_in_another_order_are_a_mismatch_naming_the_call():
    # Unnamed collectives are matched by call order: rank 1 swaps two calls
    # of different shapes, and every rank hears which call disagrees.
    for r, out in enumerate(check_ok(run_ranks(3, "unnamed.py", ["order"], timeout=60))):
        assert out["error"] == "MismatchError", (r, out)
        msg = out["message"]
        assert "'allreduce.noname." in msg and "shape [4] on rank 0 vs [6] on rank 1" in msg, msg
        assert "order" in msg, msg  # says how unnamed calls are matched
        assert out["after"] == [3.0] * 3, (r, out)
