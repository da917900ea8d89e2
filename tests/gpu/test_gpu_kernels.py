"""The CUDA kernels on one process, against tfring's CPU kernels and numpy:
reduce, scale and the float16 cast for every dtype, the batched copy that
packs and unpacks fused buffers, views at unaligned offsets, and the stream
gate behind TFRING_GPU_COMPLETION=stream. Need a GPU, or the CUDA emulation
build (tests/gpu_emu.sh); skipped cleanly without one."""

import numpy as np
import pytest

from gpu_util import requires_gpu
from tfring import _core


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
