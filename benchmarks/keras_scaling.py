"""Keras training throughput: tfring at 1 and 2 ranks next to TensorFlow's
MultiWorkerMirroredStrategy, same model, same machine, same run.

    python benchmarks/keras_scaling.py                 # ResNet-50 and mlp
    python benchmarks/keras_scaling.py --models mlp --json out.json
    python benchmarks/keras_scaling.py --quick         # small settings
    python benchmarks/keras_scaling.py --rounds 1      # each run once

For each model it runs examples/synthetic_benchmark.py (a tf.function
training step on synthetic images) as:
  tfring x1   one rank using every core (no communication)
  tfring x2   two ranks, the step rewritten with tfring.rewrite
  none x2     two ranks training alone (same per-rank work, no gradient
              exchange): the compute-only time of a 2-rank step
  mwms x2     two workers under tf.distribute.MultiWorkerMirroredStrategy
              (RING collectives over gRPC on localhost)
  fit x2      two ranks, model.fit with RingAllreduceCallback
  fit none x2 two ranks, model.fit training alone (compute of a fit step)

and reports images/s per rank and in total, scaling efficiency
(total at 2 ranks / (2 x total at 1 rank)), tfring's speed-up over MWMS and
the exposed communication time: the part of a 2-rank step not explained
by its compute, 1 - t_step(none x2) / t_step(backend x2) (for fit x2,
against fit none x2).

The floor: the gradient bytes of the model (4 bytes per parameter) and the
time tfring's core takes to allreduce them at 2 ranks, alone (one buffer,
median of 5). "exposed / floor" is the exposed time per step divided by
that floor: 1 means the step pays the whole allreduce on top of compute (no
overlap), 0 that communication is hidden entirely. The same allreduce
through the TF op (eager, named, on a tensor of the gradients' size: the
path a training step takes) is the second floor, reported beside it.
"""

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

from _common import affinity_module

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(ROOT, "examples", "synthetic_benchmark.py")

# Per model: synthetic_benchmark.py arguments.
CONFIGS = {
    "resnet50": ["--model", "resnet50", "--image-size", "224",
                 "--batch-size", "8", "--num-warmup-batches", "1",
                 "--num-batches-per-iter", "3", "--num-iters", "3"],
    "mlp": ["--model", "mlp", "--image-size", "32", "--batch-size", "32",
            "--num-warmup-batches", "2", "--num-batches-per-iter", "5",
            "--num-iters", "4"],
}
QUICK = {
    "resnet50": ["--model", "resnet50", "--image-size", "64",
                 "--batch-size", "4", "--num-warmup-batches", "1",
                 "--num-batches-per-iter", "1", "--num-iters", "2"],
    "mlp": ["--model", "mlp", "--image-size", "32", "--batch-size", "16",
            "--num-warmup-batches", "1", "--num-batches-per-iter", "2",
            "--num-iters", "2"],
}


def _env():
    env = dict(os.environ)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env.setdefault("CUDA_VISIBLE_DEVICES", "")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _results(text):
    """The RESULT {json} lines of every rank (launcher prefixes allowed)."""
    out = []
    for line in text.splitlines():
        i = line.find("RESULT ")
        if i >= 0:
            out.append(json.loads(line[i + len("RESULT "):]))
    return sorted(out, key=lambda r: r["rank"])


def run_tfring(np_, backend, args, timeout, threads=0):
    cmd = [sys.executable, "-m", "tfring.run", "-np", str(np_),
           "--timeout", str(timeout), sys.executable, EXAMPLE,
           "--backend", backend, *args]
    if threads:
        cmd += ["--threads", str(threads)]
    with tempfile.TemporaryDirectory() as cwd:
        proc = subprocess.run(cmd, env=_env(), cwd=cwd, capture_output=True,
                              text=True, timeout=timeout + 60, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}:\n"
                           f"{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    return _results(proc.stdout)


def _free_ports(n):
    socks, ports = [], []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
        ports.append(s.getsockname()[1])
    for s in socks:
        s.close()
    return ports


def run_mwms(workers, args, timeout):
    ports = _free_ports(workers)
    cluster = {"worker": [f"localhost:{p}" for p in ports]}
    procs = []
    with tempfile.TemporaryDirectory() as cwd:
        try:
            for i in range(workers):
                env = _env()
                env["TF_CONFIG"] = json.dumps(
                    {"cluster": cluster, "task": {"type": "worker", "index": i}})
                for k in list(env):
                    if k.startswith("TFRING_"):
                        del env[k]
                # The workers get the cores tfring-run would give its ranks,
                # from their start, so both run with the same placement.
                affinity = affinity_module()
                cpus = (None if os.environ.get("TFRING_BIND") == "none"
                        else affinity.slice_for(i, workers))
                with affinity.inherited(cpus):
                    procs.append(subprocess.Popen(
                        [sys.executable, EXAMPLE, "--backend", "mwms", *args],
                        env=env, cwd=cwd, stdout=subprocess.PIPE,
                        stderr=subprocess.PIPE, text=True))
            outs, deadline = [], time.monotonic() + timeout
            for p in procs:
                out, err = p.communicate(
                    timeout=max(1.0, deadline - time.monotonic()))
                if p.returncode != 0:
                    raise RuntimeError(f"MWMS worker exited {p.returncode}:\n"
                                       f"{out[-2000:]}\n{err[-3000:]}")
                outs.append(out)
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.communicate()
    return _results("\n".join(outs))


FLOOR_SCRIPT = r'''
import statistics, sys, time
import numpy as np
import tfring
from tfring import _core
tfring.init()

def slowest_median(call, name):
    """One call to warm up, then the median of 5, the slowest rank's."""
    call()
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    return float(_core.allreduce(np.array([statistics.median(times)]), op="max", name=name)[0])

buf = np.ones(int(sys.argv[1]) // 4, np.float32)
core = slowest_median(lambda: _core.allreduce(buf, op="sum", name="floor", out=buf), "floor.t")
import tensorflow as tf
t = tf.ones([buf.size], tf.float32)
tf_op = slowest_median(lambda: tfring.allreduce(t, op=tfring.Sum, name="floor.tf"), "floor.tt")
if tfring.rank() == 0:
    print("FLOOR", core, tf_op, flush=True)
'''


def floors(nbytes, timeout):
    """(core, TF op): seconds tfring's core and its TF op (eager) take to
    allreduce nbytes at 2 ranks."""
    cmd = [sys.executable, "-m", "tfring.run", "-np", "2", "--timeout",
           str(timeout), sys.executable, "-c", FLOOR_SCRIPT, str(nbytes)]
    proc = subprocess.run(cmd, env=_env(), capture_output=True, text=True,
                          timeout=timeout + 60, check=False)
    for line in proc.stdout.splitlines():
        i = line.find("FLOOR ")
        if i >= 0:
            core, tf_op = line[i + len("FLOOR "):].split()
            return float(core), float(tf_op)
    raise RuntimeError(f"floor run exited {proc.returncode}:\n"
                       f"{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")


def summarize(rows):
    """rows: one RESULT per rank -> per-rank mean, total, step time."""
    per_rank = sum(r["images_per_sec"] for r in rows) / len(rows)
    return {"ranks": len(rows),
            "images_per_sec_per_rank": per_rank,
            "images_per_sec_total": sum(r["images_per_sec"] for r in rows),
            "step_time_s": max(r["step_time_s"] for r in rows),
            "threads_per_rank": rows[0]["threads"],
            "params": rows[0]["params"]}


# The 2-rank runs that the exposed time compares, repeated `rounds` times in
# turn: the machine's speed drifts over minutes, and a run and its baseline
# then see the same drift. Each keeps the run with its median step time.
PAIRED = ("tfring x2", "none x2", "fit x2", "fit none x2")


def bench_model(name, args, timeout, cores, rounds=1):
    print(f"== {name}: {' '.join(args)}", flush=True)
    res, seen = {}, {}
    runs = {"tfring x1": lambda: run_tfring(1, "tfring", args, timeout, cores),
            "tfring x2": lambda: run_tfring(2, "tfring", args, timeout),
            "none x2": lambda: run_tfring(2, "none", args, timeout),
            "mwms x2": lambda: run_mwms(2, args, timeout),
            "fit x2": lambda: run_tfring(2, "tfring", args + ["--fit"], timeout),
            "fit none x2": lambda: run_tfring(2, "none", args + ["--fit"], timeout)}
    order = ["tfring x1", "mwms x2"] + [label for _ in range(rounds) for label in PAIRED]
    for label in order:
        t0 = time.monotonic()
        r = summarize(runs[label]())
        seen.setdefault(label, []).append(r)
        print(f"   {label:10s} {r['images_per_sec_per_rank']:9.2f} img/s/rank "
              f"{r['images_per_sec_total']:9.2f} img/s total  step "
              f"{r['step_time_s']:.3f} s  ({time.monotonic() - t0:.0f} s)",
              flush=True)
    for label, rs in seen.items():
        rs = sorted(rs, key=lambda r: r["step_time_s"])
        res[label] = dict(rs[len(rs) // 2], rounds=len(rs),
                          step_times_s=[r["step_time_s"] for r in seen[label]])
    one = res["tfring x1"]["images_per_sec_total"]
    grad_bytes = 4 * res["tfring x2"]["params"]
    floor, tf_floor = floors(grad_bytes, timeout)
    res["gradient_bytes"], res["core_allreduce_floor_s"] = grad_bytes, floor
    res["tf_op_allreduce_floor_s"] = tf_floor
    print(f"   gradients {grad_bytes / 1e6:.1f} MB; the core allreduces them in "
          f"{floor * 1e3:.1f} ms at 2 ranks, the TF op in {tf_floor * 1e3:.1f} ms", flush=True)
    for label, base in (("tfring x2", "none x2"), ("mwms x2", "none x2"),
                        ("none x2", "none x2"), ("fit x2", "fit none x2"),
                        ("fit none x2", "fit none x2")):
        r = res[label]
        compute = res[base]["step_time_s"]
        r["scaling_efficiency"] = r["images_per_sec_total"] / (2 * one)
        r["exposed_comm_fraction"] = 1 - compute / r["step_time_s"]
        r["exposed_comm_s"] = r["step_time_s"] - compute
        r["exposed_over_floor"] = r["exposed_comm_s"] / floor
        r["exposed_over_tf_floor"] = r["exposed_comm_s"] / tf_floor
        r["floor_fraction"] = floor / r["step_time_s"]
    res["tfring_over_mwms"] = (res["tfring x2"]["images_per_sec_total"]
                               / res["mwms x2"]["images_per_sec_total"])
    return res


def table(all_results):
    lines = [("| model | params | run | img/s per rank | img/s total | "
              "step (s) | scaling eff. | exposed comm | exposed / floor |"),
             "|---|---|---|---|---|---|---|---|---|"]
    for model, res in all_results.items():
        for label in ("tfring x1", "tfring x2", "none x2", "mwms x2", "fit x2",
                      "fit none x2"):
            r = res[label]
            eff = (f"{r['scaling_efficiency']:.0%}"
                   if "scaling_efficiency" in r else "-")
            exp = (f"{r['exposed_comm_fraction']:.1%}"
                   if "exposed_comm_fraction" in r and label != "none x2"
                   else "-")
            vs_floor = (f"{r['exposed_over_floor']:.2f}"
                        if "exposed_over_floor" in r and "none" not in label
                        else "-")
            lines.append(
                f"| {model} | {r['params'] / 1e6:.1f}M | {label} | "
                f"{r['images_per_sec_per_rank']:.2f} | "
                f"{r['images_per_sec_total']:.2f} | {r['step_time_s']:.3f} | "
                f"{eff} | {exp} | {vs_floor} |")
    for model, res in all_results.items():
        lines.append(f"\n{model}: gradients {res['gradient_bytes'] / 1e6:.1f} MB, "
                     f"core allreduce floor {res['core_allreduce_floor_s'] * 1e3:.1f} ms "
                     f"at 2 ranks ({res['tfring x2']['floor_fraction']:.1%} of the "
                     f"tfring x2 step without overlap); TF op allreduce floor "
                     f"{res['tf_op_allreduce_floor_s'] * 1e3:.1f} ms, exposed / TF op floor: "
                     f"tfring x2 {res['tfring x2']['exposed_over_tf_floor']:.2f}, "
                     f"fit x2 {res['fit x2']['exposed_over_tf_floor']:.2f}")
        lines.append(f"\n{model}: tfring x2 / MWMS x2 throughput = "
                     f"{res['tfring_over_mwms']:.2f}x")
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="resnet50,mlp")
    p.add_argument("--quick", action="store_true", help="small settings")
    p.add_argument("--timeout", type=int, default=900, help="per run, s")
    p.add_argument("--json", default="", help="write the results here")
    p.add_argument("--rounds", type=int, default=3,
                   help="times each 2-rank tfring and no-communication run is "
                        "repeated, in turn (median kept)")
    args = p.parse_args()
    cores = os.cpu_count() or 1
    configs = QUICK if args.quick else CONFIGS
    results = {}
    for name in args.models.split(","):
        results[name] = bench_model(name, configs[name], args.timeout, cores, args.rounds)
    print()
    print(f"{cores} cores; 1 rank uses {cores} threads, 2 ranks {max(1, cores // 2)} each")
    print(table(results))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"cores": cores, "configs": {k: configs[k] for k in results},
                       "results": results}, f, indent=2)


if __name__ == "__main__":
    main()
