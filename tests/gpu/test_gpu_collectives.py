"""GPU collectives in multi-process jobs (tests/workers/gpu.py): several ranks
sharing GPU 0 over the CUDA-IPC ring (its ring, one-shot and two-shot
allreduce), the host-staged ring and NCCL, a GPU per rank and simulated
hosts, steps completed on their GPU stream, a dead peer failing every rank
fast, and the warning about a shared GPU without MPS. Need a GPU, or the
CUDA emulation build (tests/gpu_emu.sh); skipped cleanly without one,
except the import-time setting of CUDA_DEVICE_MAX_CONNECTIONS."""

import os
import subprocess
import sys

import pytest

from gpu_util import requires_gpu
from multiproc import check_ok, check_peer_failure, run_ranks
from tfring import _core


def _cupy():
    try:
        import cupy

        return cupy
    except Exception:  # noqa: BLE001  (ImportError, or CUDA errors on import)
        return None


GATED_DEADLINE_S = 90  # the stream-completion jobs


def _gpu_job(n, mode, env=None, timeout=300, gpu_per_rank=False, per_rank_env=None):
    """Runs tests/workers/gpu.py on n ranks, all on GPU 0 or (gpu_per_rank)
    each on GPU local_rank % count; checks every rank's results and that all
    ranks agree bit for bit."""
    # Ranks time-sliced on one GPU (no MPS, as on the emulation) would stage
    # small allreduces through host memory; the ring is what these check.
    e = {"TFRING_GPU_CHUNK_SIZE": "64K", "TFRING_GPU_STAGED_MAX": "0"}
    if not gpu_per_rank:
        e["TFRING_TEST_DEVICE"] = "0"
    if _cupy() is not None:
        e["TFRING_TEST_ARRAYS"] = "cupy"
    e.update(env or {})
    res = check_ok(run_ranks(n, "gpu.py", [mode], env=e, timeout=timeout,
                             per_rank_env=per_rank_env))
    for r, out in enumerate(res):
        assert out["failures"] == [], f"rank {r}: " + "\n".join(out["failures"][:20])
    assert len({out["digest"] for out in res}) == 1, "ranks ended with different results"
    return res


@requires_gpu
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_gpu_collectives_shared_gpu_ipc_ring(n):
    res = _gpu_job(n, "full", {"TFRING_GPU_BACKEND": "ring"})
    assert {r["backend"] for r in res} == {"local" if n == 1 else "ring-ipc"}


@requires_gpu
def test_gpu_collectives_auto_on_a_shared_gpu_picks_the_ring():
    res = _gpu_job(2, "quick", {"TFRING_GPU_BACKEND": "auto"})
    assert {r["backend"] for r in res} == {"ring-ipc"}


@requires_gpu
def test_gpu_ipc_mapping_cache_with_reused_ranges():
    # Every collective over the ring maps the peers' user buffers; tensors
    # are freed and their ranges reused with other sizes, so stale cached
    # mappings overlap new exports (the driver then refuses to map).
    res = _gpu_job(2, "quick", {"TFRING_GPU_BACKEND": "ring", "TFRING_GPU_ALLREDUCE_ALGO": "ring"})
    assert {r["backend"] for r in res} == {"ring-ipc"}
    assert all(r["algos"]["oneshot"] == r["algos"]["twoshot"] == 0 < r["algos"]["ring"]
               for r in res)


# Thresholds low enough that a few KiB cross them (the staging area is then
# 2 x 32 KiB per rank, so larger forced collectives run in pieces).
_PEER_ENV = {"TFRING_GPU_BACKEND": "ring", "TFRING_GPU_ONESHOT_MAX": "4K",
             "TFRING_GPU_TWOSHOT_MAX": "32K"}


def _check_algos(res, algo):
    for r in res:
        a = r["algos"]
        if algo == "auto":  # two ranks never take two-shot (the ring's own steps)
            twoshot_ok = a["twoshot"] > 0 if len(res) > 2 else a["twoshot"] == 0
            assert a["oneshot"] > 0 and twoshot_ok and a["ring"] > 0, a
        else:
            assert a[algo] > 0 and sum(a.values()) == a[algo], a


@requires_gpu
@pytest.mark.parametrize("algo", ["oneshot", "twoshot"])
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_gpu_peer_allreduce_shared_gpu(algo, n):
    # Every rank reads the peers' staging areas directly: results against
    # numpy float64, identical bits on every rank (the digest).
    res = _gpu_job(n, "peer", dict(_PEER_ENV, TFRING_GPU_ALLREDUCE_ALGO=algo))
    if n > 1:
        _check_algos(res, algo)


def _mps_running_env(tmp_path):
    """Environment under which ranks sharing a GPU count as MPS clients: a
    fake control pipe on the emulation, the daemon already serving this
    process on a real GPU; None when there is none."""
    if _core.cuda_emulated():
        os.mkfifo(tmp_path / "control")
        return {"CUDA_MPS_PIPE_DIRECTORY": str(tmp_path)}
    pipe_dir = os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps")
    if os.path.exists(os.path.join(pipe_dir, "control")):
        return {"CUDA_MPS_PIPE_DIRECTORY": pipe_dir}
    return None


@requires_gpu
def test_gpu_peer_allreduce_auto_picks_by_size(tmp_path):
    mps = _mps_running_env(tmp_path)
    if mps is None:
        pytest.skip("no MPS control daemon: auto takes the ring on a shared GPU")
    res = _gpu_job(3, "peer", dict(_PEER_ENV, TFRING_GPU_ALLREDUCE_ALGO="auto", **mps))
    _check_algos(res, "auto")


@requires_gpu
def test_gpu_peer_allreduce_auto_takes_the_ring_when_time_sliced(tmp_path):
    # Ranks sharing a GPU without MPS cannot run the peer kernels at the same
    # time (each waits for the other's time slice): auto stages small
    # allreduces through host memory and runs the ring above
    # TFRING_GPU_STAGED_MAX; a forced algorithm still runs.
    no_mps = {"CUDA_MPS_PIPE_DIRECTORY": str(tmp_path / "no-mps")}
    res = _gpu_job(2, "peer", dict(_PEER_ENV, TFRING_GPU_ALLREDUCE_ALGO="auto",
                                   TFRING_GPU_STAGED_MAX="16K", **no_mps))
    for r in res:
        a = r["algos"]
        assert a["oneshot"] == a["twoshot"] == 0 < a["staged"] and a["ring"] > 0, a
    res = _gpu_job(2, "peer", dict(_PEER_ENV, TFRING_GPU_ALLREDUCE_ALGO="oneshot", **no_mps))
    _check_algos(res, "oneshot")


@requires_gpu
@pytest.mark.parametrize("algo", ["oneshot", "twoshot", "auto"])
def test_gpu_peer_allreduce_a_gpu_per_rank(algo):
    if _core.cuda_device_count() < 2:
        pytest.skip("needs two GPUs")
    res = _gpu_job(2, "peer", dict(_PEER_ENV, TFRING_GPU_ALLREDUCE_ALGO=algo), gpu_per_rank=True)
    assert [r["device"] for r in res] == [0, 1]
    _check_algos(res, algo)


@requires_gpu
def test_gpu_peer_allreduce_unknown_algorithm_is_refused():
    # The tunables table checks every value at init: every rank refuses to
    # start, naming the variable and what it accepts, before any GPU work.
    env = {"TFRING_TEST_DEVICE": "0", "TFRING_GPU_BACKEND": "ring",
           "TFRING_GPU_ALLREDUCE_ALGO": "threeshot"}
    res = run_ranks(2, "gpu.py", ["refuse"], env=env, timeout=120)
    for r in res:
        assert r.returncode != 0, f"rank {r.rank} started with a bad algorithm"
        assert ("TFRING_GPU_ALLREDUCE_ALGO=threeshot is not one of auto, oneshot, "
                "twoshot, ring") in r.stderr, r.stderr[-2000:]


@requires_gpu
@pytest.mark.parametrize("victim", [0, 2])
@pytest.mark.parametrize("algo", ["oneshot", "twoshot"])
def test_gpu_peer_allreduce_dead_peer_fails_every_rank_fast(victim, algo):
    # Killed while the survivors' barrier kernels wait for its flag.
    env = {"VICTIM": victim, "TFRING_TIMEOUT": "60", "TFRING_TEST_DEVICE": "0",
           "TFRING_GPU_BACKEND": "ring", "TFRING_GPU_ALLREDUCE_ALGO": algo}
    res = run_ranks(3, "faults.py", ["gpu_die_busy"], timeout=90, env=env)
    check_peer_failure(res, victim, within=15)


@requires_gpu
def test_gpu_collectives_staged_copies():
    # The tensor cannot be exported: staging copies in our own buffer.
    res = _gpu_job(3, "quick", {"TFRING_GPU_BACKEND": "ring", "TFRING_GPU_IPC_USER_BUFFERS": "0"})
    assert {r["backend"] for r in res} == {"ring-ipc"}


@requires_gpu
def test_gpu_collectives_host_staging():
    res = _gpu_job(3, "quick", {"TFRING_GPU_BACKEND": "ring", "TFRING_GPU_IPC": "0"})
    assert {r["backend"] for r in res} == {"ring-host"}


@requires_gpu
def test_gpu_special_values_and_in_place():
    _gpu_job(2, "special", {"TFRING_GPU_BACKEND": "ring"})


@requires_gpu
@pytest.mark.parametrize("n", [1, 2])
def test_gpu_producer_stream_is_honoured(n):
    # A job of one runs stream-free GPU tensors inline on the caller's
    # thread, tensors with a producer stream on the engine thread: both kinds
    # here, interleaved.
    _gpu_job(n, "stream", {"TFRING_GPU_BACKEND": "ring"})


@requires_gpu
@pytest.mark.parametrize("n", [1, 2, 3])
def test_gpu_steps_completed_on_their_stream(n):
    # Random delays on every queued operation of the emulation: work that is
    # not ordered behind the gate it needs reads stale data instead of
    # passing by luck.
    env = {"TFRING_GPU_BACKEND": "ring"}
    if _core.cuda_emulated():
        env["TFRING_EMU_DELAY_US"] = "300"
    # A few small steps: seconds on the emulation and on a GPU. A gate that
    # never opens hangs the stream, so the job's deadline is short.
    _gpu_job(n, "gated", env, timeout=GATED_DEADLINE_S)


@requires_gpu
@pytest.mark.parametrize("backend", ["nccl", "auto"])
def test_gpu_steps_completed_on_their_stream_a_gpu_per_rank(backend):
    # NCCL's set-up, and auto's calibration of NCCL against the ring (whose
    # loser must not be freed while a gate holds a stream), under a gate.
    if _core.cuda_device_count() < 2:
        pytest.skip("needs two GPUs")
    if backend == "nccl" and not _core.nccl_info()["loaded"]:
        pytest.skip("NCCL does not load here")
    env = {"TFRING_GPU_BACKEND": backend}
    if _core.cuda_emulated():
        env["TFRING_EMU_DELAY_US"] = "300"
    res = _gpu_job(2, "gated", env, gpu_per_rank=True, timeout=GATED_DEADLINE_S)
    assert [r["device"] for r in res] == [0, 1]


@requires_gpu
@pytest.mark.parametrize("n", [1, 2])
def test_gated_steps_where_the_engines_stream_shares_the_callers_queue(n):
    # Every stream of a process on one hardware work queue (the emulation's
    # TFRING_EMU_QUEUES=1; on a GPU, too few queues for the streams, as MPS
    # may grant): a gate on the caller's stream would hold back the engine's
    # own kernels and copies, which it waits for. The check before the first
    # gate finds that, and the steps complete on the host instead, correct
    # and within the deadline, saying why once per rank.
    if not _core.cuda_emulated():
        pytest.skip("TFRING_EMU_QUEUES is the CUDA emulation's")
    env = {"TFRING_TEST_DEVICE": "0", "TFRING_GPU_BACKEND": "ring", "TFRING_EMU_QUEUES": "1",
           "TFRING_GPU_CHUNK_SIZE": "64K", "TFRING_GPU_STAGED_MAX": "0"}
    res = run_ranks(n, "gpu.py", ["gated"], env=env, timeout=GATED_DEADLINE_S)
    outs = check_ok(res)
    for r, out in zip(res, outs):
        assert out["failures"] == [], f"rank {r.rank}: " + "\n".join(out["failures"][:20])
        assert r.stderr.count("share one of the GPU's hardware work queues") == 1, r.stderr[-3000:]
    assert len({out["digest"] for out in outs}) == 1


@pytest.mark.parametrize("completion,preset,want", [
    ("stream", None, "32"),   # widened before TF can create a CUDA context
    ("stream", "4", "4"),     # the user's own value stands
    ("host", None, None),     # nothing changes without stream completion
])
def test_stream_completion_widens_cuda_connections_at_import(completion, preset, want):
    env = {k: v for k, v in os.environ.items() if k != "CUDA_DEVICE_MAX_CONNECTIONS"}
    env["TFRING_GPU_COMPLETION"] = completion
    if preset is not None:
        env["CUDA_DEVICE_MAX_CONNECTIONS"] = preset
    code = "import os, tfring; print(repr(os.environ.get('CUDA_DEVICE_MAX_CONNECTIONS')))"
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == repr(want)


@requires_gpu
def test_gpu_gated_mismatch_is_named_by_the_next_call_until_reinit():
    res = check_ok(run_ranks(2, "gpu.py", ["gated_error"], timeout=120,
                             env={"TFRING_TEST_DEVICE": "0", "TFRING_GPU_BACKEND": "ring"}))
    for r, out in enumerate(res):
        assert out["failures"] == [], f"rank {r}: " + "\n".join(out["failures"])
        assert "gated.bad" in out["error"] and "completed on its GPU stream" in out["error"]


@requires_gpu
@pytest.mark.parametrize("victim", [0, 2])
@pytest.mark.parametrize("ipc", ["1", "0"])
def test_gpu_dead_peer_fails_every_rank_fast(victim, ipc):
    # A rank killed in the middle of GPU collectives: the others raise
    # PeerFailureError naming it, instead of waiting on its events forever.
    env = {"VICTIM": victim, "TFRING_TIMEOUT": "60", "TFRING_TEST_DEVICE": "0",
           "TFRING_GPU_BACKEND": "ring", "TFRING_GPU_IPC": ipc, "TFRING_GPU_CHUNK_SIZE": "64K"}
    res = run_ranks(3, "faults.py", ["gpu_die_busy"], timeout=90, env=env)
    check_peer_failure(res, victim, within=15)


@requires_gpu
@pytest.mark.parametrize("victim", [0, 1])
def test_nccl_dead_peer_fails_every_rank_fast(victim):
    # The same over NCCL, a GPU per rank: the survivor is inside an NCCL
    # collective when its peer is killed.
    if _core.cuda_device_count() < 2:
        pytest.skip("needs two GPUs")
    if not _core.nccl_info()["loaded"]:
        pytest.skip("NCCL not found")
    env = {"VICTIM": victim, "TFRING_TIMEOUT": "60", "TFRING_GPU_BACKEND": "nccl",
           "TFRING_GPU_CHUNK_SIZE": "64K"}
    res = run_ranks(2, "faults.py", ["gpu_die_busy"], timeout=90, env=env,
                    per_rank_env=lambda r: {"TFRING_TEST_DEVICE": r})
    check_peer_failure(res, victim, within=15)


@requires_gpu
@pytest.mark.parametrize("backend,mode", [("ring", "full"), ("auto", "quick")])
def test_gpu_collectives_a_gpu_per_rank(backend, mode):
    # Ranks on different GPUs of one host: the CUDA-IPC ring across devices
    # (peer access); auto takes NCCL or the ring, whichever it timed faster,
    # or the ring when NCCL does not load. "full" starts with an empty
    # tensor, which has no pointer to tell its GPU: the array's own device
    # must be used, not the current one (GPU 0 on every rank).
    if _core.cuda_device_count() < 2:
        pytest.skip("needs two GPUs")
    res = _gpu_job(2, mode, {"TFRING_GPU_BACKEND": backend}, gpu_per_rank=True)
    assert [r["device"] for r in res] == [0, 1]
    backends = {r["backend"] for r in res}
    if backend == "ring" or not _core.nccl_info()["loaded"]:
        assert backends == {"ring-ipc"}
    else:
        assert backends in ({"ring-ipc"}, {"nccl"}), backends


@requires_gpu
@pytest.mark.parametrize("backend,want", [("ring", "ring-host"), ("auto", None)])
def test_gpu_collectives_across_hosts(backend, want):
    # Two simulated hosts with two GPUs each (TFRING_HOSTNAME): the ring
    # stages GPU data through pinned host memory and crosses hosts over TCP;
    # auto takes NCCL when it loads.
    if _core.cuda_device_count() < 2:
        pytest.skip("needs two GPUs")
    if want is None:
        want = "nccl" if _core.nccl_info()["loaded"] else "ring-host"
    res = _gpu_job(4, "quick", {"TFRING_GPU_BACKEND": backend}, gpu_per_rank=True,
                   per_rank_env=lambda r: {"TFRING_HOSTNAME": f"host{r // 2}"})
    assert [r["device"] for r in res] == [0, 1, 0, 1]
    assert {r["backend"] for r in res} == {want}


@requires_gpu
def test_nccl_on_one_rank():
    if not _core.nccl_info()["loaded"]:
        pytest.skip("NCCL not found: " + _core.nccl_info()["error"])
    res = _gpu_job(1, "quick", {"TFRING_GPU_BACKEND": "nccl"})
    assert res[0]["backend"] == "nccl"


@requires_gpu
def test_nccl_refused_on_a_shared_gpu_and_the_job_goes_on():
    res = _gpu_job(2, "refuse", {"TFRING_GPU_BACKEND": "nccl"})
    for r in res:
        assert r["error"] and "share GPU" in r["error"], r["error"]


@requires_gpu
def test_nccl_with_a_gpu_per_rank():
    if _core.cuda_device_count() < 2:
        pytest.skip("needs two GPUs")
    if not _core.nccl_info()["loaded"]:
        pytest.skip("NCCL not found")
    res = _gpu_job(2, "quick", {"TFRING_GPU_BACKEND": "nccl"}, gpu_per_rank=True)
    assert {r["backend"] for r in res} == {"nccl"}


# Ranks sharing a GPU without MPS: the lowest rank of each such host warns
# once, saying how to start MPS (csrc/gpu/mps.h). MPS is looked for where
# the CUDA driver looks: the `control` pipe in $CUDA_MPS_PIPE_DIRECTORY.
MPS_WARNING = "CUDA Multi-Process Service is not running"


def _mps_warnings(res):
    return [r.stderr.count(MPS_WARNING) for r in res]


def _mps_job(n, pipe_dir, env=None, per_rank_env=None):
    e = {"TFRING_GPU_BACKEND": "ring", "TFRING_GPU_CHUNK_SIZE": "64K",
         "CUDA_MPS_PIPE_DIRECTORY": str(pipe_dir)}
    e.update(env or {})
    res = run_ranks(n, "gpu.py", ["special"], env=e, timeout=180, per_rank_env=per_rank_env)
    for r, out in enumerate(check_ok(res)):
        assert out["failures"] == [], f"rank {r}: " + "\n".join(out["failures"][:20])
    return res


@requires_gpu
def test_shared_gpu_without_mps_warns_once_on_the_lowest_rank(tmp_path):
    res = _mps_job(3, tmp_path / "no-mps", {"TFRING_TEST_DEVICE": "0"})
    assert _mps_warnings(res) == [1, 0, 0], [r.stderr[-2000:] for r in res]
    text = res[0].stderr
    assert "nvidia-cuda-mps-control -d" in text and "CUDA_MPS_PIPE_DIRECTORY" in text, text
    assert str(tmp_path / "no-mps") in text and "(0, 1, 2)" in text, text


@requires_gpu
def test_shared_gpu_warns_once_per_host(tmp_path):
    # Two simulated hosts, two ranks sharing GPU 0 on each: ranks 0 and 2
    # speak for their hosts.
    res = _mps_job(4, tmp_path / "no-mps", {"TFRING_TEST_DEVICE": "0"},
                   per_rank_env=lambda r: {"TFRING_HOSTNAME": f"host{r // 2}"})
    assert _mps_warnings(res) == [1, 0, 1, 0], [r.stderr[-2000:] for r in res]
    assert "host host1 (2, 3)" in res[2].stderr, res[2].stderr[-2000:]


@requires_gpu
def test_shared_gpu_under_mps_does_not_warn(tmp_path):
    # A fake control pipe stands for a running MPS control daemon. The real
    # CUDA driver would try to talk to it, so only the emulation runs this.
    if not _core.cuda_emulated():
        pytest.skip("a fake MPS control pipe is only safe on the CUDA emulation build")
    os.mkfifo(tmp_path / "control")
    res = _mps_job(3, tmp_path, {"TFRING_TEST_DEVICE": "0"})
    assert _mps_warnings(res) == [0, 0, 0], [r.stderr[-2000:] for r in res]


@requires_gpu
def test_a_gpu_per_rank_does_not_warn_about_mps(tmp_path):
    if _core.cuda_device_count() < 2:
        pytest.skip("needs two GPUs")
    res = _mps_job(2, tmp_path / "no-mps", per_rank_env=lambda r: {"TFRING_TEST_DEVICE": r})
    assert _mps_warnings(res) == [0, 0], [r.stderr[-2000:] for r in res]
