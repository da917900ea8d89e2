"""The host vote (TFRING_VOTE_ALGO=host, runtime/vote_host.cc): votes meet
in each host's shared segment, local ranks 0 run recursive doubling among
the hosts, and the tally goes back through the segment. Hosts are named
with TFRING_HOSTNAME, so several "hosts" share this machine. Results
against float64 with every rank submitting in its own order, the hop and
byte counters against the formula, idle ranks woken on either side of the
segment, the switch to recdbl once the vote outgrows the segment, and
mismatches, stalls and dead ranks reported on every rank. The steady
checks of one layout run as passes of one launch (test_vote._steady_passes),
shared by the tests that read them."""

import pytest

from multiproc import check_ok, check_peer_failure, run_ranks
from test_vote import FRESH_TALLY, HEADER, _steady_passes, vote_formula


def hosts_of(n, per_host):
    return [list(range(h, min(n, h + per_host))) for h in range(0, n, per_host)]


def host_formula(rank, n, per_host, vote_bytes):
    """(hops, bytes_sent) of one host-vote round on `rank`."""
    hosts = hosts_of(n, per_host)
    h = rank // per_host
    p, lg = 1, 0
    while p * 2 <= len(hosts):
        p, lg = p * 2, lg + 1
    hops = 2 + lg + (2 if len(hosts) > p else 0)
    if rank != hosts[h][0]:
        return hops, vote_bytes  # its vote into the segment
    cross = vote_formula("recdbl", h, len(hosts), vote_bytes)[1]
    return hops, cross + (vote_bytes if len(hosts[h]) > 1 else 0)  # + the tally it writes


# The steady passes of each layout (n, per_host): {name: environment}.
STEADY = {
    (8, 4): {"counters": {"TFRING_VOTE_DATA": "0"}, "riding": {"STEPS": "4"}},
    (12, 4): {"counters": {"TFRING_VOTE_DATA": "0"}},
    (7, 3): dict({"counters": {"TFRING_VOTE_DATA": "0"}, "riding": {"STEPS": "4"}},
                 **{f"late{k}": {"LATE": str(k), "STEPS": "3"} for k in (0, 1, 5, 6)}),
}


def _steady(n, per_host, name):
    """Rank results of pass `name` of the layout's one launch."""
    hosts = tuple(f"host{r // per_host}" for r in range(n))
    names = list(STEADY[(n, per_host)])
    passes = tuple((("TFRING_VOTE_ALGO", "host"), ("TFRING_HOSTNAME", hosts))
                   + tuple(env.items()) for env in STEADY[(n, per_host)].values())
    return _steady_passes(n, passes)[names.index(name)]


def _run(n, per_host, mode="steady", env=None, timeout=300, worker="vote.py"):
    e = {"TFRING_TIMEOUT": "120", "TFRING_VOTE_ALGO": "host"}
    e.update(env or {})
    return run_ranks(n, worker, [mode], env=e, timeout=timeout,
                     per_rank_env=lambda r: {"TFRING_HOSTNAME": f"host{r // per_host}"})


@pytest.mark.parametrize("n,per_host", [(8, 4), (12, 4), (7, 3)])
def test_host_vote_counters_match_formula(n, per_host):
    # 2 hosts; 3 hosts (the fold among local ranks 0); hosts of 3, 3 and 1
    # rank (a host without a segment).
    outs = _steady(n, per_host, "counters")  # (no "[tfring ERROR" in any stderr)
    for r, out in enumerate(outs):
        assert out["failures"] == [], f"rank {r}: " + "\n".join(out["failures"][:10])
        for st in (out["vote"], out["after"]):
            assert st["algo"] == "host" and st["ranks"] == n, st
            ids = st["bytes"] // 4 - HEADER - FRESH_TALLY
            assert st["bytes"] % 4 == 0 and 0 <= ids <= 12, st
            assert (st["hops"], st["bytes_sent"]) == host_formula(r, n, per_host, st["bytes"]), \
                (r, st)
        assert out["after"]["bytes"] == outs[0]["after"]["bytes"]


@pytest.mark.parametrize("n,per_host", [(8, 4), (7, 3)])
def test_host_vote_results_with_small_allreduces_riding(n, per_host):
    # Every rank submits in its own order, so riders often differ; small
    # allreduces that agree ride the vote, merged in local rank order and
    # then among hosts.
    for out in _steady(n, per_host, "riding"):
        assert out["failures"] == [], out["failures"][:10]
    res = check_ok(_run(6, 2, "rider", env={"COUNT": "256", "TFRING_TIMEOUT": "60"}))
    for r, out in enumerate(res):
        assert out["failures"] == [], f"rank {r}: " + "\n".join(out["failures"][:10])
        for run in out["runs"]:
            assert [s["algo"] for s in run["stats"]][-4:] == ["vote"] * 4, run["case"]
            vote = run["vote"]
            assert vote["algo"] == "host"
            assert (vote["hops"], vote["bytes_sent"]) == host_formula(r, 6, 2, vote["bytes"])


@pytest.mark.parametrize("late", [0, 1, 5, 6])
def test_idle_ranks_are_woken_on_both_sides_of_the_segment(late):
    # 7 ranks on hosts of 3, 3, 1: rank 0 and 6 are local ranks 0 (woken
    # by a local vote or bytes from another host), 1 and 5 sleep on their
    # doorbells in the segment.
    for r, out in enumerate(_steady(7, 3, f"late{late}")):
        assert out["failures"] == [], (r, out["failures"][:5])


def test_vote_outgrowing_the_segment_turns_to_recdbl():
    res = _run(4, 2, "grow", env={"LATE": "1"}, timeout=400)
    res_ok = check_ok(res)
    for r, out in enumerate(res_ok):
        assert out["failures"] == [], (r, out["failures"][:5])
        algos = out["algos"] + [out["after"]["algo"]]
        # Host votes until the cache outgrows the slot, then recdbl for
        # good (the last batch's names may all be granted in the round
        # that outgrows it, so the switch can land after the batches).
        assert algos[0] == "host", algos
        k = algos.index("recdbl") if "recdbl" in algos else len(algos)
        assert set(algos[k:]) == {"recdbl"} and k < len(algos), algos


@pytest.mark.parametrize("n,per_host,starter", [
    (4, 2, 1), pytest.param(4, 2, 3, marks=pytest.mark.slow), (7, 3, 6)])
def test_first_recdbl_round_started_by_one_rank_wakes_the_idle_ranks(n, per_host, starter):
    # The rider's 64 KiB room outgrows the segment's slots; the first
    # recdbl round is started by a rank that accepts the link to its first
    # partner (1 from 0, 3 from 2, 6 from 5) while every other rank idles
    # with its tensor at the coordinator. Only the round's bytes can wake
    # them, so the links must be open by then (TFRING_TIMEOUT bounds a
    # missing one). Rank 6 is alone on its host, without a segment: it
    # leaves the host vote with the others all the same.
    res = _run(n, per_host, "switch_idle", timeout=90,
               env={"STARTER": str(starter), "TFRING_VOTE_DATA": "65536",
                    "TFRING_TIMEOUT": "10"})
    for r, out in enumerate(check_ok(res)):
        assert out["failures"] == [], (r, out["failures"][:5])
        assert out["after"]["algo"] == "recdbl", (r, out["after"])


def test_auto_takes_the_host_vote_at_16_ranks_on_several_hosts():
    res = _run(16, 4, env={"TFRING_VOTE_ALGO": "auto", "STEPS": "2"})
    for out in check_ok(res):
        assert out["failures"] == []
        assert out["after"]["algo"] == "host", out["after"]


def test_forced_host_vote_on_one_host_is_recdbl():
    for out in check_ok(_run(3, 3, env={"STEPS": "2"})):
        assert out["after"]["algo"] == "recdbl", out["after"]


def test_mismatch_and_stall_with_the_host_vote():
    outs = check_ok(_run(5, 2, "shape", worker="faults.py", timeout=90))
    for r, out in enumerate(outs):
        assert out["error"] == "MismatchError", (r, out)
        assert "shape [4] on rank 0 vs [5] on rank 1" in out["message"], out["message"]
    res = _run(5, 2, "missing", worker="faults.py", timeout=90,
               env={"TFRING_STALL_CHECK_TIME": "1", "TFRING_TIMEOUT": "4", "SLEEP": "9"})
    outs = check_ok(res)
    for r in (0, 2, 3, 4):
        assert outs[r]["error"] == "MismatchError", outs[r]
        assert "'lonely'" in outs[r]["message"] and "not by ranks [1]" in outs[r]["message"]


@pytest.mark.parametrize("victim", [2, 3])
def test_dead_rank_named_with_the_host_vote(victim):
    # Rank 2 is local rank 0 of the second host, rank 3 a local rank of it.
    res = _run(6, 2, "die_busy", worker="faults.py", timeout=90,
               env={"VICTIM": str(victim), "TFRING_TIMEOUT": "60"})
    check_peer_failure(res, victim, within=10)
