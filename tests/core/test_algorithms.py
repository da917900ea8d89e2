"""The allreduce algorithms (TFRING_ALLREDUCE_ALGO=ring|oneshot|hier|auto),
each forced and chosen automatically, against numpy float64 references:
world sizes 1-4 and 7 on one host, two simulated hosts (TFRING_HOSTNAME) of
two ranks for the hierarchical and the small cross-host schemes. Results
must be bitwise identical on every rank, and a rank killed inside a
one-shot allreduce must be named by every survivor. The algorithms a test
compares on the same ranks run as passes of one launch
(multiproc.run_passes), shared by the tests that read them."""

import functools

import pytest

from multiproc import check_ok, check_peer_failure, run_passes, run_ranks

# A 4 KiB threshold and small pipeline chunks, so counts around the threshold
# and buffers spanning many segment slots stay cheap.
BASE = {"TFRING_SMALL_THRESHOLD": "4096", "TFRING_CHUNK_SIZE": "1024",
        "TFRING_SHM_BUFFER": "4096", "TEST_SMALL_THRESHOLD": "4096"}


def two_hosts(r):
    return {"TFRING_HOSTNAME": "hostA" if r < 2 else "hostB"}


def _run(n, algo, mode="full", per_rank_env=None, extra=None):
    env = dict(BASE, TFRING_ALLREDUCE_ALGO=algo)
    env.update(extra or {})
    res = check_ok(run_ranks(n, "algorithms.py", [mode], env=env, timeout=300,
                             per_rank_env=per_rank_env))
    for r, out in enumerate(res):
        assert out["failures"] == [], f"rank {r}: " + "\n".join(out["failures"][:20])
    assert len({out["digest"] for out in res}) == 1, "ranks ended with different results"
    return res


def _check(res):
    for r, out in enumerate(res):
        assert out["failures"] == [], f"rank {r}: " + "\n".join(out["failures"][:20])
    assert len({out["digest"] for out in res}) == 1, "ranks ended with different results"
    return res


@functools.lru_cache(maxsize=None)
def _algos(n, mode, algos, hosts=None):
    """{algo: rank results} of one launch, one pass per algorithm; `hosts`
    a tuple of host names by rank."""
    passes = []
    for a in algos:
        p = {"TFRING_ALLREDUCE_ALGO": a}
        if hosts:
            p["TFRING_HOSTNAME"] = list(hosts)
        passes.append(p)
    res = run_passes(n, "algorithms.py", passes, [mode], env=BASE, timeout=300)
    return dict(zip(algos, res))


ONE_HOST = ("ring", "oneshot", "hier", "auto")
TWO_HOSTS = ("hostA", "hostA", "hostB", "hostB")


def _used(res):
    """Algorithms some call ran, the same on every rank."""
    counts = [out["counts"] for out in res]
    assert all(c == counts[0] for c in counts), counts
    return {a for a, k in counts[0].items() if k > 0}


@pytest.mark.parametrize("n", [1, 2, 3, 4])
@pytest.mark.parametrize("algo", ONE_HOST)
def test_one_host(n, algo):
    res = _check(_algos(n, "full" if n in (1, 2, 4) else "quick", ONE_HOST)[algo])
    used = _used(res)
    if n == 1:
        assert used <= {"ring"}
    elif algo == "auto":
        assert used == {"oneshot", "ring"}
    else:
        assert used == {algo}


@pytest.mark.parametrize("algo", ["oneshot", "auto"])
def test_seven_ranks_oversubscribed(algo):
    used = _used(_check(_algos(7, "quick", ("oneshot", "auto"))[algo]))
    assert used == ({"oneshot"} if algo == "oneshot" else {"oneshot", "ring"})


@pytest.mark.parametrize("algo,expect", [("hier", {"hier"}), ("oneshot", {"small"}),
                                         ("auto", {"small", "hier"}), ("ring", {"ring"})])
def test_two_hosts_two_ranks_each(algo, expect):
    res = _check(_algos(4, "full", ("hier", "oneshot", "auto", "ring"), TWO_HOSTS)[algo])
    assert {(o["local_size"], o["cross_size"]) for o in res} == {(2, 2)}
    assert _used(res) == expect


def test_uneven_hosts_fall_back_to_ring():
    # Hosts of 2 and 1 ranks: the host-aware schemes need equal hosts.
    res = _run(3, "auto", "quick", per_rank_env=lambda r: {"TFRING_HOSTNAME": f"h{r // 2}"})
    assert _used(res) == {"ring"}


def test_one_rank_per_host_small_scheme():
    # Two hosts of one rank: no segment, the small scheme is the cross ring.
    res = _run(2, "auto", "quick", per_rank_env=lambda r: {"TFRING_HOSTNAME": f"h{r}"})
    assert _used(res) == {"small", "ring"}


def test_rank_zero_settings_win():
    # Rank 1 asks for another algorithm and threshold; rank 0's are used by
    # everyone, so the ranks cannot disagree (and hang).
    res = _run(3, "oneshot", "quick",
               per_rank_env=lambda r: {"TFRING_ALLREDUCE_ALGO": "ring",
                                       "TFRING_SMALL_THRESHOLD": "64"} if r == 1 else {})
    assert _used(res) == {"oneshot"}


@pytest.mark.parametrize("victim", [0, 2])
def test_rank_killed_in_oneshot(victim):
    res = run_ranks(3, "algorithms.py", ["kill"], timeout=60,
                    env=dict(BASE, TFRING_ALLREDUCE_ALGO="oneshot", VICTIM=victim))
    check_peer_failure(res, victim, within=10)
    for r in res:
        if r.rank != victim:
            assert r.result["counts"]["oneshot"] > 10, r.result


def test_rank_killed_in_small_cross_host_scheme():
    # Rank 3 (host B) dies: rank 2 sees it through the host segment, rank 1
    # through its cross-host link, rank 0 through the job's abort.
    victim = 3
    res = run_ranks(4, "algorithms.py", ["kill"], timeout=60, per_rank_env=two_hosts,
                    env=dict(BASE, TFRING_ALLREDUCE_ALGO="oneshot", VICTIM=victim))
    check_peer_failure(res, victim, within=10)
    for r in res:
        if r.rank != victim:
            assert r.result["counts"]["small"] > 10, r.result


@functools.lru_cache(maxsize=None)
def _tcp_passes():
    """{hosts: rank results}: one launch of 4 ranks over TCP, as one host
    and as two."""
    one = {"TFRING_ALLREDUCE_ALGO": "auto", "TFRING_TRANSPORT": "tcp"}
    res = run_passes(4, "algorithms.py", [one, dict(one, TFRING_HOSTNAME=list(TWO_HOSTS))],
                     ["quick"], env=BASE, timeout=300)
    return {1: res[0], 2: res[1]}


@pytest.mark.parametrize("hosts", [1, 2])
def test_tcp_transport_keeps_off_shared_memory(hosts):
    # TFRING_TRANSPORT=tcp: no host segment, so every size takes the ring.
    res = _check(_tcp_passes()[hosts])
    assert _used(res) == {"ring"}
