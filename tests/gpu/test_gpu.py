"""GPU tensors: the dispatch logic on every machine, the GPU data path where
a GPU is.

Always run (no GPU needed):
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

Need a GPU (skipped cleanly without one): the CUDA kernels against the CPU
kernels and numpy, and multi-process jobs with several ranks sharing GPU 0
over every backend. On a GPU machine: `python -m pytest -q tests/gpu/test_gpu.py`
(tools/gpu_run.sh builds tfring and runs this and the benchmark).
"""

import ctypes.util
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from multiproc import check_ok, check_peer_failure, run_ranks
from tfring import _core, _core_testing

HAVE_GPU = _core.cuda_available()
requires_gpu = pytest.mark.skipif(
    not HAVE_GPU, reason=f"no usable GPU: {_core.cuda_unavailable_reason()}")


def _cupy():
    try:
        import cupy

        return cupy
    except Exception:  # noqa: BLE001  (ImportError, or CUDA errors on import)
        return None


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


# ------------------------------------------------------------ CPU only ----

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


# ------------------------------------------------------------ GPU only ----

GPU_DTYPES = ["float16", "bfloat16", "float32", "float64", "int32", "int64", "uint8", "int8",
              "bool"]


def _random(dtype, n, rng, op="sum"):
    if dtype == "bool":
        return rng.integers(0, 2, n).astype(bool)
    if dtype == "bfloat16":
        v = rng.uniform(-4, 4, n).astype(np.float32)
        return (v.view(np.uint32) >> 16).astype(np.uint16)
    if dtype.startswith(("float",)):
        return rng.uniform(0.5, 1.5, n).astype(dtype) if op == "product" else \
            rng.uniform(-4, 4, n).astype(dtype)
    info = np.iinfo(dtype)
    return rng.integers(max(info.min, -100), min(info.max, 100), n).astype(dtype)


@requires_gpu
@pytest.mark.parametrize("dtype", GPU_DTYPES)
@pytest.mark.parametrize("op", ["sum", "min", "max", "product"])
def test_cuda_reduce_matches_cpu_kernels(dtype, op):
    rng = np.random.default_rng(7)
    dt = "bfloat16" if dtype == "bfloat16" else None
    for count in [0, 1, 7, 16, 1000, 100_003]:
        a, b = _random(dtype, count, rng, op), _random(dtype, count, rng, op)
        if dtype.startswith(("float", "bfloat")) and count > 4:
            a[3] = np.array(np.nan, np.float32).view(np.uint32) >> 16 if dtype == "bfloat16" \
                else np.nan
        for factor in [1.0, 0.5]:
            want = a.copy()
            _core.kernels.reduce3(want, a, b, op, dtype=dt)
            if factor != 1.0:
                _core.kernels.scale(want, factor, dtype=dt)
            ga, gb = _core.CudaArray.from_numpy(a, 0, dt), _core.CudaArray.from_numpy(b, 0, dt)
            gd = _core.CudaArray.from_numpy(np.zeros_like(a), 0, dt)
            _core.cuda_reduce(gd, ga, gb, op, factor, dtype=dt)
            got = gd.to_numpy()
            if dtype in ("float16", "float32", "float64"):
                np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
                ok = ~np.isnan(want)
                np.testing.assert_array_equal(got[ok], want[ok], err_msg=f"{dtype} {op} {count}")
            elif dtype == "bfloat16":
                nan_w = (want & 0x7FFF) > 0x7F80
                np.testing.assert_array_equal((got & 0x7FFF) > 0x7F80, nan_w)
                np.testing.assert_array_equal(got[~nan_w], want[~nan_w])
            else:
                np.testing.assert_array_equal(got, want, err_msg=f"{dtype} {op} {count}")
            # In place (dst is a) too.
            _core.cuda_reduce(ga, ga, gb, op, factor, dtype=dt)
            np.testing.assert_array_equal(ga.to_numpy(), got)


@requires_gpu
@pytest.mark.parametrize("dtype", GPU_DTYPES)
def test_cuda_scale_matches_cpu_kernels(dtype):
    rng = np.random.default_rng(3)
    dt = "bfloat16" if dtype == "bfloat16" else None
    x = _random(dtype, 10_001, rng)
    for factor in [0.25, 3.0, -1.5]:
        want = x.copy()
        _core.kernels.scale(want, factor, dtype=dt)
        src = _core.CudaArray.from_numpy(x, 0, dt)
        dst = _core.CudaArray.from_numpy(np.zeros_like(x), 0, dt)
        _core.cuda_scale(dst, src, factor, dtype=dt)
        np.testing.assert_array_equal(dst.to_numpy(), want)


@requires_gpu
def test_cuda_cast_fp16_compression():
    rng = np.random.default_rng(5)
    x = np.concatenate([rng.standard_normal(100_001).astype(np.float32) * 100,
                        np.array([np.nan, np.inf, -np.inf, 1e6, 6e-8, 0.0], np.float32)])
    src = _core.CudaArray.from_numpy(x)
    half = _core.CudaArray.from_numpy(np.zeros(len(x), np.float16))
    _core.cuda_cast(half, src)
    h = half.to_numpy()
    with np.errstate(over="ignore"):
        want = x.astype(np.float16)  # numpy rounds to nearest even, overflow -> inf
    np.testing.assert_array_equal(np.isnan(h), np.isnan(want))
    ok = ~np.isnan(want)
    np.testing.assert_array_equal(h[ok], want[ok])
    back = _core.CudaArray.from_numpy(np.zeros(len(x), np.float32))
    _core.cuda_cast(back, half)
    np.testing.assert_array_equal(back.to_numpy()[ok], want[ok].astype(np.float32))


class DeviceView:
    """Elements [start, stop) of a 1-D device array, by __cuda_array_interface__
    alone (no CuPy): views at any offset, aligned or not."""

    def __init__(self, base, start=0, stop=None):
        iface = base.__cuda_array_interface__
        itemsize = np.dtype(iface["typestr"]).itemsize
        stop = iface["shape"][0] if stop is None else stop
        self.base = base  # keeps the memory alive
        self.start, self.stop = start, stop
        self.__cuda_array_interface__ = {
            "shape": (stop - start,), "typestr": iface["typestr"], "version": 3,
            "data": (iface["data"][0] + start * itemsize, False), "strides": None,
        }

    def to_numpy(self):
        return self.base.to_numpy()[self.start:self.stop]


@requires_gpu
def test_cuda_batched_copy_packs_and_unpacks():
    rng = np.random.default_rng(11)
    # More copies than one launch takes, sizes across tile boundaries, and
    # offsets that leave some copies unaligned (word or byte paths).
    sizes = [0, 1, 3, 16, 1000, 70_000, 5, 131_073] * 20
    srcs = [rng.integers(0, 255, s, dtype=np.uint8) for s in sizes]
    offs = np.concatenate([[0], np.cumsum(sizes)])
    fused = _core.CudaArray.from_numpy(np.zeros(int(offs[-1]), np.uint8))
    gsrcs = [_core.CudaArray.from_numpy(s) for s in srcs]
    _core.cuda_batched_copy([(DeviceView(fused, offs[i], offs[i + 1]), g)
                             for i, g in enumerate(gsrcs)])
    np.testing.assert_array_equal(fused.to_numpy(), np.concatenate(srcs))
    outs = [_core.CudaArray.from_numpy(np.zeros(s, np.uint8)) for s in sizes]
    _core.cuda_batched_copy([(o, DeviceView(fused, offs[i], offs[i + 1]))
                             for i, o in enumerate(outs)])
    for o, s in zip(outs, srcs):
        np.testing.assert_array_equal(o.to_numpy(), s)


@requires_gpu
def test_stream_gate_holds_the_stream_until_opened():
    """TFRING_GPU_COMPLETION=stream's mechanism: work queued behind a gate
    waits on the device until open() (from any thread), a gate opened
    before the stream reaches it does not hold it, gates opened out of
    order release their stream in its own order, and a gate dropped
    unopened opens rather than hang its stream."""
    import threading
    import time

    ok, why = _core.cuda_stream_gates_supported(0)
    assert ok, why
    s = _core.cuda_stream_create(0)
    try:
        src = _core.CudaArray.from_numpy(np.arange(1, 1001, dtype=np.float32))
        dst = _core.CudaArray.from_numpy(np.zeros(1000, np.float32))
        gate = _core.cuda_stream_gate(s)
        _core.cuda_scale(dst, src, 2.0, stream=s)
        time.sleep(0.3)
        np.testing.assert_array_equal(dst.to_numpy(), 0)  # held
        threading.Thread(target=gate.open).start()
        _core.cuda_synchronize(0, s)
        np.testing.assert_array_equal(dst.to_numpy(), 2 * src.to_numpy())

        early = _core.cuda_stream_gate(s)
        early.open()
        _core.cuda_scale(dst, src, 3.0, stream=s)
        _core.cuda_synchronize(0, s)
        np.testing.assert_array_equal(dst.to_numpy(), 3 * src.to_numpy())

        # Two gates, the second opened first: the stream still waits for the
        # first, then runs both steps in its order (x4, then +src via x5).
        g1 = _core.cuda_stream_gate(s)
        _core.cuda_scale(dst, src, 4.0, stream=s)
        g2 = _core.cuda_stream_gate(s)
        _core.cuda_scale(dst, src, 5.0, stream=s)
        g2.open()
        time.sleep(0.2)
        np.testing.assert_array_equal(dst.to_numpy(), 3 * src.to_numpy())
        g1.open()
        _core.cuda_synchronize(0, s)
        np.testing.assert_array_equal(dst.to_numpy(), 5 * src.to_numpy())

        dropped = _core.cuda_stream_gate(s)
        _core.cuda_scale(dst, src, 6.0, stream=s)
        del dropped
        _core.cuda_synchronize(0, s)
        np.testing.assert_array_equal(dst.to_numpy(), 6 * src.to_numpy())
    finally:
        _core.cuda_stream_destroy(s, 0)


@requires_gpu
def test_cuda_kernels_unaligned_views():
    n = 10_000
    a = _core.CudaArray.from_numpy(np.arange(n, dtype=np.float32))
    b = _core.CudaArray.from_numpy(np.ones(n, np.float32))
    for off in range(5):
        d = _core.CudaArray.from_numpy(np.zeros(n, np.float32))
        _core.cuda_reduce(DeviceView(d, off), DeviceView(a, off), DeviceView(b, off), "sum")
        np.testing.assert_array_equal(d.to_numpy()[off:], np.arange(off, n, dtype=np.float32) + 1)
        # Mutually misaligned: no vector path, same result.
        m = n - 1 - off
        _core.cuda_reduce(DeviceView(d, 0, m), DeviceView(a, 1 + off), DeviceView(b, 0, m), "sum")
        np.testing.assert_array_equal(d.to_numpy()[:m],
                                      np.arange(1 + off, n, dtype=np.float32) + 1)
        # Scale and cast through the same head/vector/tail split.
        h = _core.CudaArray.from_numpy(np.zeros(n, np.float16))
        _core.cuda_cast(DeviceView(h, off), DeviceView(a, off))
        np.testing.assert_array_equal(h.to_numpy()[off:], np.arange(off, n).astype(np.float16))
        _core.cuda_scale(DeviceView(d, off), DeviceView(a, 0, n - off), 0.5)
        np.testing.assert_array_equal(d.to_numpy()[off:],
                                      np.arange(0, n - off, dtype=np.float32) * 0.5)


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
    _gpu_job(n, "gated", env)


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
    res = _gpu_job(2, "gated", env, gpu_per_rank=True)
    assert [r["device"] for r in res] == [0, 1]


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
