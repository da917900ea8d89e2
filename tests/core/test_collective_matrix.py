"""The collective algorithms over a matrix of rank counts, element counts and
tiny chunk sizes, with every rank a thread of this process (as gloo tests
its algorithms): ranks 1-9, 13, 16, 24 and 32; counts from 0 to 10^5 (the
empty buffer, fewer elements than ranks, odd remainders); 64-byte pipeline
chunks and a 4 KiB shared-memory ring, and TCP links. Each job's ranks run
_core_testing.DirectAllreduce (the collectives over real links, without the
engine or the process-wide runtime), so a job of 32 ranks costs a fraction
of a second instead of 32 process starts.

Allreduce (ring, oneshot, recdbl, rabenseifner, auto) sums small integers in
float32, exact, so every rank's result must equal the float64 sum bit for
bit; allgather (ring, recdbl) gathers ragged blocks, empty ones
included; broadcast (ring, tree, scatter_allgather) sends from the ends and
the middle of the ring. The engine, the dtypes and ops, and the host-aware
schemes stay with the multi-process tests (test_collectives, test_scale,
test_algorithms)."""

import secrets
import threading

import numpy as np
import pytest

from tfring import _core, _core_testing

RANKS = [1, 2, 3, 4, 5, 6, 7, 8, 9, 13, 16, 24, 32]
# Links: tiny pipeline chunks and shared-memory ring (the chunked, wrapping
# paths), or TCP with small chunks.
LINKS = {
    "shm": {"TFRING_TRANSPORT": "auto", "TFRING_CHUNK_SIZE": "64", "TFRING_SHM_BUFFER": "4096"},
    "tcp": {"TFRING_TRANSPORT": "tcp", "TFRING_CHUNK_SIZE": "256"},
}
ALLREDUCE = {"shm": ["ring", "oneshot", "recdbl", "rabenseifner", "auto"],
             "tcp": ["ring", "recdbl", "rabenseifner", "auto"]}
JOB_DEADLINE_S = 120


def counts(n):
    return sorted({0, 1, 2, max(n - 1, 1), n, n + 1, 2 * n + 1, 1000, 1001, 65_539, 100_000})


def base(count, salt):
    return ((np.arange(count, dtype=np.int64) * 7 + salt) % 17) - 8


def data(rank, count, salt):
    """Small integers varying by element and rank: float32 sums of up to 32
    ranks are exact, and any element reduced with another's shows."""
    return (base(count, salt) + rank).astype(np.float32)


def summed(n, count, salt):
    """The float64 sum of every rank's data(), in closed form."""
    return (n * base(count, salt) + n * (n - 1) // 2).astype(np.float64)


def block(rank, nbytes, salt):
    return ((np.arange(nbytes, dtype=np.int64) * 31 + rank * 7 + salt) % 251).astype(np.uint8)


def ragged(n, k):
    """Per-rank allgather block sizes in bytes: some empty, all empty for k=0."""
    if k == 0:
        return [0] * n
    return [((r * 5 + k) % 7) * (1 if k < 3 else 300) for r in range(n)]


def roots(n):
    return sorted({0, n // 2, n - 1})


BCAST_BYTES = [0, 1, 1000, 100_003]


def rank_body(direct, rank, n, links):
    """Runs the matrix on one rank; returns a list of failures."""
    failures = []
    salt = 0
    for algo in ALLREDUCE[links]:
        for count in counts(n):
            salt += 1
            x = data(rank, count, salt)
            direct.allreduce(x, algo)
            want = summed(n, count, salt)
            if not np.array_equal(x.astype(np.float64), want):
                bad = np.flatnonzero(x.astype(np.float64) != want)[:5]
                failures.append(f"allreduce {algo} count={count}: elements {bad.tolist()} "
                                f"{x[bad].tolist()} != {want[bad].tolist()}")
    for algo in ("ring", "recdbl"):
        for k in range(5):
            salt += 1
            sizes = ragged(n, k)
            got = direct.allgather(block(rank, sizes[rank], salt), algo)
            want = np.concatenate([block(r, sizes[r], salt) for r in range(n)])
            if not np.array_equal(got, want):
                failures.append(f"allgather {algo} sizes={sizes}: {got.size} bytes differ")
    for algo in ("ring", "tree", "scatter_allgather"):
        for root in roots(n):
            for nbytes in BCAST_BYTES:
                salt += 1
                buf = block(rank, nbytes, salt)
                direct.broadcast(buf, root, algo)
                if not np.array_equal(buf, block(root, nbytes, salt)):
                    failures.append(f"broadcast {algo} root={root} bytes={nbytes}: differs")
    return failures


def run_job(n, links):
    """One job of n ranks, a thread each; returns {rank: failures}."""
    secret = secrets.token_hex(8)
    server = _core.TcpStoreServer("127.0.0.1", 0, secret)
    out, errors = {}, {}

    def rank_thread(r):
        direct = None
        try:
            store = _core.TcpStore("127.0.0.1", server.port, secret, 60.0)
            direct = _core_testing.DirectAllreduce(store, r, n, secret)
            out[r] = rank_body(direct, r, n, links)
        except Exception as e:  # noqa: BLE001 - reported with the rank
            errors[r] = f"{type(e).__name__}: {e}"
        finally:
            if direct is not None:
                direct.close()

    threads = [threading.Thread(target=rank_thread, args=(r,), daemon=True) for r in range(n)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(JOB_DEADLINE_S)
        hung = [r for r, t in enumerate(threads) if t.is_alive()]
        assert not hung, f"ranks {hung} of {n} still running after {JOB_DEADLINE_S} s"
    finally:
        server.stop()
    assert not errors, errors
    return out


@pytest.mark.parametrize("links", sorted(LINKS))
@pytest.mark.parametrize("n", RANKS)
def test_matrix(n, links, monkeypatch):
    # Read by each rank's DirectAllreduce (Config::fromEnv) as it connects.
    monkeypatch.setenv("TFRING_TIMEOUT", "60")
    for k, v in LINKS[links].items():
        monkeypatch.setenv(k, v)
    for var in ("TFRING_ALLREDUCE_ALGO", "TFRING_ALLGATHER_ALGO", "TFRING_BROADCAST_ALGO",
                "TFRING_HOSTNAME"):
        monkeypatch.delenv(var, raising=False)
    out = run_job(n, links)
    assert sorted(out) == list(range(n))
    bad = {r: f[:5] for r, f in out.items() if f}
    assert not bad, bad
