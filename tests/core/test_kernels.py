"""CPU reduce kernels (tfring._core.kernels) against numpy references.

Every test that takes the `isa` fixture runs once per kernel set this CPU
supports ("scalar", and "avx2"/"avx512" where present), switched in-process
with kernels.set_isa(); TFRING_CPU_ISA, the environment variable that forces
a set at startup, is tested in a subprocess.

References are computed in float64 and rounded once to the dtype (float16 and
bfloat16 with a round-to-nearest-even written here), so the comparisons are
bitwise: a sum or product of two floats rounded once is exact, and so are
integers (numpy's own wrapping arithmetic), min, max and bool ops. NaNs are
compared as "is NaN".
"""

import os
import subprocess
import sys

import numpy as np
import pytest

from tfring import _core

K = _core.kernels

ISAS = [name for name in ("scalar", "avx2", "avx512") if K.isa_supported(name)]
DTYPES = [
    "float16",
    "bfloat16",
    "float32",
    "float64",
    "int32",
    "int64",
    "uint8",
    "int8",
    "int16",
    "uint16",
    "bool",
]
FLOATS = ["float16", "bfloat16", "float32", "float64"]
INTS = ["int32", "int64", "uint8", "int8", "int16", "uint16"]
OPS = ["sum", "average", "min", "max", "product"]
COUNTS = [0, 1, 7, 31, 33, 1000, 4099]
GUARD_BYTES = 64  # sentinel bytes kept on each side of every buffer

# numpy storage of each dtype: bfloat16 travels as uint16 bits.
STORAGE = {
    "float16": np.float16,
    "bfloat16": np.uint16,
    "float32": np.float32,
    "float64": np.float64,
    "int32": np.int32,
    "int64": np.int64,
    "uint8": np.uint8,
    "int8": np.int8,
    "int16": np.int16,
    "uint16": np.uint16,
    "bool": np.bool_,
}


@pytest.fixture(params=ISAS)
def isa(request):
    K.set_isa(request.param)
    assert K.isa() == request.param
    yield request.param
    K.set_isa("")


# ------------------------------------------------------------ references ----


def round_to_format(x, mant_bits, min_exp):
    """float64 -> nearest (ties to even) value with mant_bits significant bits
    and no step below 2**min_exp (the smallest subnormal), as float64.
    Overflow is left to the final cast to the narrow type."""
    x = np.asarray(x, np.float64)
    finite = np.isfinite(x)
    xf = np.where(finite, x, 0.0)
    _, e = np.frexp(xf)  # |x| in [2**(e-1), 2**e)
    k = np.maximum(e - mant_bits, min_exp)  # exponent of the last kept bit
    r = np.ldexp(np.rint(np.ldexp(xf, -k)), k)
    return np.where(finite, r, x)


def f64_to_f16(x):
    with np.errstate(over="ignore"):
        return round_to_format(x, 11, -24).astype(np.float16)  # exact or inf


def f32_to_bf16_bits(x):
    """float32 -> bfloat16 bits, ties to even; a NaN stays NaN (quiet bit)."""
    b = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint16)
    quiet = ((b >> 16) | 0x40).astype(np.uint16)
    return np.where(np.isnan(x), quiet, rounded)


def f64_to_bf16_bits(x):
    with np.errstate(over="ignore"):
        r = round_to_format(x, 8, -133).astype(np.float32)  # exact or inf
    return f32_to_bf16_bits(r)


def bf16_bits_to_f32(h):
    return (np.asarray(h, np.uint16).astype(np.uint32) << 16).view(np.float32)


def to_f64(arr, dtype):
    """The values of a stored array, as float64."""
    with np.errstate(invalid="ignore"):  # signaling NaNs
        if dtype == "bfloat16":
            return bf16_bits_to_f32(arr).astype(np.float64)
        return arr.astype(np.float64)


def from_f64(x, dtype):
    """float64 -> the dtype's storage, rounded once."""
    if dtype == "float16":
        return f64_to_f16(x)
    if dtype == "bfloat16":
        return f64_to_bf16_bits(x)
    return x.astype(STORAGE[dtype])


def nan_min(a, b):
    # The kernels' definition: NaN in a wins, else a < b ? a : b (a NaN in b
    # makes the comparison false, so b). Like np.minimum, except that a tie
    # of -0 and +0 deterministically gives b.
    return np.where(np.isnan(a), a, np.where(a < b, a, b))


def nan_max(a, b):
    return np.where(np.isnan(a), a, np.where(a > b, a, b))


def reference(a, b, op, dtype):
    if dtype == "bool":
        x, y = a.view(np.uint8) != 0, b.view(np.uint8) != 0
        return (
            np.logical_or(x, y)
            if op in ("sum", "average", "max")
            else np.logical_and(x, y)
        )
    if dtype in INTS:
        # numpy's integer arithmetic wraps in two's complement, as required.
        fn = {
            "sum": np.add,
            "average": np.add,
            "product": np.multiply,
            "min": np.minimum,
            "max": np.maximum,
        }[op]
        return fn(a, b)
    x, y = to_f64(a, dtype), to_f64(b, dtype)
    with np.errstate(all="ignore"):
        fn = {
            "sum": np.add,
            "average": np.add,
            "product": np.multiply,
            "min": nan_min,
            "max": nan_max,
        }[op]
        return from_f64(fn(x, y), dtype)


def assert_same(got, want, dtype):
    """Bitwise equal, except that any NaN matches any NaN."""
    want = np.asarray(want, got.dtype)
    assert got.shape == want.shape
    differ = (
        got.view(np.uint8).reshape(len(got), got.itemsize)
        != want.view(np.uint8).reshape(len(want), want.itemsize)
    ).any(axis=1)
    if dtype in FLOATS:
        gn, wn = np.isnan(to_f64(got, dtype)), np.isnan(to_f64(want, dtype))
        differ = np.where(gn | wn, gn != wn, differ)
    bad = np.flatnonzero(differ)
    if len(bad):
        i = bad[0]
        raise AssertionError(
            f"{len(bad)} of {len(got)} elements differ; first at {i}: "
            f"got {got[i]!r} want {want[i]!r}"
        )


# ------------------------------------------------------------- test data ----


def random_values(rng, dtype, n):
    """Values that reach every path: random bit patterns for the narrow
    floats (subnormals, inf, NaN included), mixed magnitudes plus special
    values for float32/64, the full range for integers."""
    if dtype in ("float16", "bfloat16"):
        bits = rng.integers(0, 1 << 16, n, dtype=np.uint16)
        return bits.view(np.float16) if dtype == "float16" else bits
    if dtype in ("float32", "float64"):
        t = STORAGE[dtype]
        x = rng.standard_normal(n) * 10.0 ** rng.integers(-5, 6, n)
        specials = np.array(
            [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-40, -1e-310, 3e38, -3e38]
        )
        pick = rng.random(n) < 0.05
        x[pick] = rng.choice(specials, pick.sum())
        with np.errstate(over="ignore"):
            return x.astype(t)
    if dtype == "bool":
        return rng.random(n) < 0.5
    info = np.iinfo(STORAGE[dtype])
    return rng.integers(info.min, info.max, n, dtype=STORAGE[dtype], endpoint=True)


def guarded(values, dtype, offset=0):
    """A copy of values inside a bigger buffer of 0xA5 sentinel bytes, starting
    `offset` elements past a 16-byte boundary (offset 1: misaligned data).
    Returns (buffer, view); check_guards(buffer, view) asserts that nothing
    outside the view was written."""
    item = np.dtype(STORAGE[dtype]).itemsize
    start = GUARD_BYTES + offset * item
    buf = np.full(start + len(values) * item + GUARD_BYTES, 0xA5, np.uint8)
    view = buf[start : start + len(values) * item].view(STORAGE[dtype])
    view[...] = values
    return buf, view


def check_guards(buf, view):
    start = view.__array_interface__["data"][0] - buf.__array_interface__["data"][0]
    assert (buf[:start] == 0xA5).all(), "wrote before the buffer"
    assert (buf[start + view.nbytes :] == 0xA5).all(), "wrote past the buffer"


# ----------------------------------------------------------------- tests ----


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_reduce_matches_numpy(isa, dtype, op):
    rng = np.random.default_rng(DTYPES.index(dtype) * 10 + OPS.index(op))
    for n in COUNTS:
        for offset in (0, 1):
            a, b = random_values(rng, dtype, n), random_values(rng, dtype, n)
            want = reference(a, b, op, dtype)
            dt = dtype if dtype == "bfloat16" else None

            # In place: dst = op(dst, src).
            buf, dst = guarded(a, dtype, offset)
            _, src = guarded(b, dtype, offset)
            K.reduce(dst, src, op, dt)
            assert_same(dst, want, dtype)
            check_guards(buf, dst)

            # Out of place into a third buffer; the inputs misaligned by a
            # different amount than the output.
            buf, dst = guarded(np.zeros_like(a), dtype, offset)
            _, x = guarded(a, dtype, 1 - offset)
            _, y = guarded(b, dtype, 1 - offset)
            K.reduce3(dst, x, y, op, dt)
            assert_same(dst, want, dtype)
            check_guards(buf, dst)

            # Out of place onto either input.
            for onto in (0, 1):
                bufs = [guarded(a, dtype, offset), guarded(b, dtype, offset)]
                x, y = bufs[0][1], bufs[1][1]
                K.reduce3((x, y)[onto], x, y, op, dt)
                assert_same((x, y)[onto], want, dtype)
                check_guards(*bufs[onto])


def scale_reference(x, factor, dtype):
    if dtype == "bool":
        return x & (factor != 0)
    if dtype in INTS:
        info = np.iinfo(STORAGE[dtype])
        v = np.trunc(x.astype(np.float64) * factor)
        return np.clip(v, info.min, info.max).astype(STORAGE[dtype])
    with np.errstate(all="ignore"):
        if dtype == "float64":
            return x * factor
        prod = to_f64(x, dtype).astype(np.float32) * np.float32(factor)
        if dtype == "float32":
            return prod
        if dtype == "float16":
            return prod.astype(np.float16)  # float32 -> float16, one rounding
        return f32_to_bf16_bits(prod)


@pytest.mark.parametrize("dtype", DTYPES)
def test_scale_matches_numpy(isa, dtype):
    rng = np.random.default_rng(7)
    # Few-bit factors make many products land on rounding ties.
    for factor in (0.5, 1.5, 0.75, 3.0, 1.0 / 3.0, -2.5, 0.0, 1e-3):
        for n in COUNTS:
            x = random_values(rng, dtype, n)
            if dtype in INTS:
                x = (x // 4).astype(x.dtype)  # keep most products in range
            want = scale_reference(x, factor, dtype)
            buf, view = guarded(x, dtype, n % 2)
            K.scale(view, factor, "bfloat16" if dtype == "bfloat16" else None)
            assert_same(view, want, dtype)
            check_guards(buf, view)


@pytest.mark.parametrize("dtype", DTYPES)
def test_scale_by_one_is_a_noop(isa, dtype):
    x = random_values(np.random.default_rng(3), dtype, 1000)
    y = x.copy()
    K.scale(y, 1.0, "bfloat16" if dtype == "bfloat16" else None)
    assert (x.view(np.uint8) == y.view(np.uint8)).all()


def test_scale_integers_truncate_and_saturate(isa):
    x = np.array([7, -7, 5, -5, 100, -100, 2**31 - 1, -(2**31)], np.int32)
    K.scale(x, 0.5)
    assert x.tolist() == [3, -3, 2, -2, 50, -50, 2**30 - 1, -(2**30)]
    x = np.array([100, -100, 3], np.int8)
    K.scale(x, 10.0)
    assert x.tolist() == [127, -128, 30]
    x = np.array([200, 3], np.uint8)
    K.scale(x, -1.0)
    assert x.tolist() == [0, 0]
    x = np.array([2**62, -(2**62), 10], np.int64)
    K.scale(x, 4.0)
    assert x.tolist() == [2**63 - 1, -(2**63), 40]


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("op", OPS)
def test_nan_and_inf_propagate(isa, dtype, op):
    # A NaN at every position of vector bodies and tails, in a, in b, in
    # both; inf combinations that make NaN.
    n = 67
    for where in ("a", "b", "both"):
        for pos in range(n):
            a = np.full(n, 1.5)
            b = np.full(n, -2.0)
            if where in ("a", "both"):
                a[pos] = np.nan
            if where in ("b", "both"):
                b[pos] = np.nan
            sa, sb = from_f64(a, dtype), from_f64(b, dtype)
            out = np.zeros_like(sa)
            K.reduce3(out, sa, sb, op, "bfloat16" if dtype == "bfloat16" else None)
            got = to_f64(out, dtype)
            assert np.isnan(got[pos]), (where, pos, got[pos])
            assert not np.isnan(np.delete(got, pos)).any()
    a = np.array([np.inf, -np.inf, np.inf, 0.0, np.inf, -np.inf, 1.0, np.inf] * 5)
    b = np.array([-np.inf, np.inf, 0.0, np.inf, np.inf, -np.inf, -np.inf, 2.0] * 5)
    sa, sb = from_f64(a, dtype), from_f64(b, dtype)
    out = sa.copy()
    K.reduce(out, sb, op, "bfloat16" if dtype == "bfloat16" else None)
    assert_same(out, reference(sa, sb, op, dtype), dtype)


def test_min_max_propagate_nan_like_numpy(isa):
    a = np.array([np.nan, 1.0, np.nan, 3.0, -np.inf, 2.0] * 7, np.float32)
    b = np.array([1.0, np.nan, np.nan, -1.0, np.nan, np.inf] * 7, np.float32)
    for op, fn in (("min", np.minimum), ("max", np.maximum)):
        out = np.empty_like(a)
        K.reduce3(out, a, b, op)
        np.testing.assert_array_equal(out, fn(a, b))  # NaN == NaN here


def test_integer_wraparound(isa):
    cases = [
        (
            np.int8,
            [127, -128, 100, -100],
            [1, -1, 100, 2],
            "sum",
            [-128, 127, -56, -98],
        ),
        (np.uint8, [255, 200, 16, 0], [1, 100, 16, 255], "sum", [0, 44, 32, 255]),
        (np.uint8, [255, 16, 200, 3], [255, 16, 2, 5], "product", [1, 0, 144, 15]),
        (
            np.int8,
            [-128, 127, -3, 16],
            [-1, 127, 50, 8],
            "product",
            [-128, 1, 106, -128],
        ),
        (np.int32, [2**31 - 1, -(2**31)], [1, -1], "sum", [-(2**31), 2**31 - 1]),
        (np.int32, [65536, -(2**31)], [65536, -1], "product", [0, -(2**31)]),
        (np.int64, [2**63 - 1, -(2**63)], [1, -1], "sum", [-(2**63), 2**63 - 1]),
        (
            np.int64,
            [2**32 + 3, -(2**63), 3037000500],
            [2**32 + 5, -1, 3037000500],
            "product",
            [(8 * 2**32 + 15), -(2**63), 3037000500**2 - 2**64],
        ),
    ]
    for t, a, b, op, want in cases:
        for reps in (1, 9):  # tail only, and vector body plus tail
            x, y = np.array(a * reps, t), np.array(b * reps, t)
            K.reduce(x, y, op)
            assert x.tolist() == want * reps, (t, op)


def test_bool_results_are_zero_or_one(isa):
    a = np.array([0, 1, 2, 255, 0, 7] * 11, np.uint8).view(np.bool_)
    b = np.array([0, 0, 4, 1, 9, 0] * 11, np.uint8).view(np.bool_)
    for op, want in (
        ("sum", [0, 1, 1, 1, 1, 1]),
        ("max", [0, 1, 1, 1, 1, 1]),
        ("min", [0, 0, 1, 1, 0, 0]),
        ("product", [0, 0, 1, 1, 0, 0]),
    ):
        out = np.empty_like(a)
        K.reduce3(out, a, b, op)
        assert out.view(np.uint8).tolist() == want * 11, op


def test_narrow_conversions_round_trip_every_value(isa):
    # min(x, x) is x and x + (-0) is x for every non-NaN x: both check the
    # widening and narrowing of all 65536 encodings, subnormals included.
    allbits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    for dtype in ("float16", "bfloat16"):
        x = allbits.view(np.float16) if dtype == "float16" else allbits
        dt = "bfloat16" if dtype == "bfloat16" else None
        nan = np.isnan(to_f64(x, dtype))
        out = np.empty_like(x)
        K.reduce3(out, x, x, "min", dt)
        assert (out.view(np.uint16)[~nan] == allbits[~nan]).all()
        assert np.isnan(to_f64(out, dtype)[nan]).all()
        negzero = from_f64(np.full(len(x), -0.0), dtype)
        K.reduce3(out, x, negzero, "sum", dt)
        assert (out.view(np.uint16)[~nan] == allbits[~nan]).all()
        assert np.isnan(to_f64(out, dtype)[nan]).all()


def test_all_isas_agree_bitwise_including_nan_payloads():
    # Ranks may run different kernel sets; their results must not differ.
    rng = np.random.default_rng(11)
    allbits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    shuffled = rng.permutation(allbits)
    wide = {
        dtype: (random_values(rng, dtype, 5000), random_values(rng, dtype, 5000))
        for dtype in ("float32", "float64")
    }
    results = {}
    for isa_name in ISAS:
        K.set_isa(isa_name)
        try:
            outs = []
            for dt in ("float16", "bfloat16"):
                as_dt = (
                    (lambda x: x.view(np.float16)) if dt == "float16" else (lambda x: x)
                )
                for op in OPS:
                    for a, b in ((allbits, shuffled), (shuffled, allbits)):
                        out = np.empty_like(allbits)
                        K.reduce3(as_dt(out), as_dt(a), as_dt(b), op, dt)
                        outs.append(out)
                out = allbits.copy()
                K.scale(as_dt(out), 0.7, dt)
                outs.append(out)
            for a, b in wide.values():
                for op in OPS:
                    out = np.empty_like(a)
                    K.reduce3(out, a, b, op)
                    outs.append(out.view(np.uint8))
            results[isa_name] = outs
        finally:
            K.set_isa("")
    base = results[ISAS[0]]
    for isa_name, outs in results.items():
        for i, (x, y) in enumerate(zip(base, outs)):
            assert (x == y).all(), f"{isa_name} differs from {ISAS[0]} in case {i}"


def test_large_counts_cross_unrolled_loops(isa):
    n = (1 << 16) + 13
    a = np.arange(n, dtype=np.float32)
    b = np.full(n, 0.25, np.float32)
    K.reduce(a, b, "sum")
    np.testing.assert_array_equal(a, np.arange(n, dtype=np.float32) + np.float32(0.25))


# ---------------------------------------------------------- ISA choice ----


def test_isa_names():
    assert "scalar" in ISAS
    assert K.isa() in ISAS
    assert not K.isa_supported("sse9")
    with pytest.raises(ValueError, match="sse9"):
        K.set_isa("sse9")


def run_isa_subprocess(value, cwd):
    # Import the same tfring as this process, whatever the child's cwd adds.
    import tfring

    path = [
        os.path.dirname(os.path.dirname(os.path.abspath(tfring.__file__)))
    ] + sys.path
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(p for p in path if p),
        TFRING_CPU_ISA=value,
    )
    out = subprocess.run(
        [sys.executable, "-c", "from tfring import _core; print(_core.kernels.isa())"],
        env=env,
        cwd=cwd,
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip(), out.stderr


@pytest.mark.parametrize("name", ISAS)
def test_env_forces_isa(name, tmp_path):
    assert run_isa_subprocess(name, tmp_path)[0] == name


def test_env_with_unknown_isa_falls_back_to_best(tmp_path):
    isa_name, err = run_isa_subprocess("sse9", tmp_path)
    assert isa_name == ISAS[-1]
    assert "TFRING_CPU_ISA=sse9" in err


# ------------------------------------------------------------ validation ----


def test_binding_rejects_bad_arguments():
    x = np.zeros(8, np.float32)
    with pytest.raises(ValueError, match="elements"):
        K.reduce(x, np.zeros(7, np.float32), "sum")
    with pytest.raises(ValueError, match="dtype"):
        K.reduce(x, np.zeros(8, np.float64), "sum")
    with pytest.raises(ValueError, match="unknown op"):
        K.reduce(x, x.copy(), "mean")
    with pytest.raises(ValueError, match="contiguous"):
        K.reduce(np.zeros(16, np.float32)[::2], x, "sum")
    with pytest.raises(ValueError, match="contiguous"):
        K.reduce3(x, np.zeros(16, np.float32)[::2], x, "sum")
    with pytest.raises(ValueError, match="numpy array"):
        K.reduce([0.0] * 8, x, "sum")
    ro = np.zeros(8, np.float32)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        K.reduce(ro, x, "sum")
    with pytest.raises(ValueError, match="read-only"):
        K.scale(ro, 2.0)
    with pytest.raises(ValueError, match="does not match"):
        K.reduce(x, x.copy(), "sum", "int32")
    with pytest.raises(ValueError, match="unknown dtype"):
        K.reduce(x, x.copy(), "sum", "float128")
    with pytest.raises(ValueError, match="no tfring dtype"):
        K.scale(np.zeros(4, np.uint32), 2.0)
    with pytest.raises(ValueError, match="overlap"):
        buf = np.zeros(9, np.float32)
        K.reduce3(buf[1:], buf[:8], x, "sum")
    # numpy dtypes name a dtype too.
    z = np.ones(8, np.float32)
    K.reduce(z, z.copy(), "sum", np.float32)
    np.testing.assert_array_equal(z, 2.0)
    with pytest.raises(ValueError, match="does not match"):
        K.reduce(z, z.copy(), "sum", np.float64)
    # Exactly the same buffer is fine (x op x).
    y = np.arange(8, dtype=np.float32)
    K.reduce(y, y, "sum")
    np.testing.assert_array_equal(y, 2 * np.arange(8, dtype=np.float32))


def test_bfloat16_travels_as_uint16():
    a = f64_to_bf16_bits(np.array([1.0, 2.5, -3.0]))
    b = f64_to_bf16_bits(np.array([0.5, 0.5, 10.0]))
    K.reduce(a, b, "sum", dtype="bfloat16")
    np.testing.assert_array_equal(bf16_bits_to_f32(a), [1.5, 3.0, 7.0])
    K.scale(a, 2.0, dtype="bfloat16")
    np.testing.assert_array_equal(bf16_bits_to_f32(a), [3.0, 6.0, 14.0])


@pytest.mark.parametrize("nbytes", [0, 1, 1023, 1024, 1025, 4096 + 13, 100_003])
def test_copy_streaming_every_alignment(nbytes):
    # The streaming copy (a large allreduce's output, kernels/cpu/copy.h)
    # aligns its stores to the destination: every byte offset of either side
    # lands exactly, and the bytes around the range are left alone.
    rng = np.random.default_rng(nbytes)
    src = rng.integers(0, 256, nbytes + 64, dtype=np.uint8)
    for doff in range(0, 17, 3):
        for soff in range(0, 17, 5):
            dst = np.full(nbytes + 64, 0xA5, np.uint8)
            K.copy_streaming(dst, src, dst_offset=doff, src_offset=soff, nbytes=nbytes)
            want = np.full(nbytes + 64, 0xA5, np.uint8)
            want[doff:doff + nbytes] = src[soff:soff + nbytes]
            assert np.array_equal(dst, want), (doff, soff)


def test_copy_streaming_rejects_ranges_past_the_end():
    with pytest.raises(ValueError, match="past the end"):
        K.copy_streaming(np.zeros(8, np.uint8), np.zeros(16, np.uint8), nbytes=12)
    with pytest.raises(ValueError, match="past the end"):
        K.copy_streaming(np.zeros(8, np.uint8), np.zeros(8, np.uint8), dst_offset=9)
