"""A rank that leaves the job on purpose (tfring.shutdown(), process exit)
is a departure, not a failure: the ranks that stay log no error for it,
however its goodbye and the closing of its links race, and what they still
submit fails saying it shut down. A rank that dies (SIGKILL) is still
reported as an error naming it."""

import re

import pytest

from multiproc import run_ranks

ERROR_LINE = re.compile(r"^\[tfring ERROR.*$", re.M)
DEPARTED = re.compile(r"rank [012] (has already shut down|shut down without submitting it)")
# Rank 1 of 3 leaves: its goodbye reaches rank 2 through the coordinator
# (rank 0), while rank 2 sees rank 1's link close directly. Over TCP a
# closed link starts a round at once (no grace as in the recursive-doubling
# vote), so rank 2 often sees the link close first: before that was
# handled, 4 jobs of 10 logged an error. Repeated, nearly every run of
# these tests meets that order.
REPEATS = 5


def _job(mode, stay):
    env = dict(MODE=mode, STAY=stay, LEAVERS=1, TFRING_TRANSPORT="tcp", TFRING_TIMEOUT="30")
    return run_ranks(3, "departures.py", env=env, timeout=60)


@pytest.mark.parametrize("mode", ["shutdown", "exit"])
@pytest.mark.parametrize("stay", ["idle", "submit"])
def test_a_rank_that_leaves_is_no_error_on_the_ranks_that_stay(mode, stay):
    for _ in range(REPEATS):
        res = _job(mode, stay)
        for r in res:
            assert r.returncode == 0, (r.rank, r.stderr[-3000:])
            assert not ERROR_LINE.search(r.stderr), (r.rank, ERROR_LINE.findall(r.stderr))
        for r in (res[0], res[2]):
            # What a staying rank submits after rank 1 left fails naming a
            # departure (rank 1's, or that of the other staying rank once it left too).
            errors = r.result["errors"]
            assert errors and (stay == "submit" or len(errors) == 1), (r.rank, errors)
            for e in errors:
                assert DEPARTED.search(e), (r.rank, errors)


def test_a_killed_rank_is_an_error_naming_it_on_every_survivor():
    for _ in range(2):
        res = _job("kill", "idle")
        assert res[1].returncode != 0
        # The coordinator (rank 0) logs the death; every survivor's work
        # fails naming rank 1.
        lines = ERROR_LINE.findall(res[0].stderr)
        assert lines and all("rank 1" in ln for ln in lines), res[0].stderr[-3000:]
        for r in (res[0], res[2]):
            assert r.returncode == 0, r.stderr[-3000:]
            errors = r.result["errors"]
            assert errors and errors[0].startswith("PeerFailureError: rank 1"), (r.rank, errors)
