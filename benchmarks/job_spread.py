#!/usr/bin/env python3
"""Does a job's start-up decide its speed? Large allreduces, job after job.

    python benchmarks/job_spread.py                    # 5 jobs, 2 ranks, 128 MiB
    python benchmarks/job_spread.py --jobs 8 --size 64M --np 4 --json out.json

Starts --jobs fresh jobs one after another (``python -m tfring.run``, no
MPI needed). In each, every rank allreduces a float32 buffer of --size
bytes in place with tfring's core, --calls timed calls after one untimed;
a call's time is the slowest rank's. Prints each job's median and spread,
and the ratio of the slowest job's median to the fastest's: close to 1
when nothing set at start-up (placement, page mapping, spinning) decides a
job's speed.
"""

import argparse
import json
import statistics
import subprocess
import sys

from _common import child_env, human_size, parse_size

JOB = r'''
import json, sys, time
import numpy as np
import tfring
from tfring import _core
tfring.init()
size, calls = int(sys.argv[1]), int(sys.argv[2])
buf = np.full(size // 4, tfring.rank() + 1, np.float32)
_core.allreduce(buf, op="sum", name="spread", out=buf)
times = []
for _ in range(calls):
    t0 = time.perf_counter()
    _core.allreduce(buf, op="sum", name="spread", out=buf)
    times.append(time.perf_counter() - t0)
slowest = _core.allreduce(np.array(times), op="max", name="spread.t")
if tfring.rank() == 0:
    print("TIMES " + json.dumps(slowest.tolist()), flush=True)
'''


def run_job(np_, size, calls, timeout):
    cmd = [sys.executable, "-m", "tfring.run", "-np", str(np_), "--timeout", str(timeout),
           sys.executable, "-c", JOB, str(size), str(calls)]
    proc = subprocess.run(cmd, env=child_env(), capture_output=True, text=True,
                          timeout=timeout + 60, check=False)
    for line in proc.stdout.splitlines():
        i = line.find("TIMES ")
        if i >= 0:
            return json.loads(line[i + len("TIMES "):])
    raise RuntimeError(f"job exited {proc.returncode}:\n{proc.stdout[-2000:]}\n"
                       f"{proc.stderr[-3000:]}")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--jobs", type=int, default=5)
    p.add_argument("--np", type=int, default=2)
    p.add_argument("--size", type=parse_size, default=128 << 20)
    p.add_argument("--calls", type=int, default=7)
    p.add_argument("--timeout", type=int, default=300, help="per job, s")
    p.add_argument("--json", default="")
    args = p.parse_args()
    jobs = []
    for j in range(args.jobs):
        times = run_job(args.np, args.size, args.calls, args.timeout)
        med = statistics.median(times)
        jobs.append({"median_s": med, "min_s": min(times), "max_s": max(times),
                     "times_s": times})
        print(f"job {j}: median {med * 1e3:8.1f} ms  (min {min(times) * 1e3:.1f}, "
              f"max {max(times) * 1e3:.1f})", flush=True)
    meds = [j["median_s"] for j in jobs]
    ratio = max(meds) / min(meds)
    print(f"{args.jobs} jobs of {args.np} ranks, {human_size(args.size)} allreduce: "
          f"slowest / fastest job median = {ratio:.2f}x (target <= 1.2x)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"np": args.np, "size": args.size, "calls": args.calls,
                       "jobs": jobs, "slowest_over_fastest": ratio}, f, indent=2)


if __name__ == "__main__":
    main()
