"""Collectives at scale: allreduce (recursive doubling, Rabenseifner, the
host schemes), allgather (recursive doubling) and broadcast (binomial tree,
scatter-allgather) for any number of ranks against numpy float64
references, bitwise equal on every rank and to the ring's outputs; the hop
and byte counters of every algorithm (_core.last_collective_stats) against
its formula; the automatic choice across many simulated hosts; a rank
killed inside a large job named by every survivor; unknown algorithms
named. Ranks are core-only processes (tests/workers/scale.py,
gather_scale.py); the configurations a test compares on the same ranks
(the algorithms, the host layouts, allreduce beside allgather/broadcast)
run as passes of one launch (multiproc.run_passes, with
workers/collective_scale.py), shared by the tests that read them.
TFRING_TEST_SLOW=1 adds the 64-rank counter and fault checks and repeats
the fault trials."""

import functools
import os

import pytest

from multiproc import check_ok, first_rank_named, run_passes, run_ranks

SLOW = bool(os.environ.get("TFRING_TEST_SLOW"))
ALGOS = ["ring", "recdbl", "rabenseifner"]
# (allgather, broadcast) algorithms, as the environment that selects them.
NEW = {"TFRING_ALLGATHER_ALGO": "recdbl", "TFRING_BROADCAST_ALGO": "tree"}
RING = {"TFRING_ALLGATHER_ALGO": "ring", "TFRING_BROADCAST_ALGO": "ring"}
SCATTER = {"TFRING_ALLGATHER_ALGO": "recdbl", "TFRING_BROADCAST_ALGO": "scatter_allgather"}
ENVS = {("recdbl", "tree"): NEW, ("ring", "ring"): RING, ("recdbl", "scatter_allgather"): SCATTER}


def even_split(count, parts):
    base, extra = divmod(count, parts)
    off = [0]
    for i in range(parts):
        off.append(off[-1] + base + (1 if i < extra else 0))
    return off


def pairing(n):
    """(p, log2 p, r) of the recursive pairing: p the largest power of two
    <= n; ranks 2i < 2r are paired, the even one "extra" (it hands its data
    to the odd one and gets the result back)."""
    p, lg = 1, 0
    while p * 2 <= n:
        p, lg = p * 2, lg + 1
    return p, lg, n - p


def ceil_log2(n):
    return (n - 1).bit_length()


def allreduce_expected(algo, rank, n, count, es=4):
    """(hops, bytes_sent) of one allreduce of `count` elements."""
    b = count * es
    p, lg, r = pairing(n)
    extra, fold = rank < 2 * r and rank % 2 == 0, rank < 2 * r and rank % 2 == 1
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


def allgather_expected(algo, rank, n, rb):
    """(hops, bytes_sent) of an allgather of per-rank block sizes rb."""
    total = sum(rb)
    if total == 0 or n == 1:
        return 0, 0
    if algo == "ring":  # every block but the right neighbour's
        return n - 1, total - rb[(rank + 1) % n]
    p, lg, r = pairing(n)
    hops = lg + (2 if r else 0)
    if rank < 2 * r and rank % 2 == 0:  # extra: hands in its block only
        return hops, rb[rank]
    v = rank // 2 if rank < 2 * r else rank - r
    first = lambda w: 2 * w if w < r else w + r  # noqa: E731 - first rank of virtual rank w
    off = [0]
    for b in rb:
        off.append(off[-1] + b)
    sent, m = 0, 1
    while m < p:  # my aligned range of virtual ranks, doubling
        lo = v & ~(m - 1)
        sent += off[first(lo + m)] - off[first(lo)]
        m *= 2
    if rank < 2 * r:  # everything but the extra rank's own block
        sent += total - rb[rank - 1]
    return hops, sent


def broadcast_expected(algo, rank, n, root, b):
    if b == 0 or n == 1:
        return 0, 0
    if algo == "ring":  # all but the root's left neighbour forward
        return n - 1, 0 if (rank - root) % n == n - 1 else b
    p, lg, r = pairing(n)
    root_extra = root < 2 * r and root % 2 == 0
    other_extras = r > 1 or (r == 1 and root != 0)
    steps = lg if algo == "tree" else 2 * lg  # scatter_allgather: scatter, then allgather
    hops = steps + root_extra + other_extras
    if rank < 2 * r and rank % 2 == 0:
        return hops, b if rank == root else 0
    v = rank // 2 if rank < 2 * r else rank - r
    vr = root // 2 if root < 2 * r else root - r
    u = v ^ vr
    unfold = b if rank < 2 * r and rank - 1 != root else 0  # to my extra rank, unless the root
    if algo == "tree":
        children = lg if u == 0 else (u & -u).bit_length() - 1
        return hops, children * b + unfold
    off = even_split(b, p)  # block i belongs to u == i
    top = p if u == 0 else u & -u
    sent, m = 0, top // 2
    while m >= 1:  # scatter: blocks [u+m, u+2m) to u+m
        sent += off[u + 2 * m] - off[u + m]
        m //= 2
    m = 1
    while m < p:  # allgather: my aligned range
        lo = u & ~(m - 1)
        sent += off[lo + m] - off[lo]
        m *= 2
    return hops, sent + unfold


# ------------------------------------------------------------------ launches --

def _hashable(env):
    return tuple((k, tuple(v) if isinstance(v, list) else v) for k, v in env.items())


@functools.lru_cache(maxsize=None)
def _passes(n, mode, passes):
    """[pass][rank] results of one launch of n ranks of
    workers/collective_scale.py; `passes` as tuples of (var, value) pairs,
    hashable for the cache."""
    return run_passes(n, "collective_scale.py",
                      [{k: list(v) if isinstance(v, tuple) else v for k, v in p} for p in passes],
                      [mode], env={"TFRING_TIMEOUT": "120"}, timeout=300)


def _launch(n, mode, passes):
    """{pass name: rank results} of one launch; `passes` maps names to
    environments, each with its TEST_BODY."""
    res = _passes(n, mode, tuple(_hashable(e) for e in passes.values()))
    return dict(zip(passes, res))


def _allreduce_pass(algo, **env):
    return dict(TEST_BODY="allreduce", TFRING_ALLREDUCE_ALGO=algo, **env)


def _gather_pass(algos, **env):
    return dict(ENVS[algos], TEST_BODY="gather", **env)


def _run(n, worker, mode, env, timeout=300, per_rank_env=None):
    base = {"TFRING_TIMEOUT": "120"}
    base.update(env)
    return check_ok(run_ranks(n, worker, [mode], env=base, timeout=timeout,
                              per_rank_env=per_rank_env))


# --------------------------------------------------------------- correctness --

GATHER_NS = (2, 3, 5, 8)


def _full(n):
    """Every dtype and op of recursive doubling and Rabenseifner on n ranks,
    and (n in GATHER_NS) allgather and broadcast by each ENVS pair: one
    launch."""
    passes = {a: _allreduce_pass(a) for a in ("recdbl", "rabenseifner")}
    if n in GATHER_NS:
        passes.update({algos: _gather_pass(algos) for algos in ENVS})
    return _launch(n, "full", passes)


@pytest.mark.parametrize("algo", ["recdbl", "rabenseifner"])
@pytest.mark.parametrize("n", [2, 3, 4, 5, 7, 8])
def test_allreduce_correct_any_n(algo, n):
    res = _full(n)[algo]
    for r, out in enumerate(res):
        assert out["failures"] == [], f"rank {r}: " + "\n".join(out["failures"][:20])
        assert {k for k, v in out["counts"].items() if v} == {algo}, out["counts"]
        for st in out["stats"]:
            assert st["algo"] == algo and st["ranks"] == n
            assert st["hops"] == allreduce_expected(algo, r, n, 1)[0], st
    assert len({out["digest"] for out in res}) == 1, "ranks ended with different results"


def test_allreduce_correct_thirteen_ranks():
    res = _run(13, "scale.py", "full", {"TFRING_ALLREDUCE_ALGO": "rabenseifner"})
    for r, out in enumerate(res):
        assert out["failures"] == [], f"rank {r}: " + "\n".join(out["failures"][:20])
    assert len({out["digest"] for out in res}) == 1


@pytest.mark.parametrize("n", GATHER_NS)
def test_gather_correct_and_equal_to_ring(n):
    digests = {}
    full = _full(n)
    for ag, bc in ENVS:
        res, name = full[(ag, bc)], bc
        for r, out in enumerate(res):
            assert out["failures"] == [], f"{name} rank {r}: " + "\n".join(out["failures"][:20])
            ran = {s["algo"] for s in out["stats"]}
            assert ran == {ag, bc}, ran
            assert out["totals"]["allgather"][ag]["calls"] == 35
            assert out["totals"]["broadcast"][bc]["calls"] > 0
        assert len({out["digest"] for out in res}) == 1, f"{name}: ranks differ"
        digests[name] = res[0]["digest"]
    assert len(set(digests.values())) == 1, digests


# ------------------------------------------------------------------ counters --

def _gather_calls(n):
    """(allgather rows per call, broadcast roots) of the counter check."""
    if n == 64:
        return [[64]], [0, 37]
    # Uniform 4 KiB blocks, ragged blocks with empty ones, one rank only.
    rows = [[512], [r % 3 for r in range(n)], [0] * (n - 1) + [5]]
    return rows, sorted({0, 1, 2, n // 2, n - 1})


def _stats(n):
    """The counters of every allreduce algorithm and every (allgather,
    broadcast) pair on n ranks: one launch."""
    counts = ",".join(map(str, _allreduce_counts(n)))
    rows, roots = _gather_calls(n)
    gather = {"TEST_ROWS": ";".join(",".join(map(str, x)) for x in rows),
              "TEST_ROOTS": ",".join(map(str, roots)), "TEST_BCAST_BYTES": "4096"}
    passes = {a: _allreduce_pass(a, TEST_COUNTS=counts) for a in ALGOS}
    passes.update({algos: _gather_pass(algos, **gather) for algos in ENVS})
    return _launch(n, "stats", passes)


def _allreduce_counts(n):
    return [1024] if n == 64 else [1024, 1001, 3]  # 1001 floats do not split evenly


def _check_allreduce_stats(n, algo):
    res = _stats(n)[algo]
    for r, out in enumerate(res):
        assert [st["count"] for st in out["stats"]] == _allreduce_counts(n)
        for st in out["stats"]:
            assert st["ok"], st
            hops, sent = allreduce_expected(algo, r, n, st["count"])
            assert (st["algo"], st["hops"], st["bytes_sent"]) == (algo, hops, sent), (r, st)
        tot = out["totals"][algo]
        assert tot["calls"] == len(out["stats"])
        assert tot["hops"] == sum(st["hops"] for st in out["stats"])
    return res


def _check_gather_stats(n, ag, bc):
    rows, roots = _gather_calls(n)
    nbytes = 4096
    res = _stats(n)[(ag, bc)]
    per_call = list(zip(*[out["stats"] for out in res]))  # [call][rank]
    assert len(per_call) == len(rows) + len(roots)
    for call in per_call[:len(rows)]:
        rb = [row * 8 for row in call[0]["rows"]]  # float32 pairs
        for r, st in enumerate(call):
            assert st["ok"] and st["collective"] == "allgather" and st["algo"] == ag, st
            assert (st["hops"], st["bytes_sent"]) == allgather_expected(ag, r, n, rb), (r, st)
        # Every rank receives every block but its own exactly once.
        assert sum(st["bytes_sent"] for st in call) == (n - 1) * sum(rb)
    for call in per_call[len(rows):]:
        root = call[0]["root"]
        for r, st in enumerate(call):
            assert st["ok"] and st["collective"] == "broadcast" and st["algo"] == bc, st
            assert (st["hops"], st["bytes_sent"]) == broadcast_expected(bc, r, n, root,
                                                                        nbytes), (r, st)
        if bc != "scatter_allgather":  # every rank but the root receives it once
            assert sum(st["bytes_sent"] for st in call) == (n - 1) * nbytes
    for out in res:
        assert out["totals"]["allgather"][ag]["calls"] == len(rows)
        assert out["totals"]["broadcast"][bc]["calls"] == len(roots)
    return per_call


@pytest.mark.parametrize("n", [8, 13, 16])
@pytest.mark.parametrize("algo", ALGOS)
def test_allreduce_counters_match_formulas(n, algo):
    _check_allreduce_stats(n, algo)


@pytest.mark.parametrize("n", [8, 13, 16])
@pytest.mark.parametrize("algos", list(ENVS), ids=["new", "ring", "scatter"])
def test_gather_counters_match_formulas(n, algos):
    per_call = _check_gather_stats(n, *algos)
    hops = [call[0]["hops"] for call in per_call]
    p, lg, r = pairing(n)
    if algos[0] == "ring":
        assert set(hops) == {n - 1}
    elif algos[1] == "scatter_allgather":
        for call in per_call[3:]:
            root = call[0]["root"]
            assert call[0]["hops"] == 2 * lg + (root < 2 * r and root % 2 == 0) + (
                r > 1 or (r == 1 and root != 0))
    else:
        assert hops[:3] == [ceil_log2(n) + (1 if r else 0)] * 3
        for call in per_call[3:]:  # ceil(log2 n), one more for an extra root
            root = call[0]["root"]
            assert call[0]["hops"] == ceil_log2(n) + (root < 2 * r and root % 2 == 0)


@pytest.mark.skipif(not SLOW, reason="64 ranks on a small machine: TFRING_TEST_SLOW=1")
@pytest.mark.parametrize("algo", ALGOS)
def test_allreduce_counters_at_64_ranks(algo):
    res = _check_allreduce_stats(64, algo)
    hops = res[0]["stats"][0]["hops"]
    assert hops == {"ring": 126, "recdbl": 6, "rabenseifner": 12}[algo]


@pytest.mark.skipif(not SLOW, reason="64 ranks on a small machine: TFRING_TEST_SLOW=1")
@pytest.mark.parametrize("algos", list(ENVS), ids=["new", "ring", "scatter"])
def test_gather_counters_at_64_ranks(algos):
    per_call = _check_gather_stats(64, *algos)
    assert [call[0]["hops"] for call in per_call] == {
        "tree": [6, 6, 6], "ring": [63, 63, 63], "scatter_allgather": [6, 12, 12]}[algos[1]]


# ----------------------------------------------------------- automatic choice --

# The automatic choice on 8 ranks under several simulated host layouts
# (small threshold 4096 unless the default is the point): one launch, one
# pass per case.
SMALL = {"TFRING_SMALL_THRESHOLD": "4096"}
AUTO_CASES = {
    "4x2": _allreduce_pass("auto", TFRING_HOSTNAME=[f"host{r // 2}" for r in range(8)],
                           TEST_COUNTS="1024,16384,524288", **SMALL),
    "8x1": _allreduce_pass("auto", TFRING_HOSTNAME=[f"host{r}" for r in range(8)],
                           TEST_COUNTS="1024,16384,524288", **SMALL),
    "3+3+2": _allreduce_pass("auto", TFRING_HOSTNAME=[f"host{r // 3}" for r in range(8)],
                             TEST_COUNTS="1024,16384,524288", **SMALL),
    "2x4": _allreduce_pass("auto", TFRING_HOSTNAME=[f"host{r // 4}" for r in range(8)],
                           TEST_COUNTS="1024", **SMALL),
    # allgather and broadcast on 4 hosts of 2: small outputs by the new
    # algorithms, larger on the ring.
    "gather 4x2": {"TEST_BODY": "gather", "TFRING_HOSTNAME": [f"host{r // 2}" for r in range(8)],
                   "TEST_ROWS": "64;4096", "TEST_ROOTS": "3", "TEST_BCAST_BYTES": "4096",
                   **SMALL},
    "gather 4x2-bcast": {"TEST_BODY": "gather",
                         "TFRING_HOSTNAME": [f"host{r // 2}" for r in range(8)],
                         "TEST_ROWS": "", "TEST_ROOTS": "3", "TEST_BCAST_BYTES": "8192", **SMALL},
    # 8 hosts of 1: up to 256 KiB by the new algorithms.
    "gather 8x1": {"TEST_BODY": "gather", "TFRING_HOSTNAME": [f"host{r}" for r in range(8)],
                   "TEST_ROWS": "1024;8192", "TEST_ROOTS": "5",
                   "TEST_BCAST_BYTES": str(200 << 10), **SMALL},
    # One host: the ring (default threshold).
    "gather 1x8": {"TEST_BODY": "gather", "TEST_ROWS": "8", "TEST_ROOTS": "0",
                   "TEST_BCAST_BYTES": "64"},
}


def _auto(case):
    return _launch(8, "stats", AUTO_CASES)[case]


@pytest.mark.parametrize("layout,expect", [
    # 4 simulated hosts of 2 ranks: 4 KiB by recursive doubling, larger
    # buffers hierarchically (shared memory inside each host).
    ("4x2", ["recdbl", "hier", "hier"]),
    # One rank per host: Rabenseifner for the medium size, then the ring.
    ("8x1", ["recdbl", "rabenseifner", "ring"]),
    # Hosts of 3, 3 and 2 ranks: the host-aware schemes cannot run.
    ("3+3+2", ["recdbl", "rabenseifner", "ring"]),
], ids=["4x2", "8x1", "3+3+2"])
def test_allreduce_auto_picks_by_size_across_many_hosts(layout, expect):
    for out in _auto(layout):
        assert [s["algo"] for s in out["stats"]] == expect
        assert all(s["ok"] for s in out["stats"])


def test_allreduce_auto_keeps_small_scheme_on_two_hosts():
    assert {out["stats"][0]["algo"] for out in _auto("2x4")} == {"small"}


def test_gather_auto_picks_by_size_across_many_hosts():
    for out in _auto("gather 4x2"):
        assert [(s["collective"], s["algo"], s["ok"]) for s in out["stats"]] == [
            ("allgather", "recdbl", True), ("allgather", "ring", True),
            ("broadcast", "tree", True)]
    assert {out["stats"][0]["algo"] for out in _auto("gather 4x2-bcast")} == {"ring"}


def test_gather_auto_goes_further_with_one_rank_per_host():
    for out in _auto("gather 8x1"):
        assert [(s["algo"], s["ok"]) for s in out["stats"]] == [
            ("recdbl", True), ("ring", True), ("tree", True)]


def test_gather_auto_keeps_ring_on_one_host():
    for out in _auto("gather 1x8"):
        assert [s["algo"] for s in out["stats"]] == ["ring", "ring"]


# -------------------------------------------------------------- host schemes --

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
    res = _run(3, "scale.py", "stats",
               {"TFRING_ALLREDUCE_ALGO": "oneshot", "TEST_COUNTS": "1024"})
    for out in res:
        st = out["stats"][0]
        assert st["ok"] and (st["algo"], st["hops"], st["bytes_sent"]) == ("oneshot", 1, 0), st


# -------------------------------------------------------------------- faults --

@pytest.mark.parametrize("n", [32] + ([64] if SLOW else []))
@pytest.mark.parametrize("trial", [0, pytest.param(1, marks=pytest.mark.slow),
                                   pytest.param(2, marks=pytest.mark.slow)])
def test_allreduce_killed_rank_named_by_every_survivor(trial, n):
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


@pytest.mark.parametrize("trial", [0, pytest.param(1, marks=pytest.mark.slow)])
def test_gather_killed_rank_named_by_every_survivor(trial):
    # The last of 8 ranks dies inside a stream of tree broadcasts and
    # recursive-doubling allgathers: every survivor names it, quickly.
    n = 8
    results = run_ranks(n, "gather_scale.py", ["kill"], env=dict(NEW, TFRING_TIMEOUT="60"),
                        timeout=180)
    bad = []
    for r in results[:-1]:
        out = r.result
        assert r.returncode == 0 and out is not None, r.stderr[-3000:]
        if out["error"] != "PeerFailureError" or f"rank {n - 1}" not in out["message"]:
            bad.append((r.rank, out["error"], out["message"][:300]))
        assert out["elapsed"] is not None and out["elapsed"] < 30, out
    assert results[-1].returncode != 0
    assert bad == [], bad


@pytest.mark.parametrize("var,val", [("TFRING_ALLGATHER_ALGO", "bruck"),
                                     ("TFRING_BROADCAST_ALGO", "binomial")])
def test_unknown_algorithm_is_named(var, val):
    results = run_ranks(2, "gather_scale.py", ["stats"], env={var: val}, timeout=60)
    for r in results:
        assert r.returncode != 0
        assert f"{var}={val}" in r.stderr, r.stderr[-2000:]


# ------------------------------------------------------------------ timeline --

def test_allreduce_timeline_carries_hops_and_bytes(tmp_path):
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


def test_gather_timeline_carries_hops_and_bytes(tmp_path):
    # 5 ranks: rank r gathers r+1 rows of two float32, rank 4 broadcasts 100 bytes.
    path = str(tmp_path / "timeline.{rank}.json")
    res = _run(5, "gather_scale.py", "timeline", dict(NEW, TFRING_TIMELINE=path))
    rb = [(r + 1) * 8 for r in range(5)]
    for rank, out in enumerate(res):
        events = {e["name"]: e["args"] for e in out["timeline"]
                  if e.get("name") in ("ALLGATHER_STATS", "BROADCAST_STATS")}
        ag, bc = events["ALLGATHER_STATS"], events["BROADCAST_STATS"]
        assert (ag["algo"], ag["ranks"], ag["bytes"]) == ("recdbl", 5, sum(rb)), ag
        assert (ag["hops"], ag["bytes_sent"]) == allgather_expected("recdbl", rank, 5, rb), ag
        assert (bc["algo"], bc["bytes"]) == ("tree", 100), bc
        assert (bc["hops"], bc["bytes_sent"]) == broadcast_expected("tree", rank, 5, 4, 100), bc
