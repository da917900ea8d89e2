#!/usr/bin/env python3
"""GPU benchmark, one table: kernels, allreduce latency and bandwidth per
algorithm at 1, 2 and 4 ranks, a batch of small tensors, NCCL for reference.

    python benchmarks/gpu_bench.py [--quick] [--mode timeslice|mps] [--json FILE]
    python benchmarks/gpu_bench.py --dry-run --json FILE   # any GPU build, emulation too

Needs a GPU and a CUDA build of tfring importable as `tfring`
(tools/gpu_run.sh builds it and runs this, once time-sliced and once
under MPS); CuPy for the kernel rows other than pack/unpack. Everything is
measured in this one run, on this GPU, next to its reference:

1. Kernels. Each kernel's achieved bandwidth (bytes read + written per
   second) next to a device-to-device cudaMemcpy of the same size, both
   timed with CUDA events around back-to-back launches. Pack/unpack (the
   fusion buffer's batched copy) is timed in C++ by
   ``_core.cuda_bench_pack``: descriptors built once, events around the
   launches alone. Targets: reduce >= 90% of the copy; pack/unpack >= 90%
   for 256 x 1 MiB, >= 60% for 4,096 x 16 KiB.

2. Allreduce, float32, in place, ranks sharing GPU 0, for each algorithm
   (TFRING_GPU_ALLREDUCE_ALGO=ring|oneshot|twoshot|auto; an algorithm this
   build does not know is skipped, saying why; "auto" is what a build
   without the knob does anyway; "host" is the ring staged through pinned
   host memory, TFRING_GPU_IPC=0) at 1, 2 and 4 ranks:
   latency (4 KiB, 64 KiB, 1 MiB: time per call) and bandwidth (1 MiB to
   1 GiB). busbw = S/t * 2(N-1)/N (nccl-tests), t the slowest rank's time.
   The bound: every rank reads its neighbour's segment and reduces it into
   its own (2 reads + 1 write) in N-1 steps, then copies N-1 final segments
   (1 read + 1 write): 5(N-1)/N * S bytes of memory traffic per rank, all N
   ranks sharing one GPU's memory. At the copy bandwidth B measured above,
   t_min = 5(N-1) S / B, and "% of bound" = t_min / t.

3. Batch: 256 tensors of 16 KiB submitted with ``allreduce_async`` then
   waited, at 1 and 2 ranks (time per batch and per tensor).

3b. Model: ResNet-50's 161 gradients (102 MB) the same way, in backprop
   order, against one allreduce of a 102 MB tensor in the same job: what
   fusion costs a training step over the bare allreduce.

4. NCCL on one rank (TFRING_GPU_BACKEND=nccl): loads, runs, gives the right
   answer; its latency and bandwidth are printed for reference. NCCL refuses
   two ranks on one GPU; with two or more GPUs, also NCCL across them.

--mode labels the run (time-sliced GPU sharing, or under MPS) in the table
and the JSON. --dry-run runs every code path with tiny sizes and one or two
iterations, on any GPU build including the CUDA emulation; its numbers mean
nothing and are labelled so.
"""

import argparse
import json
import os
import secrets
import statistics
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
KiB, MiB = 1 << 10, 1 << 20
ALGOS = ("ring", "oneshot", "twoshot", "auto", "host")
LATENCY_SIZES = [4 * KiB, 64 * KiB, MiB]
BANDWIDTH_SIZES = [MiB << (2 * k) for k in range(6)]  # 1 MiB .. 1 GiB


# ------------------------------------------------------------- kernels ----

def _cupy():
    try:
        import cupy as cp

        return cp
    except ImportError:
        return None


def _time_cupy(fn, cp, iters):
    fn()
    cp.cuda.Device().synchronize()
    start, stop = cp.cuda.Event(), cp.cuda.Event()
    start.record()
    for _ in range(iters):
        fn()
    stop.record()
    stop.synchronize()
    return cp.cuda.get_elapsed_time(start, stop) / 1e3 / iters


def _cupy_kernels(cp, size, iters, stream):
    """(copy seconds, rows) of the kernels launched from Python, CuPy events."""
    from tfring import _core

    rows = []
    a = cp.ones(size // 4, cp.float32)
    b = cp.ones(size // 4, cp.float32)
    d = cp.empty_like(a)
    t_copy = _time_cupy(
        lambda: cp.cuda.runtime.memcpyAsync(d.data.ptr, a.data.ptr, size, 3, stream), cp, iters)
    rows.append(("D2D copy (cudaMemcpyAsync)", 2 * size, t_copy))

    def add(name, nbytes, fn):
        rows.append((name, nbytes, _time_cupy(fn, cp, iters)))

    add("reduce sum float32 (d = a + b)", 3 * size,
        lambda: _core.cuda_reduce(d, a, b, "sum", stream=stream))
    add("reduce sum float32 in place", 3 * size,
        lambda: _core.cuda_reduce(a, a, b, "sum", stream=stream))
    add("reduce max float32 + scale 0.5", 3 * size,
        lambda: _core.cuda_reduce(d, a, b, "max", 0.5, stream=stream))
    h1 = cp.ones(size // 2, cp.float16)
    h2 = cp.ones(size // 2, cp.float16)
    add("reduce sum float16", 3 * size, lambda: _core.cuda_reduce(h1, h1, h2, "sum", stream=stream))
    bf1 = cp.zeros(size // 2, cp.uint16)
    bf2 = cp.zeros(size // 2, cp.uint16)
    add("reduce sum bfloat16", 3 * size,
        lambda: _core.cuda_reduce(bf1, bf1, bf2, "sum", dtype="bfloat16", stream=stream))
    i8a = cp.ones(size, cp.int8)
    i8b = cp.ones(size, cp.int8)
    add("reduce product int8", 3 * size,
        lambda: _core.cuda_reduce(i8a, i8a, i8b, "product", stream=stream))
    f64a = cp.ones(size // 8, cp.float64)
    f64b = cp.ones(size // 8, cp.float64)
    add("reduce min float64", 3 * size,
        lambda: _core.cuda_reduce(f64a, f64a, f64b, "min", stream=stream))
    add("scale float32 (d = a * 0.5)", 2 * size,
        lambda: _core.cuda_scale(d, a, 0.5, stream=stream))
    half = cp.empty(size // 4, cp.float16)
    add("fp16 compress (float32 -> float16)", size + size // 2,
        lambda: _core.cuda_cast(half, a, stream=stream))
    add("fp16 decompress (float16 -> float32)", size + size // 2,
        lambda: _core.cuda_cast(d, half, stream=stream))
    return t_copy, rows


def _human(n):
    return f"{n // MiB} MiB" if n >= MiB else f"{n // KiB} KiB" if n >= KiB else f"{n} B"


def _pack_kernels(size, iters, stream, shapes):
    """Pack/unpack rows timed in C++ (_core.cuda_bench_pack), on CudaArrays;
    also a one-part batched copy of ``size`` bytes (the copy reference when
    CuPy is missing)."""
    from tfring import _core

    def zeros(n):
        return _core.CudaArray.from_numpy(np.zeros(n, np.uint8), 0)

    rows = []
    for count, each in shapes:
        fused = zeros(count * each)
        parts = [_core.CudaArray.from_numpy(np.full(each, i % 251, np.uint8), 0)
                 for i in range(count)]
        t = _core.cuda_bench_pack(fused, parts, iters, stream=stream)
        got = fused.to_numpy().reshape(count, each)[:, 0]
        ok = bool(np.array_equal(got, np.arange(count) % 251))
        label = f"{count} x {_human(each)}"
        rows.append((f"pack {label}" + ("" if ok else " WRONG"), 2 * count * each, t))
        t = _core.cuda_bench_pack(fused, parts, iters, unpack=True, stream=stream)
        rows.append((f"unpack {label}", 2 * count * each, t))
        del fused, parts
    src, dst = zeros(size), zeros(size)
    t_one = _core.cuda_bench_pack(dst, [src], iters, stream=stream)
    return t_one, rows


def bench_kernels(args):
    from tfring import _core

    size = (KiB if args.dry_run else (64 if args.quick else 256) * MiB)
    iters = 2 if args.dry_run else (10 if args.quick else 30)
    shapes = ([(4, 256), (16, KiB)] if args.dry_run
              else [(256, size // 256), (4096, 16 * KiB)])
    cp = _cupy()
    rows = []
    if cp is not None:
        stream = cp.cuda.get_current_stream().ptr
        t_copy, rows = _cupy_kernels(cp, size, iters, stream)
        ref = "D2D copy (cudaMemcpyAsync)"
    else:
        stream = _core.cuda_stream_create(0)
    t_one, pack_rows = _pack_kernels(size, iters, stream, shapes)
    if cp is None:
        _core.cuda_stream_destroy(stream, 0)
        t_copy, ref = t_one, "D2D copy (one batched-copy launch; no CuPy)"
        rows.append((ref, 2 * size, t_copy))
    rows += pack_rows
    copy_bw = 2 * size / t_copy
    print(f"\n== Kernels on {_core.cuda_describe(0)}, {size // KiB} KiB buffers ==")
    print(f"reference: {ref}" + ("" if cp else "; CuPy missing: reduce/cast rows skipped"))
    print(f"{'kernel':44s} {'GB/s':>9s} {'% of copy':>10s} {'time ms':>9s}")
    out = []
    for name, nbytes, t in rows:
        bw = nbytes / t
        print(f"{name:44s} {bw / 1e9:9.1f} {100 * bw / copy_bw:9.1f}% {t * 1e3:9.3f}")
        out.append({"kernel": name, "bytes": nbytes, "seconds": t, "GBps": bw / 1e9,
                    "pct_of_copy": 100 * bw / copy_bw})
    return copy_bw, out


def bench_api(args):
    """The host cost of the CUDA runtime calls a small collective makes,
    through CuPy, in this process (under MPS they talk to the server): the
    floor under any GPU collective's latency."""
    cp = _cupy()
    if cp is None:
        print("\n== CUDA API costs: skipped (no CuPy) ==")
        return None
    rt = cp.cuda.runtime
    n = 50 if args.dry_run else 20000
    a = cp.zeros(1024, cp.float32)
    s = cp.cuda.Stream(non_blocking=True)
    ev = cp.cuda.Event(disable_timing=True)
    calls = {
        "cudaPointerGetAttributes": lambda: rt.pointerGetAttributes(a.data.ptr),
        "cudaStreamQuery (idle stream)": lambda: rt.streamQuery(s.ptr),
        "cudaEventRecord + cudaEventQuery": lambda: (rt.eventRecord(ev.ptr, s.ptr),
                                                     rt.eventQuery(ev.ptr)),
        "cudaGetDevice": rt.getDevice,
    }

    def launch_sync():
        with s:
            a.fill(1.0)
        s.synchronize()

    calls["tiny kernel launch + stream sync"] = launch_sync
    out = {}
    print(f"\n== CUDA API costs (mode {args.mode}), us per call ==")
    for name, fn in calls.items():
        for _ in range(100):
            fn()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        out[name] = (time.perf_counter() - t0) / n
        print(f"{name:40s} {out[name] * 1e6:8.2f}")
    return out


def _copy_bw(args):
    """Device-to-device copy bandwidth (bytes/s) for "% of bound" when the
    kernel table was skipped: cudaMemcpyAsync through CuPy, else one
    batched-copy launch."""
    from tfring import _core

    size = KiB if args.dry_run else 64 * MiB
    cp = _cupy()
    if cp is not None:
        a, d = cp.ones(size, cp.uint8), cp.empty(size, cp.uint8)
        t = _time_cupy(lambda: cp.cuda.runtime.memcpyAsync(d.data.ptr, a.data.ptr, size, 3, 0),
                       cp, 20)
    else:
        src = _core.CudaArray.from_numpy(np.zeros(size, np.uint8), 0)
        dst = _core.CudaArray.from_numpy(np.zeros(size, np.uint8), 0)
        t = _core.cuda_bench_pack(dst, [src], 2 if args.dry_run else 20)
    return 2 * size / t


# ----------------------------------------------------------- allreduce ----

def _timed_loops(fn, sync, reps, iters):
    """Median over ``reps`` synchronised loops of ``iters`` calls: seconds per call."""
    times = []
    for _ in range(reps):
        sync()
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        times.append((time.perf_counter() - t0) / iters)
    return statistics.median(times)


def worker(spec):
    """One rank: checks then times each size and the batch; rank 0 prints
    one JSON line with the slowest rank's times."""
    import tfring.basics as basics
    from tfring import _core

    basics.init()
    rank, n = basics.rank(), basics.size()
    dev = int(os.environ.get("TFRING_BENCH_DEVICE", basics.local_rank() % _core.cuda_device_count()))
    counter = iter(range(1 << 30))

    def sync():
        _core.allreduce(np.zeros(1), name=f"sync.{next(counter)}")

    def slowest(t):
        return float(_core.allreduce(np.array([t]), op="max", name=f"t.{next(counter)}")[0])

    def agree(ok):
        return float(_core.allreduce(np.array([0.0 if ok else 1.0]), op="max",
                                     name=f"ok.{next(counter)}")[0]) == 0.0

    want = n * (n + 1) / 2
    results = []
    for s in spec["sizes"]:
        x = _core.CudaArray.from_numpy(np.full(s // 4, rank + 1, np.float32), dev)
        _core.allreduce(x, op="sum", name=f"ar.{s}", out=x)  # checked on fresh values
        v = x.to_numpy()
        ok = agree(bool(v[0] == want and v[-1] == want))
        for _ in range(spec["warmup"]):
            _core.allreduce(x, op="sum", name=f"ar.{s}", out=x)
        it = max(1, min(spec["iters"], int(spec["loop_bytes"] // s)))
        t = _timed_loops(lambda x=x, s=s: _core.allreduce(x, op="sum", name=f"ar.{s}", out=x),
                         sync, spec["reps"], it)
        results.append({"bytes": s, "seconds": slowest(t), "iters": it, "ok": ok})
        del x
    batch = None
    if spec.get("batch"):
        count, each = spec["batch"]
        xs = [_core.CudaArray.from_numpy(np.full(each // 4, rank + 1, np.float32), dev)
              for _ in range(count)]
        names = [f"batch.{i}" for i in range(count)]

        def run_batch():
            hs = [_core.allreduce_async(a, op="sum", name=nm, out=a) for a, nm in zip(xs, names)]
            for h in hs:
                h.wait(spec["timeout"])

        run_batch()
        ok = agree(all(a.to_numpy()[0] == want for a in xs))
        t = slowest(_timed_loops(run_batch, sync, spec["reps"], spec["batch_iters"]))
        batch = {"procs": n, "count": count, "tensor_bytes": each, "seconds": t,
                 "per_tensor_s": t / count, "ok": ok}
    group = None
    if spec.get("group"):
        # A model's gradients in backprop order (last layer first), each
        # submitted as its own allreduce then waited for together, as a
        # training step's gradients reach the engine: next to one tensor of
        # the same total size (in "sizes"), in this same job.
        xs = [_core.CudaArray.from_numpy(np.full(c, rank + 1, np.float32), dev)
              for c in spec["group"]]
        names = [f"grad.{i}" for i in range(len(xs))]

        def run_group():
            hs = [_core.allreduce_async(a, op="sum", name=nm, out=a) for a, nm in zip(xs, names)]
            for h in hs:
                h.wait(spec["timeout"])

        run_group()
        ok = agree(all(a.to_numpy()[0] == want and a.to_numpy()[-1] == want for a in xs))
        for _ in range(spec["warmup"]):
            run_group()
        t = slowest(_timed_loops(run_group, sync, spec["reps"], spec["group_iters"]))
        group = {"procs": n, "count": len(xs), "bytes": 4 * sum(spec["group"]),
                 "seconds": t, "ok": ok}
    # Which CUDA-IPC algorithms really ran (a forced one must show up here).
    counts = dict(_core.gpu_allreduce_algorithms())
    if rank == 0:
        print(json.dumps({"backend": _core.gpu_backend(), "algo_counts": counts,
                          "results": results, "batch": batch, "group": group}), flush=True)
    basics.shutdown()


def run_job(n, env, spec, timeout):
    from tfring import _core

    secret = secrets.token_hex(16)
    server = _core.TcpStoreServer("127.0.0.1", 0, secret)
    procs = []
    try:
        for r in range(n):
            e = dict(os.environ)
            e.update({"TFRING_RANK": str(r), "TFRING_SIZE": str(n),
                      "TFRING_STORE_ADDR": f"127.0.0.1:{server.port}", "TFRING_SECRET": secret,
                      "TFRING_TIMEOUT": "120", "PYTHONUNBUFFERED": "1"})
            e.update(env)
            procs.append(subprocess.Popen(
                [sys.executable, os.path.abspath(__file__), "--worker", json.dumps(spec)],
                env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        outs = []
        for p in procs:
            o, err = p.communicate(timeout=timeout)
            outs.append((p.returncode, o, err))
        for r, (rc, o, err) in enumerate(outs):
            if rc != 0:
                raise RuntimeError(f"rank {r} of {n} exited {rc}:\n{err[-3000:]}")
        return json.loads(outs[0][1].strip().splitlines()[-1])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        server.stop()


def _spec(args, sizes, batch=None, dry=False):
    if args.dry_run or dry:
        return {"sizes": sizes, "iters": 1, "reps": 1, "warmup": 0, "loop_bytes": 1 << 40,
                "batch": batch, "batch_iters": 1, "timeout": args.timeout}
    return {"sizes": sizes, "iters": 200, "reps": 3 if args.quick else 5, "warmup": 3,
            "loop_bytes": 8 << 30, "batch": batch, "batch_iters": 5, "timeout": args.timeout}


def _row(algo, n, kind, r, copy_bw, backend, mode):
    s, t = r["bytes"], r["seconds"]
    busbw = s / t * 2 * (n - 1) / n
    row = {"algo": algo, "procs": n, "kind": kind, "bytes": s, "seconds": t,
           "busbw_GBps": busbw / 1e9, "ok": r["ok"], "backend": backend, "mode": mode}
    if n > 1 and copy_bw:
        row["pct_of_bound"] = 100 * 5 * (n - 1) * s / copy_bw / t
    return row


def bench_allreduce(args, copy_bw):
    """Every algorithm x rank count: latency and bandwidth rows; algorithms
    this build cannot force are skipped with the reason."""
    lat = [4 * KiB] if args.dry_run else LATENCY_SIZES
    bw = [64 * KiB] if args.dry_run else BANDWIDTH_SIZES[:5 if args.quick else 6]
    rows, skipped = [], {}
    for algo in args.algos:
        env = {"TFRING_GPU_BACKEND": "ring", "TFRING_BENCH_DEVICE": "0",
               "TFRING_GPU_ALLREDUCE_ALGO": algo}
        sizes = lat + [s for s in bw if s not in lat]
        if algo == "host":  # the ring staged through pinned host memory
            env.update(TFRING_GPU_IPC="0", TFRING_GPU_ALLREDUCE_ALGO="auto")
            sizes = [s for s in sizes if s <= 16 * MiB]  # a few GB/s: seconds per call above
        if algo not in ("ring", "auto", "host"):  # can this build force it? one tiny job says
            try:
                probe = run_job(min(2, max(args.procs)), env, _spec(args, [4 * KiB], dry=True),
                                args.timeout)
                if not probe.get("algo_counts", {}).get(algo):
                    skipped[algo] = (f"TFRING_GPU_ALLREDUCE_ALGO={algo} did not run it "
                                     f"(allreduces per algorithm: {probe.get('algo_counts')}): "
                                     "the run would be the ring")
            except (RuntimeError, subprocess.TimeoutExpired) as e:
                skipped[algo] = f"forcing it failed: {str(e).strip().splitlines()[-1][:300]}"
            if algo in skipped:
                print(f"\n{algo}: skipped ({skipped[algo]})")
                continue
        for n in args.procs:
            try:
                res = run_job(n, env, _spec(args, sizes), args.timeout)
            except (RuntimeError, subprocess.TimeoutExpired) as e:
                skipped[algo] = f"{n} ranks: {str(e).strip().splitlines()[-1][:300]}"
                print(f"\n{algo}: skipped ({skipped[algo]})")
                break
            for r in res["results"]:
                kind = "latency" if r["bytes"] in lat else "bandwidth"
                rows.append(_row(algo, n, kind, r, copy_bw, res["backend"], args.mode))
                if r["bytes"] in lat and r["bytes"] in bw:  # 1 MiB: both tables
                    rows.append(_row(algo, n, "bandwidth", r, copy_bw, res["backend"], args.mode))
    print(f"\n== Allreduce, float32, in place, ranks sharing GPU 0, mode {args.mode} ==")
    print(f"{'algo':>8s} {'ranks':>5s} {'size':>9s} {'us':>10s} {'busbw GB/s':>11s} "
          f"{'% of bound':>11s} {'check':>6s}")
    for kind in ("latency", "bandwidth"):
        print(f"-- {kind}")
        for r in (x for x in rows if x["kind"] == kind):
            pct = f"{r['pct_of_bound']:10.1f}%" if "pct_of_bound" in r else f"{'-':>11s}"
            label = _human(r["bytes"])
            print(f"{r['algo']:>8s} {r['procs']:5d} {label:>9s} {r['seconds'] * 1e6:10.1f} "
                  f"{r['busbw_GBps']:11.2f} {pct} {'ok' if r['ok'] else 'WRONG':>6s}")
    return rows, skipped


def bench_batch(args):
    count, each = (8, 16 * KiB) if args.dry_run else (256, 16 * KiB)
    out = []
    print(f"\n== Batch: {count} x {each // KiB} KiB allreduce_async then wait, mode {args.mode} ==")
    for n in (1, 2):
        try:
            res = run_job(n, {"TFRING_GPU_BACKEND": "ring", "TFRING_BENCH_DEVICE": "0"},
                          _spec(args, [], [count, each]), args.timeout)
        except (RuntimeError, subprocess.TimeoutExpired) as e:
            print(f"{n} rank(s): failed: {str(e).strip().splitlines()[-1][:300]}")
            continue
        b = dict(res["batch"], mode=args.mode, backend=res["backend"])
        print(f"{n} rank(s): {b['seconds'] * 1e3:.3f} ms per batch, "
              f"{b['per_tensor_s'] * 1e6:.2f} us per tensor {'ok' if b['ok'] else 'WRONG'}"
              + ("  (target <= 1.5 ms at 2 ranks)" if n == 2 else ""))
        out.append(b)
    return out


def bench_model(args):
    """ResNet-50's 161 gradients (benchmarks/model_zoo.py), float32, each its
    own allreduce_async in backprop order then all waited for, against one
    allreduce of a tensor of the same total size, in the same job: what the
    engine's fusion (pack, ring, unpack) costs a training step on top of the
    bare allreduce."""
    sys.path.insert(0, HERE)
    import model_zoo

    counts = [t.elems for t in reversed(model_zoo.resnet50())]
    if args.dry_run:
        counts = [max(1, c // 4096) for c in counts[:8]]
    total = 4 * sum(counts)
    spec = dict(_spec(args, [total]), group=counts,
                group_iters=1 if args.dry_run else (5 if args.quick else 10))
    out = []
    print(f"\n== ResNet-50's gradients: {len(counts)} tensors, {_human(total)}, "
          f"fused by the engine, against one {_human(total)} tensor; mode {args.mode} ==")
    for n in (1, 2):
        try:
            res = run_job(n, {"TFRING_GPU_BACKEND": "ring", "TFRING_BENCH_DEVICE": "0"}, spec,
                          args.timeout)
        except (RuntimeError, subprocess.TimeoutExpired) as e:
            print(f"{n} rank(s): failed: {str(e).strip().splitlines()[-1][:300]}")
            continue
        g, one = res["group"], res["results"][0]
        row = dict(g, one_seconds=one["seconds"], ratio=g["seconds"] / one["seconds"],
                   mode=args.mode, backend=res["backend"])
        print(f"{n} rank(s): {len(counts)} tensors {g['seconds'] * 1e3:.3f} ms, one tensor "
              f"{one['seconds'] * 1e3:.3f} ms: {row['ratio']:.2f}x "
              f"{'ok' if g['ok'] and one['ok'] else 'WRONG'}")
        out.append(row)
    return out


def bench_nccl(args, copy_bw):
    from tfring import _core

    info = _core.nccl_info()
    print("\n== NCCL ==")
    if not info["loaded"]:
        print(f"not loaded: {info['error']}")
        return {"loaded": False, "error": info["error"]}
    print(f"NCCL {info['version']} from {info['path']}")
    sizes = [4 * KiB] if args.dry_run else LATENCY_SIZES + [64 * MiB]
    out = {"loaded": True, "version": info["version"]}
    try:
        res = run_job(1, {"TFRING_GPU_BACKEND": "nccl"}, _spec(args, sizes), args.timeout)
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        print(f"1 rank: failed: {str(e).strip().splitlines()[-1][:300]}")
        return dict(out, error=str(e)[-1000:])
    for r in res["results"]:
        print(f"1 rank, {r['bytes'] // KiB} KiB: backend {res['backend']}, "
              f"{r['seconds'] * 1e6:.1f} us, {'ok' if r['ok'] else 'WRONG'}")
    out["one_rank"] = res
    if _core.cuda_device_count() >= 2 and not args.dry_run:
        n = _core.cuda_device_count()
        res = run_job(n, {"TFRING_GPU_BACKEND": "nccl"}, _spec(args, BANDWIDTH_SIZES),
                      args.timeout)
        print(f"{n} ranks, one GPU each:")
        for r in res["results"]:
            s, t = r["bytes"], r["seconds"]
            print(f"  {s // MiB:5d} MiB  busbw {s / t * 2 * (n - 1) / n / 1e9:8.2f} GB/s "
                  f"{'ok' if r['ok'] else 'WRONG'}")
        out["multi"] = dict(res, procs=n)
    return out


def _ints(text):
    return [int(x) for x in text.split(",")]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="smaller sizes, fewer iterations")
    ap.add_argument("--dry-run", action="store_true",
                    help="every code path, tiny sizes, 1-2 iterations; not a measurement "
                    "(runs on the CUDA emulation build)")
    ap.add_argument("--mode", choices=("timeslice", "mps"),
                    default=os.environ.get("TFRING_BENCH_MODE") or "timeslice",
                    help="how the ranks share the GPU (a label for the table and JSON; "
                    "start MPS yourself: nvidia-cuda-mps-control -d)")
    ap.add_argument("--algos", type=lambda s: s.split(","), default=list(ALGOS),
                    help="comma list of " + ",".join(ALGOS))
    ap.add_argument("--procs", type=_ints, default=[1, 2, 4], help="rank counts (default 1,2,4)")
    ap.add_argument("--timeout", type=float, default=400, help="seconds per job")
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--skip", default="",
                    help="comma list of kernels,api,allreduce,batch,model,nccl to skip")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(json.loads(args.worker))
        return
    from tfring import _core

    if not _core.cuda_available():
        sys.exit(f"no usable GPU: {_core.cuda_unavailable_reason()}")
    if _core.cuda_emulated() and not args.dry_run:
        sys.exit("this tfring is the CUDA emulation build (tests/gpu_emu.sh): its timings "
                 "measure host threads, not a GPU; build with nvcc (tools/gpu_run.sh), "
                 "or pass --dry-run to exercise the code paths only")
    if args.dry_run:
        print("DRY RUN: tiny sizes, single iterations; the numbers below measure nothing")
    skip = set(filter(None, args.skip.split(",")))
    report = {"benchmark": "gpu", "mode": args.mode, "dry_run": args.dry_run,
              "emulated": _core.cuda_emulated(), "device": _core.cuda_describe(0)}
    print(f"GPU sharing mode: {args.mode}")
    copy_bw = None
    if "kernels" not in skip:
        copy_bw, report["kernels"] = bench_kernels(args)
    if "api" not in skip:
        report["api"] = bench_api(args)
    if copy_bw is None and "allreduce" not in skip:
        copy_bw = _copy_bw(args)
    if "allreduce" not in skip:
        report["allreduce"], report["skipped_algos"] = bench_allreduce(args, copy_bw)
    if "batch" not in skip:
        report["batch"] = bench_batch(args)
    if "model" not in skip:
        report["model"] = bench_model(args)
    if "nccl" not in skip:
        report["nccl"] = bench_nccl(args, copy_bw)
    report["copy_GBps"] = copy_bw / 1e9 if copy_bw else None
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
