"""GPU benchmark: kernels, the CUDA-IPC ring on one GPU, NCCL sanity check.

    python benchmarks/gpu_bench.py [--quick] [--json FILE]

Needs a GPU, CuPy and a CUDA build of tfring importable as `tfring`
(benchmarks/gpu_run.sh builds it and runs this). Everything is measured in
this one run, on this GPU, next to its reference:

1. Kernels. Each kernel's achieved bandwidth (bytes read + written per
   second) next to a device-to-device cudaMemcpy of the same size measured
   the same way. Target: reduce and pack >= 90% of the copy.

2. Ring allreduce, 2 and 4 processes sharing GPU 0 (TFRING_GPU_BACKEND=ring,
   so the CUDA-IPC pull ring), float32, 1 MiB to 1 GiB, in place. Reported
   as nccl-tests do: busbw = S/t * 2(N-1)/N, with t the slowest rank's time.
   The bound: every rank reads its neighbour's segment and reduces it into
   its own (2 reads + 1 write) in N-1 steps, then copies N-1 final segments
   (1 read + 1 write): 5(N-1)/N * S bytes of memory traffic per rank, all N
   ranks sharing one GPU's memory. At the copy bandwidth B measured above,
   t_min = 5(N-1) S / B, and "% of bound" = t_min / t. Target: >= 70% for 2
   processes at 256 MiB.

3. NCCL on one rank (TFRING_GPU_BACKEND=nccl): loads, runs, gives the right
   answer; its time is printed for reference. With two or more GPUs, also
   NCCL across them.
"""

import argparse
import json
import os
import secrets
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
MiB = 1 << 20


# ------------------------------------------------------------- kernels ----

def _time(fn, cp, iters):
    fn()
    cp.cuda.Device().synchronize()
    start, stop = cp.cuda.Event(), cp.cuda.Event()
    start.record()
    for _ in range(iters):
        fn()
    stop.record()
    stop.synchronize()
    return cp.cuda.get_elapsed_time(start, stop) / 1e3 / iters


def bench_kernels(quick):
    import cupy as cp

    from tfring import _core

    size = (64 if quick else 256) * MiB
    iters = 10 if quick else 30
    stream = cp.cuda.get_current_stream().ptr
    rows = []

    a = cp.ones(size // 4, cp.float32)
    b = cp.ones(size // 4, cp.float32)
    d = cp.empty_like(a)
    t_copy = _time(lambda: cp.cuda.runtime.memcpyAsync(d.data.ptr, a.data.ptr, size, 3, stream),
                   cp, iters)
    copy_bw = 2 * size / t_copy
    rows.append(("D2D copy (cudaMemcpyAsync)", 2 * size, t_copy))

    def add(name, nbytes, fn):
        rows.append((name, nbytes, _time(fn, cp, iters)))

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
    # Pack / unpack: 256 tensors of 1 MiB (fusion of large gradients), and
    # 4096 tensors of 16 KiB (many small ones).
    for count, each in [(256, size // 256), (4096, 16 * 1024)]:
        fused = cp.empty(count * each, cp.uint8)
        parts = [cp.ones(each, cp.uint8) for _ in range(count)]
        views = [fused[i * each:(i + 1) * each] for i in range(count)]
        pack = list(zip(views, parts))
        unpack = list(zip(parts, views))
        add(f"pack {count} x {each // 1024} KiB", 2 * count * each,
            lambda: _core.cuda_batched_copy(pack, stream=stream))
        add(f"unpack {count} x {each // 1024} KiB", 2 * count * each,
            lambda: _core.cuda_batched_copy(unpack, stream=stream))
        # The same copies with one cudaMemcpyAsync each, for comparison.
        add(f"  ({count} x cudaMemcpyAsync)", 2 * count * each,
            lambda: [cp.cuda.runtime.memcpyAsync(v.data.ptr, p.data.ptr, each, 3, stream)
                     for v, p in pack])

    print(f"\n== Kernels on {_core.cuda_describe(0)}, {size // MiB} MiB buffers ==")
    print(f"{'kernel':44s} {'GB/s':>9s} {'% of copy':>10s} {'time ms':>9s}")
    out = []
    for name, nbytes, t in rows:
        bw = nbytes / t
        print(f"{name:44s} {bw / 1e9:9.1f} {100 * bw / copy_bw:9.1f}% {t * 1e3:9.3f}")
        out.append({"kernel": name, "bytes": nbytes, "seconds": t, "GBps": bw / 1e9,
                    "pct_of_copy": 100 * bw / copy_bw})
    return copy_bw, out


# ------------------------------------------------------ ring allreduce ----

def worker(sizes, iters_for):
    """One rank: allreduce each size, report the per-iteration time of the
    slowest rank (rank 0 prints)."""
    import cupy as cp

    import tfring.basics as basics
    from tfring import _core

    basics.init()
    rank, n = basics.rank(), basics.size()
    dev = int(os.environ.get("TFRING_BENCH_DEVICE", basics.local_rank() % _core.cuda_device_count()))
    cp.cuda.Device(dev).use()
    results = []
    for s in sizes:
        x = cp.full(s // 4, rank + 1, cp.float32)
        it = iters_for(s)
        for w in range(2):
            _core.allreduce(x, op="sum", name=f"warm.{s}.{w}", out=x)
        x.fill(rank + 1)
        cp.cuda.Device().synchronize()
        _core.allreduce(np.zeros(1), name=f"sync.{s}")  # start together
        t0 = time.perf_counter()
        for i in range(it):
            _core.allreduce(x, op="sum", name=f"ar.{s}.{i}", out=x)
        t = (time.perf_counter() - t0) / it
        slowest = float(_core.allreduce(np.array([t]), op="max", name=f"t.{s}")[0])
        # Correct after `it` in-place sums: (n(n+1)/2) * n^(it-1).
        want = n * (n + 1) / 2 * float(n) ** (it - 1)
        got = float(x[:1].get()[0]), float(x[-1:].get()[0])
        ok = all(abs(g - want) <= 1e-5 * want for g in got)
        results.append({"bytes": s, "seconds": slowest, "ok": ok})
    if rank == 0:
        print(json.dumps({"backend": _core.gpu_backend(), "results": results}), flush=True)
    basics.shutdown()


def run_job(n, env, sizes, timeout=400):
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
                [sys.executable, os.path.abspath(__file__), "--worker",
                 ",".join(map(str, sizes))],
                env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        outs = []
        for p in procs:
            o, err = p.communicate(timeout=timeout)
            outs.append((p.returncode, o, err))
        for rc, o, err in outs:
            if rc != 0:
                raise RuntimeError(f"a rank exited {rc}:\n{err[-3000:]}")
        return json.loads(outs[0][1].strip().splitlines()[-1])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        server.stop()


def bench_ring(copy_bw, quick):
    sizes = [MiB << (2 * k) for k in range(6)]  # 1, 4, 16, 64, 256, 1024 MiB
    if quick:
        sizes = sizes[:5]
    out = []
    for n in (2, 4):
        res = run_job(n, {"TFRING_GPU_BACKEND": "ring", "TFRING_BENCH_DEVICE": "0"}, sizes)
        print(f"\n== Ring allreduce, {n} processes on GPU 0, float32, in place "
              f"(backend {res['backend']}) ==")
        print(f"{'size':>10s} {'time ms':>10s} {'algbw GB/s':>11s} {'busbw GB/s':>11s} "
              f"{'% of bound':>11s} {'check':>6s}")
        for r in res["results"]:
            s, t = r["bytes"], r["seconds"]
            busbw = s / t * 2 * (n - 1) / n
            t_min = 5 * (n - 1) * s / copy_bw
            label = f"{s // MiB} MiB"
            print(f"{label:>10s} {t * 1e3:10.3f} {s / t / 1e9:11.2f} {busbw / 1e9:11.2f} "
                  f"{100 * t_min / t:10.1f}% {'ok' if r['ok'] else 'WRONG':>6s}")
            out.append({"procs": n, "bytes": s, "seconds": t, "busbw_GBps": busbw / 1e9,
                        "pct_of_bound": 100 * t_min / t, "ok": r["ok"],
                        "backend": res["backend"]})
    return out


def bench_nccl():
    from tfring import _core

    info = _core.nccl_info()
    print("\n== NCCL ==")
    if not info["loaded"]:
        print(f"not loaded: {info['error']}")
        return {"loaded": False, "error": info["error"]}
    print(f"NCCL {info['version']} from {info['path']}")
    sizes = [64 * MiB]
    res = run_job(1, {"TFRING_GPU_BACKEND": "nccl"}, sizes)
    r = res["results"][0]
    print(f"1 rank, 64 MiB: backend {res['backend']}, {r['seconds'] * 1e3:.3f} ms, "
          f"{'ok' if r['ok'] else 'WRONG'}")
    out = {"loaded": True, "version": info["version"], "one_rank": res}
    if _core.cuda_device_count() >= 2:
        n = _core.cuda_device_count()
        res = run_job(n, {"TFRING_GPU_BACKEND": "nccl"}, [MiB << (2 * k) for k in range(6)])
        print(f"{n} ranks, one GPU each:")
        for r in res["results"]:
            s, t = r["bytes"], r["seconds"]
            print(f"  {s // MiB:5d} MiB  busbw {s / t * 2 * (n - 1) / n / 1e9:8.2f} GB/s "
                  f"{'ok' if r['ok'] else 'WRONG'}")
        out["multi"] = res
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="smaller sizes, fewer iterations")
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--skip", default="", help="comma list of kernels,ring,nccl to skip")
    ap.add_argument("--mode", default=os.environ.get("TFRING_BENCH_MODE", ""),
                    help="label for how ranks share the GPU (timeslice, mps): printed and "
                         "written to the JSON (default $TFRING_BENCH_MODE)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        sizes = [int(s) for s in args.worker.split(",")]
        worker(sizes, lambda s: max(3, min(40, (2 << 30) // s)))
        return
    from tfring import _core

    if not _core.cuda_available():
        sys.exit(f"no usable GPU: {_core.cuda_unavailable_reason()}")
    if _core.cuda_emulated():
        sys.exit("this tfring is the CUDA emulation build (tests/gpu_emu.sh): its timings "
                 "measure host threads, not a GPU; build with nvcc (benchmarks/gpu_run.sh)")
    skip = set(filter(None, args.skip.split(",")))
    report = {"mode": args.mode}
    if args.mode:
        print(f"GPU sharing mode: {args.mode}")
    copy_bw = None
    if "kernels" not in skip:
        copy_bw, report["kernels"] = bench_kernels(args.quick)
    if "ring" not in skip:
        if copy_bw is None:
            import cupy as cp

            a = cp.ones(64 * MiB, cp.uint8)
            d = cp.empty_like(a)
            t = _time(lambda: cp.cuda.runtime.memcpyAsync(d.data.ptr, a.data.ptr, a.nbytes, 3,
                                                          0), cp, 20)
            copy_bw = 2 * a.nbytes / t
        report["ring"] = bench_ring(copy_bw, args.quick)
    if "nccl" not in skip:
        report["nccl"] = bench_nccl()
    report["copy_GBps"] = copy_bw / 1e9 if copy_bw else None
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
