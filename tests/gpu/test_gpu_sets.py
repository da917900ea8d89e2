"""GPU state is per communicator (the world, each process set): a
stream-completed collective's failure, and the GPU allreduce algorithm
counters. Needs a GPU, or the CUDA emulation build (tests/gpu_emu.sh);
skipped cleanly without one."""

from gpu_util import requires_gpu
from multiproc import check_ok, run_ranks


@requires_gpu
def test_gpu_gated_failure_algorithm_counts_and_backend_stay_in_their_set():
    # Sets a = [0, 1], b = [1, 2], c = [2]: a gated allreduce fails in a (a
    # shape mismatch); the world's, b's and c's gated allreduces after it
    # still reduce (tests/workers/gpu_sets.py checks the values), and each
    # communicator counts only its own GPU allreduces (the one-shot one,
    # forced) and reports its own backend.
    env = {"TFRING_TEST_DEVICE": "0", "TFRING_GPU_BACKEND": "ring",
           "TFRING_GPU_ALLREDUCE_ALGO": "oneshot", "TFRING_GPU_ONESHOT_MAX": "4K",
           "TFRING_GPU_TWOSHOT_MAX": "32K", "TFRING_GPU_STAGED_MAX": "0"}
    res = check_ok(run_ranks(3, "gpu_sets.py", ["isolation"], env=env, timeout=60))
    for r, out in enumerate(res):
        assert out["failures"] == [], f"rank {r}: " + "\n".join(out["failures"])
    only = lambda k: {"ring": 0, "oneshot": k, "twoshot": 0, "staged": 0}  # noqa: E731
    # world: w.0, w.1, w.2; a: a.warm (a.bad fails before it runs, a.next
    # is refused); b: b.0, b.1; c = [2]: c.0, on the "local" backend.
    for r, out in enumerate(res):
        want = {"world": only(3)}
        backends = {"world": "ring-ipc"}
        if r in (0, 1):
            want["a"], backends["a"] = only(1), "ring-ipc"
        if r in (1, 2):
            want["b"], backends["b"] = only(2), "ring-ipc"
        if r == 2:
            want["c"], backends["c"] = only(0), "local"
        assert out["counts"] == want, (r, out["counts"])
        assert out["backends"] == backends, (r, out["backends"])
    for r in (0, 1):
        err = res[r]["error"]
        assert err and "a.bad" in err and "completed on its GPU stream" in err, (r, err)
    assert res[2]["error"] is None


@requires_gpu
def test_gpu_backend_errors_in_a_set_name_global_ranks():
    # TFRING_GPU_BACKEND=nccl where ranks share a GPU: set b = [1, 2]'s
    # members are its places 0 and 1, and the error names ranks 1 and 2.
    env = {"TFRING_TEST_DEVICE": "0", "TFRING_GPU_BACKEND": "nccl"}
    res = check_ok(run_ranks(3, "gpu_sets.py", ["names"], env=env, timeout=60))
    for r, out in enumerate(res):
        assert out["failures"] == [], f"rank {r}: " + "\n".join(out["failures"])
    for r in (1, 2):
        assert "ranks 1 and 2 share GPU" in res[r]["error"], res[r]["error"]
