"""GPU tensors: the dispatch logic, run on every machine (no GPU needed):
  - a GPU array reaching a build without CUDA, or a machine without a usable
    GPU, gets a clear error (and CPU tensors keep working);
  - which GPU backend a job picks (NCCL, CUDA-IPC ring, host-staged ring,
    local) from what the ranks report, and the errors for impossible
    requests;
  - where NCCL is looked for, and what a missing or wrong library says;
  - the CUDA-IPC ring's schedule and counter protocol, run on host threads
    with the same code the GPU path uses (tiny chunks, few event slots, ring
    orders that are not rank order);
  - __cuda_array_interface__ checks that come before any device access.

The GPU data path is tested where a GPU is (skipped cleanly without one):
the CUDA kernels in test_gpu_kernels.py, multi-process jobs in
test_gpu_collectives.py. On a GPU machine:
`python -m pytest -q tests/gpu/test_gpu.py tests/gpu/test_gpu_kernels.py
tests/gpu/test_gpu_collectives.py` (tools/gpu_run.sh builds tfring and runs
these and the benchmark).
"""

import ctypes.util
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from gpu_util import HAVE_GPU
from tfring import _core, _core_testing


class FakeCudaArray:
    """Announces device memory it does not have: every check that should
    come before touching the pointer is exercised without a GPU."""

    def __init__(self, shape=(4,), typestr="<f4", strides=None, ptr=0x10000):
        self.__cuda_array_interface__ = {
            "shape": shape, "typestr": typestr, "data": (ptr, False), "version": 3,
            "strides": strides,
        }


@pytest.fixture
def job_of_one():
    _core.init()
    yield
    _core.shutdown()


def test_cuda_queries_agree():
    assert isinstance(_core.cuda_built(), bool)
    assert _core.cuda_available() == (_core.cuda_built() and _core.cuda_device_count() > 0)
    if not _core.cuda_available():
        assert _core.cuda_unavailable_reason()
    assert _core.gpu_backend() is None or isinstance(_core.gpu_backend(), str)


@pytest.mark.skipif(HAVE_GPU, reason="a GPU is usable here")
def test_gpu_tensor_without_usable_cuda_is_a_clear_error(job_of_one):
    with pytest.raises(_core.TfringError) as info:
        _core.allreduce(FakeCudaArray(), name="gpu.x")
    msg = str(info.value)
    assert "tensor 'gpu.x' is on GPU 0" in msg
    if _core.cuda_built():
        assert "CUDA cannot be used in this process" in msg
    else:
        assert "this tfring build has no CUDA support" in msg
        assert "place the tensor on the CPU" in msg
    for fn in (_core.allgather, _core.broadcast, _core.reducescatter):
        with pytest.raises(_core.TfringError, match="on GPU 0"):
            fn(FakeCudaArray(), name=f"gpu.{fn.__name__}")
    # Nothing is left in flight and CPU tensors still work.
    np.testing.assert_array_equal(_core.allreduce(np.arange(3.0), name="gpu.x"), np.arange(3.0))


def test_cuda_array_interface_is_checked_first(job_of_one):
    with pytest.raises(ValueError, match="C-contiguous"):
        _core.allreduce(FakeCudaArray(shape=(2, 2), strides=(4, 8)), name="strided")
    with pytest.raises(TypeError, match="typestr '<c8'"):
        _core.allreduce(FakeCudaArray(typestr="<c8"), name="complex")
    with pytest.raises(TypeError, match="does not support bool"):
        _core.allreduce(FakeCudaArray(typestr="|b1"), name="bool")
    with pytest.raises(TypeError, match="needs 2-byte elements"):
        _core.allreduce(FakeCudaArray(typestr="<f4"), name="bf", dtype="bfloat16")
    with pytest.raises(ValueError, match="out= must be a CUDA array"):
        _core.allreduce(FakeCudaArray(), name="out", out=np.zeros(4, np.float32))


def _rank(host="h0", gpu="GPU-0", nccl=True, ipc=True):
    return {"host": host, "gpu": gpu, "nccl_ok": nccl, "ipc_ok": ipc,
            "nccl_error": "" if nccl else "libnccl.so.2: cannot open shared object file"}


def test_backend_one_rank():
    assert _core.choose_gpu_backend("auto", [_rank()])[0] == "local"
    assert _core.choose_gpu_backend("ring", [_rank()])[0] == "local"
    # NCCL on one rank: the sanity check of the NCCL path.
    assert _core.choose_gpu_backend("nccl", [_rank()])[0] == "nccl"


def test_backend_shared_gpu_uses_the_ipc_ring():
    ranks = [_rank(gpu="GPU-0") for _ in range(4)]
    name, calibrate, _, reason = _core.choose_gpu_backend("auto", ranks)
    assert (name, calibrate) == ("ring-ipc", False)
    assert "ranks 0 and 1 share GPU GPU-0" in reason
    with pytest.raises(_core.TfringError) as info:
        _core.choose_gpu_backend("nccl", ranks)
    assert "TFRING_GPU_BACKEND=nccl cannot be used" in str(info.value)
    assert "share GPU" in str(info.value) and "TFRING_GPU_BACKEND=ring" in str(info.value)


def test_backend_own_gpus_one_host_times_both():
    ranks = [_rank(gpu=f"GPU-{i}") for i in range(4)]
    assert _core.choose_gpu_backend("auto", ranks)[:3] == ("nccl", True, "ring-ipc")
    assert _core.choose_gpu_backend("auto", ranks, autotune=False)[:2] == ("nccl", False)
    assert _core.choose_gpu_backend("nccl", ranks)[:2] == ("nccl", False)
    assert _core.choose_gpu_backend("ring", ranks)[:2] == ("ring-ipc", False)


def test_backend_several_hosts():
    ranks = [_rank(host=f"h{i // 2}", gpu=f"GPU-{i % 2}") for i in range(4)]
    name, calibrate, _, reason = _core.choose_gpu_backend("auto", ranks)
    assert (name, calibrate) == ("nccl", False)
    assert "several hosts" in reason
    assert _core.choose_gpu_backend("ring", ranks)[0] == "ring-host"
    # The same GPU UUID on two hosts is two GPUs... but two ranks on one
    # host with one GPU is a shared GPU.
    ranks[1]["gpu"] = ranks[0]["gpu"]
    assert _core.choose_gpu_backend("auto", ranks)[0] == "ring-host"


def test_backend_without_nccl_or_ipc():
    ranks = [_rank(gpu="GPU-0"), _rank(gpu="GPU-1", nccl=False)]
    name, _, _, reason = _core.choose_gpu_backend("auto", ranks)
    assert name == "ring-ipc"
    assert "NCCL could not be loaded on rank 1" in reason
    with pytest.raises(_core.TfringError, match="NCCL could not be loaded on rank 1"):
        _core.choose_gpu_backend("nccl", ranks)
    ranks = [_rank(gpu="GPU-0", ipc=False), _rank(gpu="GPU-0")]
    assert _core.choose_gpu_backend("auto", ranks)[0] == "ring-host"


def test_backend_unknown_name():
    with pytest.raises(_core.TfringError, match="'mpi' is not one of auto, nccl, ring"):
        _core.choose_gpu_backend("mpi", [_rank()])


def _nccl_info(env_extra):
    """nccl_info() in a fresh process (the loader keeps a success)."""
    env = dict(os.environ)
    env.update(env_extra)
    out = subprocess.check_output(
        [sys.executable, "-c",
         "import json; from tfring import _core; "
         "print(json.dumps({'info': _core.nccl_info(), 'cands': _core.nccl_candidates()}))"],
        env=env, text=True)
    return json.loads(out.strip().splitlines()[-1])


def test_nccl_missing_library_says_what_to_do():
    r = _nccl_info({"TFRING_NCCL_LIB": "/nonexistent/libnccl.so.2"})
    info = r["info"]
    assert not info["loaded"]
    assert info["searched"] == ["/nonexistent/libnccl.so.2"]
    assert "pip install nvidia-nccl-cu13" in info["error"]
    assert "TFRING_NCCL_LIB" in info["error"]


def test_nccl_wrong_library_is_rejected(tmp_path):
    libm = ctypes.util.find_library("m")
    if not libm:
        pytest.skip("no libm to stand in for a wrong library")
    path = None
    for d in ("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64", "/usr/lib64",
              "/lib/aarch64-linux-gnu"):
        if os.path.exists(os.path.join(d, libm)):
            path = os.path.join(d, libm)
    if path is None:
        pytest.skip("libm not found on disk")
    # A directory given as TFRING_NCCL_LIB means <dir>/libnccl.so.2.
    shutil.copy(path, tmp_path / "libnccl.so.2")
    info = _nccl_info({"TFRING_NCCL_LIB": str(tmp_path)})["info"]
    assert not info["loaded"]
    assert info["searched"][0] == str(tmp_path / "libnccl.so.2")
    assert "has no symbol ncclGetVersion" in info["error"]


def test_nccl_found_in_a_wheel_directory(tmp_path):
    # pip's nvidia-nccl-cu13 puts the library in site-packages/nvidia/nccl/lib.
    libdir = tmp_path / "site" / "nvidia" / "nccl" / "lib"
    libdir.mkdir(parents=True)
    (libdir / "libnccl.so.2").write_bytes(b"not a library")
    r = _nccl_info({"PYTHONPATH": os.pathsep.join(
        [str(tmp_path / "site"), os.environ.get("PYTHONPATH", "")]),
        "TFRING_NCCL_LIB": ""})
    assert str(libdir / "libnccl.so.2") in r["cands"]
    if not r["info"]["loaded"]:
        assert str(libdir / "libnccl.so.2") in r["info"]["searched"]


# The CUDA-IPC ring's schedule, emulated on host threads.

def _emulate(kind, ring, inputs, dtype, **kw):
    out = _core_testing.emulate_pull_ring(kind, ring, inputs, dtype, **kw)
    return [np.frombuffer(b, dtype=inputs[0].dtype if inputs else np.uint8) for b in out]


RINGS = {1: [[0]], 2: [[0, 1], [1, 0]], 3: [[0, 1, 2], [2, 0, 1]], 4: [[0, 1, 2, 3], [3, 1, 0, 2]],
         5: [[4, 2, 0, 3, 1]], 7: [[0, 1, 2, 3, 4, 5, 6]]}


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 7])
@pytest.mark.parametrize("count", [0, 1, 3, 100, 4097])
def test_ipc_ring_schedule_allreduce(n, count):
    rng = np.random.default_rng(n * 1000 + count)
    for ring in RINGS[n]:
        for op, dtype in [("sum", "float64"), ("max", "int32"), ("product", "int64"),
                          ("min", "float32")]:
            xs = [(rng.integers(1, 4, count) * (r + 1)).astype(dtype) for r in range(n)]
            ys = _emulate("allreduce", ring, xs, dtype, op=op, postscale=1.0 if n == 1 else 0.5,
                          chunk_bytes=16, num_events=3, repeats=3)
            f = {"sum": np.sum, "max": np.max, "product": np.prod, "min": np.min}[op]
            want = f(np.stack(xs).astype(np.float64), axis=0)
            if n > 1:
                want = want * 0.5
                if dtype.startswith("int"):
                    want = np.trunc(want)
            for r, y in enumerate(ys):
                np.testing.assert_allclose(y.astype(np.float64), want, rtol=1e-12,
                                           err_msg=f"rank {r} ring {ring} {op}")
            assert len({y.tobytes() for y in ys}) == 1


@pytest.mark.parametrize("n", [2, 3, 4, 7])
def test_ipc_ring_schedule_allgather_broadcast_reducescatter(n):
    rng = np.random.default_rng(n)
    for ring in RINGS[n]:
        # Allgather with blocks of different sizes, one of them empty.
        blocks = [rng.integers(0, 255, (r * 37) % 50, dtype=np.uint8) for r in range(n)]
        ys = _emulate("allgather", ring, blocks, "uint8",
                      rank_counts=[len(b) for b in blocks], chunk_bytes=8, num_events=2)
        for y in ys:
            np.testing.assert_array_equal(y, np.concatenate(blocks))
        # Broadcast from every root.
        for root in range(n):
            xs = [np.full(1000, r, np.uint8) for r in range(n)]
            ys = _emulate("broadcast", ring, xs, "uint8", root=root, chunk_bytes=64,
                          num_events=4)
            for y in ys:
                np.testing.assert_array_equal(y, np.full(1000, root, np.uint8))
        # Reducescatter: rank r's block of the result is its share.
        counts = [3 + (r % 2) for r in range(n)]
        xs = [rng.standard_normal(sum(counts)) for r in range(n)]
        ys = _emulate("reducescatter", ring, xs, "float64", rank_counts=counts, postscale=2.0,
                      chunk_bytes=8, num_events=3)
        want = np.sum(xs, axis=0) * 2.0
        off = np.concatenate([[0], np.cumsum(counts)])
        for r, y in enumerate(ys):
            np.testing.assert_allclose(y[off[r]:off[r + 1]], want[off[r]:off[r + 1]],
                                       rtol=1e-12)


def test_ipc_ring_schedule_many_chunks_few_events():
    # More chunks per step than event slots: chunks grow so every step has at
    # most num_events/2, which keeps neighbours from waiting on each other.
    xs = [np.ones(100_000, np.float32) * (r + 1) for r in range(3)]
    ys = _emulate("allreduce", [0, 1, 2], xs, "float32", chunk_bytes=64, num_events=4,
                  repeats=5)
    for y in ys:
        np.testing.assert_array_equal(y, np.full(100_000, 6.0, np.float32))
