"""The 16-bit wire through the engine on 2 processes (tests/workers/wire16.py):
float16 and bfloat16 sums against the core's own cast-then-sum path, an
average near float16's limit, integers left alone, tensors on different
wires submitted together, and ranks that disagree on the wire. One launch,
three passes: the pipelined ring with a tiny chunk, TCP links, and auto on
one host's shared memory (the wire served at float32). Then 3 ranks on 3
pretend hosts (Rabenseifner on the wire, with its fold; the ring; auto,
which runs the ring below 16 ranks), 16 ranks under auto (Rabenseifner,
slow), and the hierarchical algorithm on 4 ranks over 2 pretend hosts."""

import pytest

from multiproc import check_ok, run_passes, run_ranks

PASSES = [{"TFRING_CHUNK_SIZE": "256", "TFRING_SHM_BUFFER": "8192",
           "TFRING_ALLREDUCE_ALGO": "ring"},
          {"TFRING_TRANSPORT": "tcp", "TFRING_ALLREDUCE_ALGO": "ring"},
          {"TFRING_ALLREDUCE_ALGO": "auto"}]


def test_wire16_engine():
    per_pass = run_passes(2, "wire16.py", PASSES, timeout=90)
    # auto on one host's shared memory: no link to save, the sum at float32.
    for rank in per_pass[-1]:
        auto = rank["auto"]
        assert auto["same_as_plain"] and auto["wire"] == "none", auto
        assert auto["algo"] == "ring" and auto["digest"] == per_pass[-1][0]["auto"]["digest"]
    for p, ranks in enumerate(per_pass[:-1]):
        r0 = ranks[0]
        for wire in ("float16", "bfloat16"):
            assert ranks[1][wire]["digest"] == r0[wire]["digest"], (p, wire)
            assert r0[wire]["emulated"], (p, wire)
            assert r0[wire]["stats"]["wire"] == wire, r0[wire]["stats"]
            assert r0[wire]["stats"]["bytes_sent"] == 100_003 * 2, r0[wire]["stats"]
            assert r0[wire]["in_ring"][0] <= 2.0, (p, r0[wire])  # 2 roundings
        fp16 = r0["float16"]
        assert fp16["in_ring"][0] < fp16["cast_then_sum"][0], fp16
        assert fp16["in_ring"][1] < fp16["cast_then_sum"][1], fp16
        avg = r0["average"]
        assert avg["finite"] and avg["within"] and not avg["cast_finite"], avg
        assert ranks[1]["average"]["digest"] == avg["digest"]
        assert r0["ints"], r0
        assert all(r0["fused"].values()), r0["fused"]
        for rank, out in enumerate(ranks):
            msg = out["mismatch"]
            assert msg and "wire dtype" in msg and "'mismatch'" in msg, (rank, msg)
            assert "float16 on rank 0" in msg and "bfloat16 on rank 1" in msg, msg
            assert "allreduce only" in out["allgather"], out["allgather"]


def check_hosts(per_pass, algos):
    for p, algo in enumerate(algos):
        ranks = per_pass[p]
        for key in ("float16", "bfloat16", "group"):
            assert all(r[key]["digest"] == ranks[0][key]["digest"] for r in ranks), (p, key)
        for rank, out in enumerate(ranks):
            for wire in ("float16", "bfloat16"):
                got = out[wire]
                assert got["stats"]["algo"] == algo and got["stats"]["wire"] == wire, got
                assert got["emulated"], (p, rank, wire)
                if algo == "rabenseifner":
                    assert got["stats"]["bytes_sent"] == got["bytes"], (rank, got)
            assert out["group"]["emulated"] and out["group"]["algo"] == algo, out["group"]


def on_hosts(r):
    return {"TFRING_HOSTNAME": f"host{r}"}


def test_wire16_hosts():
    """One rank per pretend host: Rabenseifner on the wire (a fold: 3
    ranks) bit for bit its emulation, the bytes that scheme sends,
    identical on every rank, fused tensors too (packed); the ring; and auto,
    which keeps the ring below 16 ranks."""
    passes = [{"TFRING_ALLREDUCE_ALGO": "rabenseifner"}, {"TFRING_ALLREDUCE_ALGO": "ring"}, {}]
    check_hosts(run_passes(3, "wire16_hosts.py", passes, per_rank_env=on_hosts, timeout=90),
                ("rabenseifner", "ring", "ring"))


@pytest.mark.slow
def test_wire16_hosts_16_ranks():
    """From 16 ranks between hosts, auto runs the wire on Rabenseifner."""
    check_hosts(run_passes(16, "wire16_hosts.py", [{}], per_rank_env=on_hosts, timeout=240),
                ("rabenseifner",))


def test_wire16_hier():
    """Two pretend hosts of two ranks: hier's cross-host ring carries the
    16-bit words (half the bytes), shared memory sums at float32."""
    ranks = check_ok(run_ranks(4, "wire16_hier.py", env={"TFRING_ALLREDUCE_ALGO": "hier"},
                               per_rank_env=lambda r: {"TFRING_HOSTNAME": f"host{r // 2}"},
                               timeout=90))
    for out in ranks:
        assert out["digest"] == ranks[0]["digest"]
        assert out["wired"]["algo"] == "hier" and out["wired"]["wire"] == "float16", out
        assert out["wired"]["bytes_sent"] * 2 == out["plain"]["bytes_sent"], out
        assert out["within"] and out["error"][0] <= 2.0, out
