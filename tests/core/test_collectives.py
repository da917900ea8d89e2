"""Every collective against numpy float64 references, across world sizes,
transports, dtypes, ops and element counts (including 0, 1, fewer than
ranks, not divisible by ranks, and many chunks). The transports or settings
a test compares on the same ranks run as passes of one launch
(multiproc.run_passes), shared by the tests that read them."""

import functools

import numpy as np
import pytest

from multiproc import check_ok, run_passes, run_ranks

# Tiny pipeline chunks and shared-memory rings so small tensors exercise the
# chunked, wrapping paths.
SMALL = {"TFRING_CHUNK_SIZE": "256", "TFRING_SHM_BUFFER": "4096"}


@functools.lru_cache(maxsize=None)
def _passes(n, mode, passes):
    """[pass][rank] results of one launch; `passes` a tuple of tuples of
    (var, value) pairs (hashable for the cache)."""
    return run_passes(n, "collectives.py", [dict(SMALL, **dict(p)) for p in passes], [mode],
                      timeout=240)


def _transports(n, mode, transport, transports=("auto",)):
    """The results under `transport` of one launch that runs each of
    `transports` as a pass."""
    res = _passes(n, mode, tuple((("TFRING_TRANSPORT", t),) for t in transports))
    return _check(res[transports.index(transport)])


def _check(res):
    for r, out in enumerate(res):
        assert out["failures"] == [], f"rank {r}: " + "\n".join(out["failures"][:20])
    digests = {out["digest"] for out in res}
    assert len(digests) == 1, "ranks ended with different results"
    return res


# The sizes whose shared-memory and TCP runs share one launch.
BOTH = ("auto", "tcp")


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_shm_all_dtypes(n):
    res = _transports(n, "full", "auto", BOTH if n in (2, 3) else ("auto",))
    if n > 1:
        assert {r["transport"] for r in res} == {"shm"}
    assert [r["local_rank"] for r in res] == list(range(n))
    assert {r["local_size"] for r in res} == {n}
    assert {r["cross_size"] for r in res} == {1}


@pytest.mark.parametrize("n", [2, 3])
def test_tcp_all_dtypes(n):
    res = _transports(n, "full", "tcp", BOTH)
    assert {r["transport"] for r in res} == {"tcp"}


@pytest.mark.parametrize("n,transport", [(2, "auto"), (3, "auto"), (2, "tcp")])
def test_large_allreduces_in_rounds_with_default_buffers(n, transport):
    # Default chunk and shared-memory sizes (and a large allgather and
    # reducescatter after the allreduces): a chunk is reduced straight into
    # the right link as soon as it arrives (with the tiny buffers above the
    # send stream is mostly still busy then), average's scale included. Over
    # TCP the rounds run without that forwarding.
    env = {"TFRING_TRANSPORT": transport}
    res = check_ok(run_ranks(n, "collectives.py", ["big"], env=env, timeout=240))
    for r, out in enumerate(res):
        assert out["failures"] == [], f"rank {r}: " + "\n".join(out["failures"][:20])
    assert len({out["digest"] for out in res}) == 1, "ranks ended with different results"
    # Each rank's right link learned how to write (collectives/store_tuner.h):
    # the 4 KiB allreduce was not counted; the 4 blocking allreduces of
    # 8 MiB or more were, as large (and the batch, as large if it fused to
    # 8 MiB, else in parts as medium); each tuner that ran measured both
    # store modes.
    for out in res:
        assert out["modes_before"] == out["modes_small"], out["modes_small"]
        assert all(m["calls"] == 0 for m in out["modes_small"].values())
        large, medium = out["modes"]["large"], out["modes"]["medium"]
        assert large["calls"] in (4, 5), out["modes"]
        for m in (large, medium) if medium["calls"] >= 2 else (large,):
            assert m["ordinary_s_per_byte"] > 0 and m["streaming_s_per_byte"] > 0, out["modes"]


@pytest.mark.parametrize("transport", ["auto", "tcp"])
def test_seven_ranks_oversubscribed(transport):
    _transports(7, "full", transport, BOTH)


def test_fusion_on_and_off_agree():
    fused, unfused = (_check(res) for res in _passes(3, "quick", (
        (("TFRING_TRANSPORT", "auto"), ("TFRING_FUSION_THRESHOLD", "64M")),
        (("TFRING_TRANSPORT", "auto"), ("TFRING_FUSION_THRESHOLD", "0")))))
    # Fusion moves tensors between ring segments, which changes the order in
    # which float sums are accumulated; order-independent results must match
    # bit for bit, the rest are checked against the reference in both runs.
    assert fused[0]["exact_digest"] == unfused[0]["exact_digest"]


@pytest.mark.parametrize("fusion", ["64M", "0"])
def test_out_of_order_submission(fusion):
    res = check_ok(run_ranks(3, "ordering.py", env={"TFRING_FUSION_THRESHOLD": fusion,
                                                    "TFRING_CYCLE_TIME": "5"}, timeout=120))
    for r, out in enumerate(res):
        assert out["failures"] == [], f"rank {r}: {out['failures']}"
    assert len({out["digest"] for out in res}) == 1


def test_two_simulated_hosts_mix_shm_and_tcp():
    # TFRING_HOSTNAME overrides host identity: ranks 0-1 on "a", 2-3 on "b".
    res = check_ok(run_ranks(4, "collectives.py", ["quick"], env=SMALL,
                             per_rank_env=lambda r: {"TFRING_HOSTNAME": "a" if r < 2 else "b"},
                             timeout=240))
    for r, out in enumerate(res):
        assert out["failures"] == [], out["failures"][:10]
        assert out["transport"] == "shm+tcp"
        assert (out["local_rank"], out["local_size"]) == (r % 2, 2)
        assert (out["cross_rank"], out["cross_size"]) == (r // 2, 2)
    assert len({out["digest"] for out in res}) == 1


def test_rank_zeros_fusion_settings_hold_for_every_rank():
    # Ranks that fused differently would run different collectives against
    # each other: rank 0's TFRING_FUSION_THRESHOLD and TFRING_CYCLE_TIME win,
    # and the others say so.
    env = {0: {"TFRING_FUSION_THRESHOLD": "64M", "TFRING_CYCLE_TIME": "5"},
           1: {"TFRING_FUSION_THRESHOLD": "0", "TFRING_CYCLE_TIME": "0"},
           2: {"TFRING_FUSION_THRESHOLD": "1K", "TFRING_CYCLE_TIME": "1"}}
    res = run_ranks(3, "ordering.py", per_rank_env=lambda r: env[r], timeout=120)
    outs = check_ok(res)
    for r, out in enumerate(outs):
        assert out["failures"] == [], f"rank {r}: {out['failures']}"
    assert len({out["digest"] for out in outs}) == 1
    assert "using rank 0's TFRING_FUSION_THRESHOLD=67108864" not in res[0].stderr
    for r in (1, 2):
        assert "using rank 0's TFRING_FUSION_THRESHOLD=67108864 and TFRING_CYCLE_TIME=5" \
            in res[r].stderr, res[r].stderr[-2000:]


@pytest.mark.parametrize("n", [2, 3])
def test_unnamed_collectives_train_like_one_process_on_the_full_batch(n):
    # Gradients of two shapes averaged by unnamed calls (blocking and async),
    # whose names come from the call order: the weights follow a float64
    # single-process run on the whole batch.
    for r, out in enumerate(check_ok(run_ranks(n, "unnamed.py", ["train"], timeout=90))):
        np.testing.assert_allclose(out["w"], out["w_ref"], rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(out["b"], out["b_ref"], rtol=1e-4, atol=1e-5)
        print(f"rank {r}: 20 steps of 2 unnamed allreduces: {out['last20_s'] * 1e3:.1f} ms")
