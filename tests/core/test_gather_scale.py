"""Allgather and broadcast at scale: the recursive-doubling allgather and
the binomial-tree broadcast (TFRING_ALLGATHER_ALGO, TFRING_BROADCAST_ALGO)
against numpy for any number of ranks (ragged blocks, empty tensors, roots
other than 0, several dtypes), bitwise equal to the ring's outputs; their
hop and byte counters (_core.last_collective_stats) against each
algorithm's formula; the automatic choice across many hosts. Ranks are
core-only processes (tests/workers/gather_scale.py); the configurations a
test compares on the same ranks (the algorithms, the host layouts) run as
passes of one launch (multiproc.run_passes), shared by the tests that read
them. TFRING_TEST_SLOW=1 adds the 64-rank counter check and repeats the
fault trial."""

import functools
import os

import pytest

from multiproc import check_ok, run_passes, run_ranks

SLOW = bool(os.environ.get("TFRING_TEST_SLOW"))
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


def layout(n):
    """(p, log2 p, r) of the recursive pairing: p the largest power of two
    <= n; ranks 2i < 2r are paired, the even one "extra"."""
    p, lg = 1, 0
    while p * 2 <= n:
        p, lg = p * 2, lg + 1
    return p, lg, n - p


def ceil_log2(n):
    return (n - 1).bit_length()


def allgather_expected(algo, rank, n, rb):
    """(hops, bytes_sent) of an allgather of per-rank block sizes rb."""
    total = sum(rb)
    if total == 0 or n == 1:
        return 0, 0
    if algo == "ring":  # every block but the right neighbour's
        return n - 1, total - rb[(rank + 1) % n]
    p, lg, r = layout(n)
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
    p, lg, r = layout(n)
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


@functools.lru_cache(maxsize=None)
def _passes(n, mode, passes, env=()):
    """[pass][rank] results of one launch of n ranks; `passes` and `env` as
    tuples of (var, value) pairs, hashable for the cache."""
    base = dict(env, TFRING_TIMEOUT="120")
    return run_passes(n, "gather_scale.py", [dict(p) for p in passes], [mode], env=base,
                      timeout=300)


def _algo_passes(n, mode, env=()):
    """{(allgather algo, broadcast algo): rank results}: one pass per ENVS entry."""
    res = _passes(n, mode, tuple(tuple(e.items()) for e in ENVS.values()), env)
    return dict(zip(ENVS, res))


def _run(n, mode, env, timeout=300, per_rank_env=None):
    base = {"TFRING_TIMEOUT": "120"}
    base.update(env)
    return check_ok(run_ranks(n, "gather_scale.py", [mode], env=base, timeout=timeout,
                              per_rank_env=per_rank_env))


@pytest.mark.parametrize("n", [2, 3, 5, 8])
def test_correct_and_equal_to_ring(n):
    digests = {}
    for (ag, bc), res in _algo_passes(n, "full").items():
        name = bc
        for r, out in enumerate(res):
            assert out["failures"] == [], f"{name} rank {r}: " + "\n".join(out["failures"][:20])
            ran = {s["algo"] for s in out["stats"]}
            assert ran == {ag, bc}, ran
            assert out["totals"]["allgather"][ag]["calls"] == 35
            assert out["totals"]["broadcast"][bc]["calls"] > 0
        assert len({out["digest"] for out in res}) == 1, f"{name}: ranks differ"
        digests[name] = res[0]["digest"]
    assert len(set(digests.values())) == 1, digests


def _check_counters(n, ag, bc, rows, roots, nbytes):
    res = _algo_passes(n, "stats", (("TEST_ROWS", ";".join(",".join(map(str, x)) for x in rows)),
                                    ("TEST_ROOTS", ",".join(map(str, roots))),
                                    ("TEST_BCAST_BYTES", str(nbytes))))[(ag, bc)]
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
@pytest.mark.parametrize("algos", list(ENVS), ids=["new", "ring", "scatter"])
def test_counters_match_formulas(n, algos):
    # Uniform 4 KiB blocks, ragged blocks with empty ones, one rank only.
    rows = [[512], [r % 3 for r in range(n)], [0] * (n - 1) + [5]]
    roots = sorted({0, 1, 2, n // 2, n - 1})
    per_call = _check_counters(n, *algos, rows, roots, 4096)
    hops = [call[0]["hops"] for call in per_call]
    p, lg, r = layout(n)
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
@pytest.mark.parametrize("algos", list(ENVS), ids=["new", "ring", "scatter"])
def test_counters_at_64_ranks(algos):
    per_call = _check_counters(64, *algos, [[64]], [0, 37], 4096)
    assert [call[0]["hops"] for call in per_call] == {
        "tree": [6, 6, 6], "ring": [63, 63, 63], "scatter_allgather": [6, 12, 12]}[algos[1]]


# The automatic choice on 8 ranks, small threshold 4096, under several
# simulated host layouts: one launch, one pass per case.
AUTO_CASES = {
    # 4 hosts of 2: small outputs by the new algorithms, larger on the ring.
    "4x2": {"TFRING_HOSTNAME": [f"host{r // 2}" for r in range(8)], "TEST_ROWS": "64;4096",
            "TEST_ROOTS": "3", "TEST_BCAST_BYTES": "4096", "TFRING_SMALL_THRESHOLD": "4096"},
    "4x2-bcast": {"TFRING_HOSTNAME": [f"host{r // 2}" for r in range(8)], "TEST_ROWS": "",
                  "TEST_ROOTS": "3", "TEST_BCAST_BYTES": "8192",
                  "TFRING_SMALL_THRESHOLD": "4096"},
    # 8 hosts of 1: up to 256 KiB by the new algorithms.
    "8x1": {"TFRING_HOSTNAME": [f"host{r}" for r in range(8)], "TEST_ROWS": "1024;8192",
            "TEST_ROOTS": "5", "TEST_BCAST_BYTES": str(200 << 10),
            "TFRING_SMALL_THRESHOLD": "4096"},
    # One host: the ring (default threshold).
    "1x8": {"TEST_ROWS": "8", "TEST_ROOTS": "0", "TEST_BCAST_BYTES": "64"},
}


def _auto(case):
    res = _passes(8, "stats", tuple(tuple((k, tuple(v) if isinstance(v, list) else v)
                                          for k, v in c.items()) for c in AUTO_CASES.values()))
    return dict(zip(AUTO_CASES, res))[case]


def test_auto_picks_by_size_across_many_hosts():
    for out in _auto("4x2"):
        assert [(s["collective"], s["algo"], s["ok"]) for s in out["stats"]] == [
            ("allgather", "recdbl", True), ("allgather", "ring", True),
            ("broadcast", "tree", True)]
    assert {out["stats"][0]["algo"] for out in _auto("4x2-bcast")} == {"ring"}


def test_auto_goes_further_with_one_rank_per_host():
    for out in _auto("8x1"):
        assert [(s["algo"], s["ok"]) for s in out["stats"]] == [
            ("recdbl", True), ("ring", True), ("tree", True)]


def test_auto_keeps_ring_on_one_host():
    for out in _auto("1x8"):
        assert [s["algo"] for s in out["stats"]] == ["ring", "ring"]


@pytest.mark.parametrize("trial", [0, pytest.param(1, marks=pytest.mark.slow)])
def test_killed_rank_named_by_every_survivor(trial):
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


def test_timeline_carries_hops_and_bytes(tmp_path):
    # 5 ranks: rank r gathers r+1 rows of two float32, rank 4 broadcasts 100 bytes.
    path = str(tmp_path / "timeline.{rank}.json")
    res = _run(5, "timeline", dict(NEW, TFRING_TIMELINE=path))
    rb = [(r + 1) * 8 for r in range(5)]
    for rank, out in enumerate(res):
        events = {e["name"]: e["args"] for e in out["timeline"]
                  if e.get("name") in ("ALLGATHER_STATS", "BROADCAST_STATS")}
        ag, bc = events["ALLGATHER_STATS"], events["BROADCAST_STATS"]
        assert (ag["algo"], ag["ranks"], ag["bytes"]) == ("recdbl", 5, sum(rb)), ag
        assert (ag["hops"], ag["bytes_sent"]) == allgather_expected("recdbl", rank, 5, rb), ag
        assert (bc["algo"], bc["bytes"]) == ("tree", 100), bc
        assert (bc["hops"], bc["bytes_sent"]) == broadcast_expected("tree", rank, 5, 4, 100), bc


@pytest.mark.parametrize("var,val", [("TFRING_ALLGATHER_ALGO", "bruck"),
                                     ("TFRING_BROADCAST_ALGO", "binomial")])
def test_unknown_algorithm_is_named(var, val):
    results = run_ranks(2, "gather_scale.py", ["stats"], env={var: val}, timeout=60)
    for r in results:
        assert r.returncode != 0
        assert f"{var}={val}" in r.stderr, r.stderr[-2000:]
