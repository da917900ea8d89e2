"""Allreduce at scale: recursive doubling and Rabenseifner for any number of
ranks against numpy float64 references (bitwise equal on every rank), the
hop and byte counters of every algorithm against its formula, the automatic
choice across many hosts, and a rank killed inside a large job named by
every survivor. Ranks are core-only processes (tests/workers/scale.py);
the configurations a test compares on the same ranks (the algorithms, the
host layouts) run as passes of one launch (multiproc.run_passes), shared
by the tests that read them. TFRING_TEST_SLOW=1 adds the 64-rank counter
and fault checks and repeats the 32-rank fault trial."""

import functools
import os

import pytest

from multiproc import check_ok, first_rank_named, run_passes, run_ranks

SLOW = bool(os.environ.get("TFRING_TEST_SLOW"))


def even_split(count, parts):
    base, extra = divmod(count, parts)
    off = [0]
    for i in range(parts):
        off.append(off[-1] + base + (1 if i < extra else 0))
    return off


def layout(rank, n):
    """(p, log2 p, r, is_extra, has_fold) of the recursive pairing."""
    p, lg = 1, 0
    while p * 2 <= n:
        p, lg = p * 2, lg + 1
    r = n - p
    return p, lg, r, rank < 2 * r and rank % 2 == 0, rank < 2 * r and rank % 2 == 1


def expected(algo, rank, n, count, es=4):
    """(hops, bytes_sent) of one allreduce of `count` elements."""
    b = count * es
    p, lg, r, extra, fold = layout(rank, n)
    if algo == "ring":
        off = even_split(count, n)
        seg = lambda i: (off[i % n + 1] - off[i % n]) * es  # noqa: E731
        return 2 * (n - 1), 2 * b - seg(rank + 1) - seg(rank + 2)
    hops = (lg if algo == "recdbl" else 2 * lg) + (2 if r else 0)
    if extra:
        return hops, b
    if algo == "recdbl":
        sent = lg * b
    else:
        blk = even_split(count, p)
        v = rank // 2 if rank < 2 * r else rank - r
        sent, lo, hi, m = 0, 0, p, p // 2
        while m >= 1:  # recursive halving: send the half I do not keep
            mid = lo + m
            lo, hi, give = (mid, hi, (lo, mid)) if v & m else (lo, mid, (mid, hi))
            sent += (blk[give[1]] - blk[give[0]]) * es
            m //= 2
        m = 1
        while m < p:  # recursive doubling: send my aligned range
            lo = v & ~(m - 1)
            sent += (blk[lo + m] - blk[lo]) * es
            m *= 2
    return hops, sent + (b if fold else 0)


def _run(n, mode, env, timeout=300, per_rank_env=None):
    base = {"TFRING_TIMEOUT": "120"}
    base.update(env)
    return check_ok(run_ranks(n, "scale.py", [mode], env=base, timeout=timeout,
                              per_rank_env=per_rank_env))


ALGOS = ["ring", "recdbl", "rabenseifner"]


@functools.lru_cache(maxsize=None)
def _algo_passes(n, mode, algos, counts=""):
    """{algo: [rank results]} of one launch of n ranks, one pass per
    algorithm (TFRING_ALLREDUCE_ALGO)."""
    passes = [{"TFRING_ALLREDUCE_ALGO": a, "TEST_COUNTS": counts} for a in algos]
    res = run_passes(n, "scale.py", passes, [mode], env={"TFRING_TIMEOUT": "120"},
                     timeout=300)
    return dict(zip(algos, res))


@pytest.mark.parametrize("algo", ["recdbl", "rabenseifner"])
@pytest.mark.parametrize("n", [2, 3, 4, 5, 7, 8])
def test_correct_any_n(algo, n):
    res = _algo_passes(n, "full", ("recdbl", "rabenseifner"))[algo]
    for r, out in enumerate(res):
        assert out["failures"] == [], f"rank {r}: " + "\n".join(out["failures"][:20])
        assert {k for k, v in out["counts"].items() if v} == {algo}, out["counts"]
        for st in out["stats"]:
            assert st["algo"] == algo and st["ranks"] == n
            assert st["hops"] == expected(algo, r, n, 1)[0], st
    assert len({out["digest"] for out in res}) == 1, "ranks ended with different results"


def test_correct_thirteen_ranks():
    res = _run(13, "full", {"TFRING_ALLREDUCE_ALGO": "rabenseifner"})
    for r, out in enumerate(res):
        assert out["failures"] == [], f"rank {r}: " + "\n".join(out["failures"][:20])
    assert len({out["digest"] for out in res}) == 1


def _check_stats(n, algo, counts):
    res = _algo_passes(n, "stats", tuple(ALGOS), ",".join(map(str, counts)))[algo]
    for r, out in enumerate(res):
        for st in out["stats"]:
            assert st["ok"], st
            hops, sent = expected(algo, r, n, st["count"])
            assert (st["algo"], st["hops"], st["bytes_sent"]) == (algo, hops, sent), (r, st)
        tot = out["totals"][algo]
        assert tot["calls"] == len(counts)
        assert tot["hops"] == sum(st["hops"] for st in out["stats"])
    return res


@pytest.mark.parametrize("n", [8, 13, 16])
@pytest.mark.parametrize("algo", ALGOS)
def test_counters_match_formulas(n, algo):
    # 1024 floats split evenly into 8 and 16 blocks, 1001 does not.
    _check_stats(n, algo, [1024, 1001, 3])


@pytest.mark.skipif(not SLOW, reason="64 ranks on a small machine: TFRING_TEST_SLOW=1")
@pytest.mark.parametrize("algo", ALGOS)
def test_counters_at_64_ranks(algo):
    res = _check_stats(64, algo, [1024])
    hops = res[0]["stats"][0]["hops"]
    assert hops == {"ring": 126, "recdbl": 6, "rabenseifner": 12}[algo]


# The automatic choice on 8 ranks under several simulated host layouts:
# {layout: (hosts of ranks 0..7, counts)}, one launch for all of them.
AUTO_LAYOUTS = {
    "4x2": ([f"host{r // 2}" for r in range(8)], "1024,16384,524288"),
    "8x1": ([f"host{r}" for r in range(8)], "1024,16384,524288"),
    "3+3+2": ([f"host{r // 3}" for r in range(8)], "1024,16384,524288"),
    "2x4": ([f"host{r // 4}" for r in range(8)], "1024"),
}


@functools.lru_cache(maxsize=None)
def _auto_passes():
    passes = [{"TFRING_HOSTNAME": hosts, "TEST_COUNTS": counts}
              for hosts, counts in AUTO_LAYOUTS.values()]
    res = run_passes(8, "scale.py", passes, ["stats"], timeout=300,
                     env={"TFRING_TIMEOUT": "120", "TFRING_SMALL_THRESHOLD": "4096"})
    return dict(zip(AUTO_LAYOUTS, res))


@pytest.mark.parametrize("layout,expect", [
    # 4 simulated hosts of 2 ranks: 4 KiB by recursive doubling, larger
    # buffers hierarchically (shared memory inside each host).
    ("4x2", ["recdbl", "hier", "hier"]),
    # One rank per host: Rabenseifner for the medium size, then the ring.
    ("8x1", ["recdbl", "rabenseifner", "ring"]),
    # Hosts of 3, 3 and 2 ranks: the host-aware schemes cannot run.
    ("3+3+2", ["recdbl", "rabenseifner", "ring"]),
], ids=["4x2", "8x1", "3+3+2"])
def test_auto_picks_by_size_across_many_hosts(layout, expect):
    res = _auto_passes()[layout]
    for out in res:
        assert [s["algo"] for s in out["stats"]] == expect
        assert all(s["ok"] for s in out["stats"])


def test_auto_keeps_small_scheme_on_two_hosts():
    res = _auto_passes()["2x4"]
    assert {out["stats"][0]["algo"] for out in res} == {"small"}


@pytest.mark.parametrize("n", [32] + ([64] if SLOW else []))
@pytest.mark.parametrize("trial", [0, pytest.param(1, marks=pytest.mark.slow),
                                   pytest.param(2, marks=pytest.mark.slow)])
def test_killed_rank_named_by_every_survivor(trial, n):
    # n ranks on hosts of 4 (simulated); the last rank dies inside a stream
    # of small allreduces. Every survivor exits right after its error.
    # Before the coordinator delivered its abort notice to rank 0 last, a
    # 32-rank trial could see most survivors blame rank 0.
    results = run_ranks(n, "scale.py", ["kill"], env={"TFRING_TIMEOUT": "60"}, timeout=180,
                        per_rank_env=lambda r: {"TFRING_HOSTNAME": f"host{r // 4}"})
    bad = []
    for r in results[:-1]:
        out = r.result
        assert r.returncode == 0 and out is not None, r.stderr[-3000:]
        # The victim is named first, ahead of any rank that noticed it.
        if out["error"] != "PeerFailureError" or first_rank_named(out["message"]) != n - 1:
            bad.append((r.rank, out["error"], out["message"][:300]))
        assert out["elapsed"] is not None and out["elapsed"] < 30, out
    assert results[-1].returncode != 0
    assert bad == [], bad


@pytest.mark.parametrize("n", [16] + ([64, 128] if SLOW else []))
def test_killed_coordinator_named_by_every_survivor(n):
    # Rank 0 runs the coordinator: when it dies mid-stream, every survivor
    # must name rank 0 (the root cause), whichever link it noticed first.
    results = run_ranks(n, "scale.py", ["kill"], timeout=180,
                        env={"TFRING_TIMEOUT": "60", "TEST_VICTIM": "0"},
                        per_rank_env=lambda r: {"TFRING_HOSTNAME": f"host{r // 4}"})
    assert results[0].returncode != 0
    bad = []
    for r in results[1:]:
        out = r.result
        assert r.returncode == 0 and out is not None, r.stderr[-3000:]
        if out["error"] != "PeerFailureError" or first_rank_named(out["message"]) != 0:
            bad.append((r.rank, out["error"], out["message"][:300]))
        assert out["elapsed"] is not None and out["elapsed"] < 30, out
    assert bad == [], bad


def test_timeline_carries_hops_and_bytes(tmp_path):
    # Recursive doubling at 3 ranks: 1 exchange + the fold; ranks 0 (extra)
    # and 2 send the buffer once, rank 1 to rank 2 and the result to rank 0.
    path = str(tmp_path / "timeline.{rank}.json")
    res = check_ok(run_ranks(3, "misc.py", env={"TFRING_TIMELINE": path,
                                                "TFRING_ALLREDUCE_ALGO": "recdbl"}))
    for rank, out in enumerate(res):
        stats = [e for e in out["timeline"] if e.get("name") == "ALLREDUCE_STATS"]
        assert stats, "no ALLREDUCE_STATS event"
        for e in stats:
            a = e["args"]
            assert a["algo"] == "recdbl" and a["ranks"] == 3 and a["hops"] == 3, a
            assert a["bytes_sent"] == a["bytes"] * (1, 2, 1)[rank], (rank, a)


@functools.lru_cache(maxsize=None)
def _host_scheme_passes():
    passes = [{"TFRING_ALLREDUCE_ALGO": a, "TEST_COUNTS": "1024",
               "TFRING_HOSTNAME": [f"host{r // 2}" for r in range(4)]}
              for a in ("oneshot", "hier")]
    res = run_passes(4, "scale.py", passes, ["stats"], env={"TFRING_TIMEOUT": "120"},
                     timeout=300)
    return dict(zip(("oneshot", "hier"), res))


@pytest.mark.parametrize("algo,ran,hops", [("oneshot", "small", 3), ("hier", "hier", 4)])
def test_counters_of_host_schemes(algo, ran, hops):
    # 2 hosts x 2 ranks, 1024 floats in one segment piece: two segment
    # synchronisations plus 1 cross-host step (small) or 2 (hier's ring);
    # each rank sends its 512-float share across once.
    res = _host_scheme_passes()[algo]
    for out in res:
        st = out["stats"][0]
        assert st["ok"] and (st["algo"], st["hops"], st["bytes_sent"]) == (ran, hops, 2048), st


def test_counters_of_one_shot_on_one_host():
    res = _run(3, "stats", {"TFRING_ALLREDUCE_ALGO": "oneshot", "TEST_COUNTS": "1024"})
    for out in res:
        st = out["stats"][0]
        assert st["ok"] and (st["algo"], st["hops"], st["bytes_sent"]) == ("oneshot", 1, 0), st
