"""GPU collectives on one rank of a test job (tests/gpu/test_gpu_collectives.py).

Inputs live on the GPU as CuPy arrays when TFRING_TEST_ARRAYS=cupy (and CuPy
imports), else as tfring._core.CudaArray; results are checked against numpy
float64 references computed from every rank's regenerated inputs, and a
digest of all results lets the test check that ranks agree bit for bit.

Modes:
  full     every collective, dtypes x ops x counts, fused groups, scales
  quick    a smaller set (backends other than the default)
  special  NaN/Inf propagation, in-place out=, empty tensors
  refuse   TFRING_GPU_BACKEND that cannot work: the GPU collective fails on
           every rank with the same error and the job goes on (CPU tensors)
  stream   inputs written on a side stream are read after that work
  gated    steps completed on their stream (stream gates), as XLA's GPU
           calls with TFRING_GPU_COMPLETION=stream
  gated_error  a shape mismatch in a gated call: named by the next call,
           forgotten by a re-initialization (an elastic reset)
  peer     allreduce of every dtype/op across the one-shot/two-shot/ring
           thresholds, back-to-back calls, fused batches
"""

import os
import sys
import time

import numpy as np

from common import DTYPES, OPS, compare, digest, make_input, reference, report, to_f64, tolerance

import tfring.basics as basics
from tfring import _core

mode = sys.argv[1] if len(sys.argv) > 1 else "full"
basics.init()
rank, n = basics.rank(), basics.size()
device = int(os.environ.get("TFRING_TEST_DEVICE", basics.local_rank() % _core.cuda_device_count()))

cp = None
if os.environ.get("TFRING_TEST_ARRAYS") == "cupy":
    import cupy as cp  # noqa: F811

    cp.cuda.Device(device).use()

failures = []
outs = []


def to_gpu(x, dtype=None):
    if cp is not None:
        return cp.asarray(x)
    return _core.CudaArray.from_numpy(np.ascontiguousarray(x), device, dtype)


def to_host(y):
    if cp is not None and not isinstance(y, _core.CudaArray):
        return cp.asnumpy(y)
    if isinstance(y, _core.CudaArray):
        return y.to_numpy()
    return cp.asnumpy(cp.asarray(y))


def check(what, got, want, tol):
    compare(failures, what, got, want, tol)


def run_allreduce(dtypes, counts):
    salt = 0
    for dtype in dtypes:
        for op in OPS:
            for count in counts:
                salt += 1
                x, dt = make_input(dtype, count, rank, salt, op)
                y = _core.allreduce(to_gpu(x, dt), op=op, name=f"ar.{dtype}.{op}.{count}", dtype=dt)
                got = to_host(y)
                want = reference([make_input(dtype, count, r, salt, op)[0] for r in range(n)],
                                 dtype, op, n)
                check(f"allreduce {dtype} {op} n={count}", to_f64(got, dtype), want,
                      tolerance(dtype, n))
                outs.append(got)


def run_fused(count_each=37, tensors=6):
    # Submitted together, these fuse into one GPU buffer (pack/unpack kernels).
    xs = [np.arange(count_each, dtype=np.float32) * (rank + 1) + i for i in range(tensors)]
    hs = [_core.allreduce_async(to_gpu(x), op="sum", name=f"fused.{i}", prescale=2.0,
                                postscale=0.25) for i, x in enumerate(xs)]
    for i, h in enumerate(hs):
        got = to_host(h.wait())
        want = sum((np.arange(count_each) * (r + 1) + i) for r in range(n)) * 0.5
        check(f"fused allreduce {i}", got.astype(np.float64), want, 1e-6 * n)
        outs.append(got)


def run_grouped():
    # One request with a part per tensor (what TF's grouped GPU op and XLA's
    # CUDA target submit): separate outputs, outputs written over the
    # inputs, an empty tensor and a scalar among the parts, a second pass
    # on the engine's cached path, and a part whose shape differs by rank.
    shapes = [(5, 3), (0,), (), (1000,), (7,)]

    def inputs(r, salt):
        return [(np.arange(int(np.prod(s)), dtype=np.float32).reshape(s) % 17) * (r + 1) + salt
                for s in shapes]

    for salt, in_place in ((1, False), (2, True), (1, False)):
        xs = [to_gpu(x) for x in inputs(rank, salt)]
        ys = xs if in_place else [to_gpu(np.zeros(s, np.float32)) for s in shapes]
        _core.cuda_grouped_allreduce(xs, ys, "grp", op="sum", prescale=2.0, postscale=0.25)
        every = [inputs(r, salt) for r in range(n)]
        for i, y in enumerate(ys):
            want = sum(e[i].astype(np.float64) for e in every) * 0.5
            got = to_host(y)
            check(f"grouped part {i} salt {salt} in_place {in_place}",
                  got.astype(np.float64).reshape(want.shape), want, 1e-6 * n)
            outs.append(got)
    xs = [to_gpu(x) for x in inputs(rank, 3)[3:]]
    ys = [to_gpu(np.zeros(s, np.float32)) for s in shapes[3:]]
    _core.cuda_grouped_allreduce(xs, ys, "grp.avg", op="average")
    for i, y in enumerate(ys):
        want = sum(inputs(r, 3)[3 + i].astype(np.float64) for r in range(n)) / n
        check(f"grouped average part {i}", to_host(y).astype(np.float64), want, 1e-6)
    if n > 1:
        # Same total size, tensor 1 split differently on rank 0.
        split = [(3,), (4,)] if rank == 0 else [(4,), (3,)]
        xs = [to_gpu(np.ones(s, np.float32)) for s in split]
        try:
            _core.cuda_grouped_allreduce(xs, xs, "grp.bad")
        except Exception as e:  # noqa: BLE001 - MismatchError
            msg = str(e)
            if "tensor 'grp.bad.0' (the group's tensor 0)" not in msg:
                failures.append(f"grouped mismatch message: {msg}")
        else:
            failures.append("grouped mismatch: no error")
        # A GPU group on rank 0 against host memory elsewhere, under the
        # same name: refused on every rank, naming the device, no stall.
        try:
            if rank == 0:
                xs = [to_gpu(np.ones(s, np.float32)) for s in ((3,), (4,))]
                _core.cuda_grouped_allreduce(xs, xs, "grp.mixed")
            else:
                _core.allreduce(np.ones(7, np.float32), name="grp.mixed")
        except Exception as e:  # noqa: BLE001 - MismatchError
            if "grp.mixed" not in str(e) or "GPU" not in str(e):
                failures.append(f"GPU/host group mismatch message: {e}")
        else:
            failures.append("GPU/host group mismatch: no error")
        # The job goes on.
        y = to_host(_core.allreduce(to_gpu(np.ones(3, np.float32)), op="sum", name="grp.after"))
        check("allreduce after a grouped mismatch", y.astype(np.float64), np.full(3, n), 0)


def run_large():
    count = 3_000_017  # many pipeline chunks, odd split across ranks
    x = (np.arange(count, dtype=np.float64) % 1000) * (rank + 1)
    got = to_host(_core.allreduce(to_gpu(x), op="average", name="ar.large"))
    want = (np.arange(count) % 1000) * sum(range(1, n + 1)) / n
    check("allreduce large average", got, want, 1e-12)
    outs.append(got)


def run_allgather():
    for dtype in ["float32", "int64", "bool", "bfloat16"]:
        rows = rank + 1  # first dimension differs per rank
        base = np.arange(rows * 3).reshape(rows, 3) + 100 * rank
        x = (base % 2).astype(bool) if dtype == "bool" else base.astype(
            "uint16" if dtype == "bfloat16" else dtype)
        dt = "bfloat16" if dtype == "bfloat16" else None
        got = to_host(_core.allgather(to_gpu(x, dt), name=f"ag.{dtype}", dtype=dt))
        parts = []
        for r in range(n):
            b = np.arange((r + 1) * 3).reshape(r + 1, 3) + 100 * r
            parts.append((b % 2).astype(bool) if dtype == "bool" else b.astype(x.dtype))
        check(f"allgather {dtype}", got, np.concatenate(parts), 0)
        outs.append(got)
    # One rank with no rows.
    rows = 0 if rank == 0 else 2
    x = np.full((rows, 4), rank, np.float32)
    got = to_host(_core.allgather(to_gpu(x), name="ag.empty"))
    want = np.concatenate([np.full((0 if r == 0 else 2, 4), r, np.float32) for r in range(n)])
    check("allgather with an empty rank", got, want, 0)


def run_broadcast():
    for root in range(n):
        for dtype, count in [("float32", 1001), ("uint8", 5), ("int64", 0)]:
            x = (np.arange(count) * (rank + 1)).astype(dtype)
            got = to_host(_core.broadcast(to_gpu(x), root=root, name=f"bc.{root}.{dtype}"))
            check(f"broadcast root {root} {dtype}", got,
                  (np.arange(count) * (root + 1)).astype(dtype), 0)
            outs.append(got)


def run_reducescatter():
    for dtype, op in [("float32", "sum"), ("int32", "max"), ("float64", "average")]:
        for rows in [n * 2 + 1, 1, 5]:
            x = ((np.arange(rows * 3).reshape(rows, 3) + 1) * (rank + 1)).astype(dtype)
            got = to_host(_core.reducescatter(to_gpu(x), op=op, name=f"rs.{dtype}.{op}.{rows}",
                                              prescale=1.0, postscale=1.0))
            xs = [((np.arange(rows * 3).reshape(rows, 3) + 1) * (r + 1)).astype(np.float64)
                  for r in range(n)]
            full = {"sum": np.sum, "max": np.max}.get(op, np.sum)(xs, axis=0)
            if op == "average":
                full = full / n
            lo = sum(_core.reducescatter_shape([rows, 3], r, n)[0] for r in range(rank))
            hi = lo + _core.reducescatter_shape([rows, 3], rank, n)[0]
            check(f"reducescatter {dtype} {op} rows={rows}", got.astype(np.float64), full[lo:hi],
                  1e-6 * n)  # (each rank holds a different block: not in the digest)


def run_special():
    # NaN and Inf propagate through sum, min and max.
    x = np.array([1.0, np.nan if rank == 0 else 2.0, np.inf if rank == n - 1 else 3.0, 4.0],
                 np.float32)
    for op in ["sum", "min", "max"]:
        got = to_host(_core.allreduce(to_gpu(x), op=op, name=f"nan.{op}"))
        if not (np.isnan(got[1]) and (got[2] == np.inf or op == "min")):
            failures.append(f"NaN/Inf did not propagate through {op}: {got}")
        outs.append(got)
    for dtype in ["float16", "bfloat16"]:
        bits = np.array([0x7E00 if dtype == "float16" else 0x7FC0, 0x3C00 if dtype == "float16"
                         else 0x3F80], np.uint16)  # NaN, 1.0
        x = bits.view(np.float16) if dtype == "float16" else bits
        got = to_host(_core.allreduce(to_gpu(x, dtype if dtype == "bfloat16" else None),
                                      op="sum", name=f"nan.{dtype}",
                                      dtype="bfloat16" if dtype == "bfloat16" else None))
        v = to_f64(got, dtype)
        if not (np.isnan(v[0]) and v[1] == n):
            failures.append(f"{dtype}: NaN + x should stay NaN and 1*n = {n}: {v}")
    # In place: out= is the input.
    buf = to_gpu(np.full(10, rank + 1, np.float32))
    res = _core.allreduce(buf, op="sum", name="inplace", out=buf)
    check("in-place allreduce", to_host(buf), np.full(10, n * (n + 1) / 2), 0)
    if res is not buf:
        failures.append("allreduce(out=x) should return x")
    # Empty tensor.
    got = to_host(_core.allreduce(to_gpu(np.zeros((0, 3), np.float32)), name="empty"))
    check("empty allreduce", got, np.zeros((0, 3)), 0)


def run_refuse():
    x = to_gpu(np.ones(8, np.float32))
    err = None
    try:
        _core.allreduce(x, name="refused")
    except Exception as e:  # noqa: BLE001
        err = f"{type(e).__name__}: {e}"
    if err is None:
        failures.append("the GPU allreduce should have failed")
    y = _core.allreduce(np.full(4, rank + 1.0), name="cpu.after")
    check("CPU allreduce after a refused GPU one", y, np.full(4, n * (n + 1) / 2), 0)
    return err


def run_stream():
    # The input is produced by many kernels on a side stream; tfring must
    # read it only after that work (the array interface names the stream).
    count = 1 << 20
    stream = _core.cuda_stream_create(device)
    try:
        a = _core.CudaArray.from_numpy(np.zeros(count, np.float32), device)
        one = _core.CudaArray.from_numpy(np.ones(count, np.float32), device)
        for _ in range(20):
            _core.cuda_reduce(a, a, one, "sum", stream=stream)
        _core.cuda_scale(a, a, rank + 1.0, stream=stream)
        view = ProducedOn(a, stream)
        # Stream-free tensors in flight at the same time (a job of one runs
        # them inline, the stream-ordered one on the engine thread).
        plain = [_core.CudaArray.from_numpy(np.full(1000 + i, rank + 1.0, np.float32), device)
                 for i in range(4)]
        hs = [_core.allreduce_async(p, op="sum", name=f"plain.{i}") for i, p in enumerate(plain)]
        got = _core.allreduce(view, op="sum", name="stream")
        for i, h in enumerate(hs):
            y = to_host(h.wait())
            if not np.all(y == n * (n + 1) / 2):
                failures.append(f"stream-free allreduce {i} beside a stream-ordered one: {y[:4]}")
        # In place too: out= is the input, still pending on the stream.
        for _ in range(3):
            _core.cuda_reduce(a, a, one, "sum", stream=stream)
        _core.allreduce(view, op="sum", name="stream.inplace", out=view)
        inplace = a.to_numpy()
    finally:
        _core.cuda_synchronize(device, stream)
        _core.cuda_stream_destroy(stream, device)
    want = 20.0 * n * (n + 1) / 2
    host = to_host(got)
    if not np.all(host == want):
        failures.append(f"stream ordering: got {host[:4]} ... want {want}")
    want2 = sum(20.0 * (r + 1) + 3 for r in range(n))
    if not np.all(inplace == want2):
        failures.append(f"stream ordering, in place: got {inplace[:4]} ... want {want2}")


def run_peer():
    # Sizes on both sides of the thresholds the test sets (TFRING_GPU_ONESHOT_MAX,
    # TFRING_GPU_TWOSHOT_MAX), counts not divisible by the ranks, and more than
    # the staging area holds (forced algorithms run it in pieces).
    run_allreduce(DTYPES, [0, 1, max(n - 1, 1), 2 * n + 1, 1000, 4097, 20001])
    # Back to back: the flags and both staging parities are reused many times.
    for i in range(40):
        count = 257 + 613 * (i % 3)
        x = (np.arange(count, dtype=np.float32) + i) * (rank + 1)
        got = to_host(_core.allreduce(to_gpu(x), op="sum", name=f"b2b.{i}"))
        check(f"back-to-back allreduce {i}", got.astype(np.float64),
              (np.arange(count) + i) * (n * (n + 1) / 2), 0)
        outs.append(got)
    # Scaling on the way in and out, into a separate out= buffer, unaligned
    # counts (the kernels' head/vector/tail split).
    for count in [5, 3001, 9001]:
        x = (np.arange(count) % 13).astype(np.float32) * (rank + 1)
        dst = to_gpu(np.zeros(count, np.float32))
        got = _core.allreduce(to_gpu(x), op="sum", name=f"pscale.{count}", prescale=2.0,
                              postscale=0.25, out=dst)
        want = (np.arange(count) % 13) * (n * (n + 1) / 2) * 0.5
        check(f"scaled out-of-place allreduce {count}", to_host(dst).astype(np.float64), want, 0)
        if got is not dst:
            failures.append("allreduce(out=y) should return y")
        outs.append(to_host(dst))
    # Fused batches, small and across the thresholds.
    for batch, (count_each, tensors) in enumerate([(37, 6), (1500, 9), (333, 40)]):
        xs = [(np.arange(count_each) % 97).astype(np.float32) * (rank + 1) + i
              for i in range(tensors)]
        hs = [_core.allreduce_async(to_gpu(x), op="average", name=f"pfused.{batch}.{i}")
              for i, x in enumerate(xs)]
        for i, h in enumerate(hs):
            got = to_host(h.wait())
            want = sum((np.arange(count_each) % 97) * (r + 1) + i for r in range(n)) / n
            check(f"fused peer allreduce {batch}.{i}", got.astype(np.float64), want, 1e-6 * n)
            outs.append(got)


def run_gated(steps=4, tensors=3, count=3001):
    """TFRING_GPU_COMPLETION=stream as an XLA step uses it: each step's
    gradients are produced by kernels on one stream, allreduced by a gated
    submission that returns at once, and the "optimizer" that reads the
    results is queued on the stream right behind it, before any result
    exists. A second gated call in the same step reads a result of the
    first (its input is produced behind the first gate: the engine must
    finish the first before it takes the second). The host waits for the
    stream only at the end."""
    T = n * (n + 1) / 2
    stream = _core.cuda_stream_create(device)
    try:
        w0 = [(np.arange(count) % 7 + i + 1).astype(np.float32) for i in range(tensors)]
        w = [to_gpu(x) for x in w0]
        g = [to_gpu(np.zeros(count, np.float32)) for _ in w]
        r = [to_gpu(np.zeros(count, np.float32)) for _ in w]
        h = to_gpu(np.zeros(count, np.float32))
        k = [to_gpu(np.zeros(count, np.float32)) for _ in range(steps)]
        for step in range(steps):
            for wi, gi in zip(w, g):  # backprop: g = w * (rank + 1)
                _core.cuda_scale(gi, wi, rank + 1.0, stream=stream)
            _core.cuda_allreduce_gated(g, r, [f"gated.{i}" for i in range(tensors)], stream)
            _core.cuda_scale(h, r[0], 1.0, stream=stream)  # reads a result of the gated call
            _core.cuda_allreduce_gated([h], [k[step]], ["gated.second"], stream)
            for wi, ri in zip(w, r):  # the update: w = sum of g = T * w
                _core.cuda_scale(wi, ri, 1.0, stream=stream)
        _core.cuda_synchronize(device, stream)
        # A submission the engine refuses at once (one name twice) raises, and
        # leaves nothing for the next gated call to wait for.
        try:
            _core.cuda_allreduce_gated([w[0], w[1]], [g[0], g[1]], ["gated.dup", "gated.dup"], stream)
            failures.append("a batch naming one tensor twice should be refused")
        except Exception as e:  # noqa: BLE001 - the engine's error type
            if "gated.dup" not in str(e):
                failures.append(f"the refusal should name the tensor: {e}")
        _core.cuda_allreduce_gated([w[0]], [g[0]], ["gated.after_refusal"], stream)
        _core.cuda_synchronize(device, stream)
        check("gated call after a refused one", to_host(g[0]), to_host(w[0]).astype(np.float64) * n, 0)
    finally:
        _core.cuda_stream_destroy(stream, device)
    for i in range(tensors):
        want = w0[i].astype(np.float64) * T ** steps
        check(f"gated step, tensor {i} after {steps} steps", to_host(w[i]), want, 0)
        outs.append(to_host(w[i]))
    for step in range(steps):
        want = w0[0].astype(np.float64) * T ** (step + 1) * n  # h is the same on every rank
        check(f"second gated call of step {step}", to_host(k[step]), want, 0)
    if _core.cuda_gated_error() is not None:
        failures.append(f"unexpected gated error: {_core.cuda_gated_error()}")


def run_gated_mixed(steps=3, count=2049):
    """The shape of an XLA program with several collectives, as the H200's
    tests/tf/test_xla.py runs them: a sum, an average, a max, a group, then a
    broadcast, each reading what the previous one produced, all on one
    stream, with kernels between them; per step. The first call of each
    kind in the world completes on the host, later ones are gated. Every
    result is checked against float64 at the end of each step."""
    stream = _core.cuda_stream_create(device)
    try:
        base = (np.arange(count) % 11 + 1).astype(np.float64)
        x = to_gpu((base * (rank + 1)).astype(np.float32))
        a, b, c, d = (to_gpu(np.zeros(count, np.float32)) for _ in range(4))
        g = [to_gpu(np.zeros(count, np.float32)) for _ in range(3)]
        gi = [to_gpu(np.zeros(count, np.float32)) for _ in range(3)]
        e = to_gpu(np.zeros(count, np.float32))
        T = n * (n + 1) / 2
        for step in range(steps):
            s = float(step + 1)
            _core.cuda_allreduce_gated([x], [a], [f"mixed.sum.{step}"], stream, op="sum")
            _core.cuda_scale(b, a, s, stream=stream)  # reads the sum behind its gate
            _core.cuda_allreduce_gated([b], [c], [f"mixed.avg.{step}"], stream, op="average")
            _core.cuda_allreduce_gated([x], [d], [f"mixed.max.{step}"], stream, op="max")
            for i in range(3):
                _core.cuda_scale(gi[i], c, float(i + 1), stream=stream)
            _core.cuda_allreduce_gated(gi, g, [f"mixed.group.{step}.{i}" for i in range(3)],
                                       stream)
            src = g[2] if rank == n - 1 else x  # only the root's input counts
            _core.cuda_allreduce_gated([src], [e], [f"mixed.bcast.{step}"], stream, root=n - 1)
            _core.cuda_synchronize(device, stream)
            sum_ = base * T
            avg = sum_ * s  # the average of a value every rank holds
            check(f"step {step}: sum", to_host(a), sum_, 0)
            check(f"step {step}: average of the scaled sum", to_host(c), avg, 1e-6)
            check(f"step {step}: max", to_host(d), base * n, 0)
            for i in range(3):
                check(f"step {step}: group {i}", to_host(g[i]), avg * (i + 1) * n, 1e-6)
            check(f"step {step}: broadcast", to_host(e), avg * 3 * n, 1e-6)
        outs.append(to_host(e))
    finally:
        _core.cuda_stream_destroy(stream, device)
    if _core.cuda_gated_error() is not None:
        failures.append(f"unexpected gated error: {_core.cuda_gated_error()}")


def run_gated_error():
    """The first allreduce of a world completes on the host (it may set up
    the backend), so its mismatch fails the call itself and nothing is kept.
    So does every call until one has made the world's GPU stream (a gate
    is closed only once that stream is known not to wait behind it): a
    matching allreduce makes it. A gated allreduce whose shape differs on
    the last rank returns at once on every rank; its stream is not left
    waiting; the mismatch, naming the tensor, fails the next gated call on
    every rank."""
    stream = _core.cuda_stream_create(device)
    try:
        count = 100 + (1 if rank == n - 1 else 0)
        x = to_gpu(np.ones(count, np.float32))
        y = to_gpu(np.zeros(count, np.float32))
        try:
            _core.cuda_allreduce_gated([x], [y], ["gated.first"], stream)
            failures.append("the first allreduce of the world should fail in the call itself")
        except Exception as e:  # noqa: BLE001 - the mismatch's type
            if "gated.first" not in str(e):
                failures.append(f"the first call's error should name the tensor: {e}")
        if _core.cuda_gated_error() is not None:
            failures.append(f"a host-completed failure was kept: {_core.cuda_gated_error()}")
        same = to_gpu(np.ones(100, np.float32))
        _core.cuda_allreduce_gated([same], [same], ["gated.same"], stream)
        _core.cuda_allreduce_gated([x], [y], ["gated.bad"], stream)
        _core.cuda_synchronize(device, stream)  # the gate opened: no hang
        err = None
        for _ in range(200):
            err = _core.cuda_gated_error()
            if err is not None:
                break
            time.sleep(0.05)
        if err is None or "gated.bad" not in err:
            failures.append(f"the recorded error should name the tensor: {err!r}")
        raised = None
        try:
            _core.cuda_allreduce_gated([x], [y], ["gated.next"], stream)
            failures.append("the next gated call should raise the recorded error")
        except Exception as e:  # noqa: BLE001 - the recorded error's type
            raised = str(e)
            if "gated.bad" not in raised:
                failures.append(f"the next call's error should name the tensor: {raised}")
        # A new world (what an elastic reset does) starts clean.
        basics.shutdown()
        basics.init()
        if _core.cuda_gated_error() is not None:
            failures.append(f"the error outlived re-initialization: {_core.cuda_gated_error()}")
        a = to_gpu(np.full(100, rank + 1.0, np.float32))
        b = to_gpu(np.zeros(100, np.float32))
        _core.cuda_allreduce_gated([a], [b], ["gated.after_reinit"], stream)
        _core.cuda_synchronize(device, stream)
        check("gated allreduce after re-initialization", to_host(b),
              np.full(100, n * (n + 1) / 2), 0)
        return raised
    finally:
        _core.cuda_stream_destroy(stream, device)


class ProducedOn:
    """A device array whose producer stream is `stream` (interface v3)."""

    def __init__(self, base, stream):
        self.base = base
        self.__cuda_array_interface__ = dict(base.__cuda_array_interface__, stream=stream)


error = None
if mode == "full":
    run_allreduce(DTYPES, [0, 1, max(n - 1, 1), 2 * n + 1, 1000])
    run_fused()
    run_grouped()
    run_large()
    run_allgather()
    run_broadcast()
    run_reducescatter()
    run_special()
elif mode == "quick":
    run_allreduce(["float32", "bfloat16", "int32"], [1, 2 * n + 1, 1000])
    run_fused()
    run_grouped()
    run_large()
    run_allgather()
    run_broadcast()
    run_reducescatter()
elif mode == "special":
    run_special()
elif mode == "peer":
    run_peer()
elif mode == "refuse":
    error = run_refuse()
elif mode == "stream":
    run_stream()
elif mode == "gated":
    run_gated()
    run_gated_mixed()
elif mode == "gated_error":
    error = run_gated_error()

report({"failures": failures, "digest": digest(outs), "backend": _core.gpu_backend(),
        "error": error, "device": device, "algos": _core.gpu_allreduce_algorithms()})
basics.shutdown()
