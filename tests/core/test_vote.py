"""The agreement round's vote: round the ring (N-1 hops) or by recursive
doubling over the point-to-point links (log2 p hops, +2 when N is not a
power of two), chosen by TFRING_VOTE_ALGO. Results against float64
references with every rank submitting in its own order, the hop and byte
counters of _core.last_vote_stats() against the formulas, an idle rank
woken by the others' rounds, and mismatches, stalls and dead ranks still
reported on every rank with the recursive vote. The settings a test
compares on the same ranks run as passes of one launch (TEST_PASSES,
common.run_passes), shared by the tests that read them. TFRING_TEST_SLOW=1
adds 64 ranks."""

import functools
import json
import os

import pytest

from multiproc import check_ok, check_peer_failure, run_ranks

SLOW = bool(os.environ.get("TFRING_TEST_SLOW"))
HEADER, FRESH_LIST, FRESH_TALLY = 3, 25, 34  # runtime/vote.h, in int32 words


def vote_formula(algo, rank, n, vote_bytes):
    """(hops, bytes_sent) of one round's vote on `rank`."""
    if algo == "ring":
        return n - 1, (n - 1) * vote_bytes
    p, lg = 1, 0
    while p * 2 <= n:
        p, lg = p * 2, lg + 1
    r = n - p
    hops = lg + (2 if r else 0)
    if rank < 2 * r and rank % 2 == 0:  # extra rank: its vote out, the tally back
        return hops, vote_bytes
    fold = rank < 2 * r
    return hops, lg * vote_bytes + (4 + vote_bytes if fold else 0)


def _steady(n, algo, env=None, timeout=300):
    e = {"TFRING_TIMEOUT": "120", "TFRING_VOTE_ALGO": algo}
    e.update(env or {})
    res = run_ranks(n, "vote.py", ["steady"], env=e, timeout=timeout)
    outs = check_ok(res)
    # Ranks shut down one by one, some while others still run: a partner's
    # closed link is no error.
    for r in res:
        assert "[tfring ERROR" not in r.stderr, (r.rank, r.stderr[-2000:])
    return outs


@functools.lru_cache(maxsize=None)
def _steady_passes(n, passes, timeout=300):
    """[pass][rank] results of one launch of n ranks in steady mode, one
    pass per environment; `passes` a tuple of tuples of (var, value)."""
    passes = [{k: list(v) if isinstance(v, tuple) else v for k, v in p} for p in passes]
    e = {"TFRING_TIMEOUT": "120", "TEST_PASSES": json.dumps(passes)}
    res = run_ranks(n, "vote.py", ["steady"], env=e, timeout=timeout * len(passes))
    outs = check_ok(res)
    for r in res:  # as in _steady
        assert "[tfring ERROR" not in r.stderr, (r.rank, r.stderr[-2000:])
    return [list(per_rank) for per_rank in zip(*outs)]


def _algos(n, algo, **env):
    """The results under vote algorithm `algo` of one launch of ring and
    recdbl passes."""
    passes = tuple((("TFRING_VOTE_ALGO", a),) + tuple(env.items()) for a in ALGOS)
    return _steady_passes(n, passes)[ALGOS.index(algo)]


ALGOS = ("ring", "recdbl")


def _check(res, n, algo):
    words = FRESH_LIST if algo == "ring" else FRESH_TALLY
    for r, out in enumerate(res):
        assert out["failures"] == [], f"rank {r}: " + "\n".join(out["failures"][:10])
        for st in (out["vote"], out["after"]):
            assert st["algo"] == algo and st["ranks"] == n, st
            ids = st["bytes"] // 4 - HEADER - words  # cache ids in the vote
            assert st["bytes"] % 4 == 0 and 0 <= ids <= 12, st
            assert (st["hops"], st["bytes_sent"]) == vote_formula(algo, r, n, st["bytes"]), (r, st)
            assert st["rounds"] >= 6  # at least a round per step
        assert out["after"]["bytes"] == res[0]["after"]["bytes"]  # one vote size everywhere


# 8 (a power of two) and 13 (8 + 5: the fold) by default; 16 also with
# TFRING_TEST_SLOW=1 (test_auto_picks_by_rank_count_and_hosts runs 16 ranks).
@pytest.mark.parametrize("n", [8, 13, pytest.param(16, marks=pytest.mark.slow)])
@pytest.mark.parametrize("algo", ["ring", "recdbl"])
def test_vote_counters_match_formulas(n, algo):
    # The vote alone: no small allreduce riding in it (TFRING_VOTE_DATA).
    _check(_algos(n, algo, TFRING_VOTE_DATA="0"), n, algo)


@pytest.mark.parametrize("n", [5, 8])
@pytest.mark.parametrize("algo", ["ring", "recdbl"])
def test_steady_results_with_small_allreduces_riding_the_vote(n, algo):
    # Every rank submits in its own order: riders often differ between
    # ranks, and those tensors must still run (and agree with float64).
    res = _algos(n, algo, STEPS="4")
    for r, out in enumerate(res):
        assert out["failures"] == [], f"rank {r}: " + "\n".join(out["failures"][:10])


@pytest.mark.parametrize("n,algo", [(2, "ring"), (3, "ring"), (5, "recdbl"), (6, "recdbl")])
def test_small_allreduce_rides_the_vote(n, algo):
    # A steady small allreduce (1 KiB) is reduced inside the vote itself:
    # the vote's hops alone, every dtype and op right, and the vote's size
    # is its own plus a key of 3 words and the agreed room (the tensor).
    count = 256
    res = check_ok(run_ranks(n, "vote.py", ["rider"], timeout=180,
                             env={"TFRING_TIMEOUT": "60", "TFRING_VOTE_ALGO": algo,
                                  "COUNT": str(count)}))
    for r, out in enumerate(res):
        assert out["failures"] == [], f"rank {r}: " + "\n".join(out["failures"][:10])
        for run in out["runs"]:
            dt = run["case"][0]
            size = {"float16": 2, "float32": 4, "int32": 4, "float64": 8}[dt] * count
            algos = [s["algo"] for s in run["stats"]]
            # The first call of a new size carries no data (the room is agreed
            # a round ahead); from then on every call rides.
            assert algos[-4:] == ["vote"] * 4, (r, run["case"], algos)
            st, vote = run["stats"][-1], run["vote"]
            assert (st["ranks"], st["bytes"]) == (n, size), st
            assert (st["hops"], st["bytes_sent"]) == (vote["hops"], vote["bytes_sent"]), (st, vote)
            words = FRESH_TALLY + 3 + size // 4  # the ring's list sent in tally form
            ids = vote["bytes"] // 4 - HEADER - words
            assert vote["bytes"] % 4 == 0 and 0 <= ids <= 1, vote
            assert (vote["hops"], vote["bytes_sent"]) == vote_formula(algo, r, n, vote["bytes"])


def test_forced_algorithm_or_zero_room_keeps_small_allreduces_out_of_the_vote():
    for env in ({"TFRING_VOTE_DATA": "0"}, {"TFRING_ALLREDUCE_ALGO": "oneshot"}):
        res = check_ok(run_ranks(3, "vote.py", ["rider"], timeout=180,
                                 env=dict(env, TFRING_TIMEOUT="60", COUNT="64")))
        for out in res:
            assert out["failures"] == []
            assert all(s["algo"] != "vote" for run in out["runs"] for s in run["stats"]), env


def test_recdbl_vote_hops_are_logarithmic():
    # 13 = 8 + 5: three exchanges plus the fold and unfold, against 12.
    assert vote_formula("recdbl", 1, 13, 100)[0] == 5
    assert vote_formula("ring", 1, 13, 100)[0] == 12


@pytest.mark.skipif(not SLOW, reason="64 ranks on a small machine: TFRING_TEST_SLOW=1")
@pytest.mark.parametrize("algo", ["ring", "recdbl"])
def test_vote_counters_at_64_ranks(algo):
    res = _steady(64, algo, {"STEPS": "3"}, timeout=600)
    _check(res, 64, algo)
    # The target at 64 ranks on 16 hosts: at most 2 * log2(16) + 2 = 10.
    assert res[0]["vote"]["hops"] == {"ring": 63, "recdbl": 6}[algo]


@pytest.mark.parametrize("n,per_host,expect", [
    (4, 1, "ring"),       # few ranks: N-1 hops are few
    (8, 8, "ring"),       # one host: the ring goes through shared memory
    (16, 1, "recdbl"),    # 16 ranks, a host each: no shared memory to meet in
    (16, 4, "host"),      # 16 ranks on 4 hosts: through each host's segment
])
def test_auto_picks_by_rank_count_and_hosts(n, per_host, expect):
    # The layouts of one rank count are passes of one launch.
    layouts = {4: (1,), 8: (8,), 16: (1, 4)}[n]
    passes = tuple((("TFRING_VOTE_ALGO", "auto"), ("STEPS", "2"),
                    ("TFRING_HOSTNAME", tuple(f"host{r // k}" for r in range(n))))
                   for k in layouts)
    res = _steady_passes(n, passes)[layouts.index(per_host)]
    for out in res:
        assert out["failures"] == []
        assert out["after"]["algo"] == expect, out["after"]


@pytest.mark.parametrize("n,late", [(5, 0), (5, 3), (13, 10)])
def test_idle_rank_is_woken_by_the_recursive_vote(n, late):
    # Rank 0 of 5 and rank 10 of 13 are extra ranks of the fold (woken by
    # their partner's token); rank 3 of 5 is woken by a doubling partner.
    lates = {5: (0, 3), 13: (10,)}[n]
    passes = tuple((("TFRING_VOTE_ALGO", "recdbl"), ("LATE", str(k)), ("STEPS", "3"))
                   for k in lates)
    res = _steady_passes(n, passes)[lates.index(late)]
    for r, out in enumerate(res):
        assert out["failures"] == [], (r, out["failures"][:5])


def _faults(n, scenario, env=None, timeout=90):
    e = {"TFRING_VOTE_ALGO": "recdbl"}
    e.update(env or {})
    return run_ranks(n, "faults.py", [scenario], env=e, timeout=timeout)


@pytest.mark.parametrize("scenario,needle", [
    ("shape", "shape [4] on rank 0 vs [5] on rank 1"),
    ("cached_shape", "shape [4] on rank 0 vs [5] on rank 1"),
])
@pytest.mark.parametrize("n", [3, 5])
def test_mismatch_raises_on_every_rank_with_the_recursive_vote(scenario, needle, n):
    for r, out in enumerate(check_ok(_faults(n, scenario))):
        assert out["error"] == "MismatchError", (r, out)
        assert needle in out["message"], (r, out["message"])
        assert "'grad/" in out["message"], out["message"]  # names the tensor
        if scenario == "cached_shape":
            assert out["after"] == [float(n)] * 8  # and the cached path works again


def test_unnamed_order_mismatch_with_the_recursive_vote():
    res = check_ok(run_ranks(5, "unnamed.py", ["order"], timeout=90,
                             env={"TFRING_VOTE_ALGO": "recdbl"}))
    for r, out in enumerate(res):
        assert out["error"] == "MismatchError", (r, out)
        assert "shape [4] on rank 0 vs [6] on rank 1" in out["message"], out["message"]


def test_stall_names_the_missing_rank_with_the_recursive_vote():
    res = _faults(5, "missing", {"TFRING_STALL_CHECK_TIME": "1", "TFRING_TIMEOUT": "4",
                                 "SLEEP": "9"})
    outs = check_ok(res)
    for r in (0, 2, 3, 4):
        assert outs[r]["error"] == "MismatchError", outs[r]
        assert "'lonely'" in outs[r]["message"] and "not by ranks [1]" in outs[r]["message"]
    assert any("missing ranks [1]" in x.stderr for x in res), "no stall warning"


@pytest.mark.parametrize("victim", [0, 4])
def test_dead_rank_named_with_the_recursive_vote(victim):
    res = _faults(5, "die_busy", {"VICTIM": victim, "TFRING_TIMEOUT": "60"})
    check_peer_failure(res, victim, within=10)


def test_unknown_vote_algorithm_is_refused():
    res = run_ranks(2, "vote.py", ["steady"], env={"TFRING_VOTE_ALGO": "tree"}, timeout=60)
    for r in res:
        assert r.returncode != 0
        assert "TFRING_VOTE_ALGO=tree" in r.stderr, r.stderr[-2000:]


def test_scale_bench_vote_mode(tmp_path):
    # Smoke: both vote algorithms run end to end and report their hops.
    import json
    import subprocess
    import sys

    bench = os.path.join(os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")),
                         "benchmarks", "scale_bench.py")
    out = tmp_path / "vote.json"
    subprocess.run([sys.executable, bench, "--vote", "--np", "3", "--iters", "3", "--reps", "1",
                    "--timeout", "120", "--json", str(out)], check=True, timeout=300)
    row = json.loads(out.read_text())[0]
    assert row["np"] == 3
    assert (row["ring"]["ran"], row["ring"]["hops"]) == ("ring", 2)
    assert (row["recdbl"]["ran"], row["recdbl"]["hops"]) == ("recdbl", 3)


@pytest.mark.parametrize("algo", ["ring", "recdbl"])
def test_timeline_carries_the_vote(tmp_path, algo):
    # Every collective's row carries the vote of the round that ran it.
    path = str(tmp_path / "timeline.{rank}.json")
    res = check_ok(run_ranks(3, "misc.py", env={"TFRING_TIMELINE": path,
                                                "TFRING_VOTE_ALGO": algo}))
    words = FRESH_LIST if algo == "ring" else FRESH_TALLY
    for rank, out in enumerate(res):
        stats = [e for e in out["timeline"] if e.get("name") == "VOTE_STATS"]
        assert len(stats) >= 13, "a VOTE_STATS event per collective"  # 12 allreduces + allgather
        for e in stats:
            a = e["args"]
            assert a["algo"] == algo and a["ranks"] == 3, a
            assert a["bytes"] // 4 - HEADER - words >= 0, a
            assert (a["hops"], a["bytes_sent"]) == vote_formula(algo, rank, 3, a["bytes"]), a
