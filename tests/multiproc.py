"""Spawns the ranks of a test job: N Python processes, each running a worker
script with TFRING_RANK/TFRING_SIZE and a store hosted by the test process.
No launcher is needed; every wait has a deadline."""

import json
import os
import re
import secrets
import signal
import subprocess
import sys
from dataclasses import dataclass

from tfring import _core

WORKERS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "workers")


@dataclass
class RankResult:
    rank: int
    returncode: int
    stdout: str
    stderr: str
    result: object  # what the worker wrote with report()


def run_ranks(n, worker, args=(), env=None, timeout=120, per_rank_env=None):
    """Runs tests/workers/<worker> on n ranks; returns [RankResult] in rank
    order. Fails the calling test (via AssertionError) on a hang."""
    secret = secrets.token_hex(16)
    server = _core.TcpStoreServer("127.0.0.1", 0, secret)
    outdir = os.environ.get("PYTEST_TMPDIR") or os.path.join("/tmp", "tfring-tests")
    os.makedirs(outdir, exist_ok=True)
    tag = secrets.token_hex(4)
    procs = []
    try:
        for r in range(n):
            e = dict(os.environ)
            e.update({
                "TFRING_RANK": str(r),
                "TFRING_SIZE": str(n),
                "TFRING_STORE_ADDR": f"127.0.0.1:{server.port}",
                "TFRING_SECRET": secret,
                "TFRING_TIMEOUT": "60",
                "TFRING_RESULT": os.path.join(outdir, f"{tag}.{r}.json"),
                "PYTHONUNBUFFERED": "1",
                # A hung rank is sent SIGABRT below: this prints every
                # thread's Python stack first.
                "PYTHONFAULTHANDLER": "1",
                "OMP_NUM_THREADS": "1",
            })
            if env:
                e.update({k: str(v) for k, v in env.items()})
            if per_rank_env:
                e.update({k: str(v) for k, v in per_rank_env(r).items()})
            procs.append(subprocess.Popen(
                [sys.executable, os.path.join(WORKERS, worker), *map(str, args)],
                env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        results = []
        for r, p in enumerate(procs):
            try:
                out, err = p.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                # Every rank still running dumps its threads' Python stacks
                # (SIGABRT under PYTHONFAULTHANDLER), so the failure shows
                # where each one waited.
                for q in procs:
                    if q.poll() is None:
                        q.send_signal(signal.SIGABRT)
                outs = []
                for q in procs:
                    try:
                        outs.append(q.communicate(timeout=10)[1][-6000:])
                    except subprocess.TimeoutExpired:
                        q.kill()
                        outs.append(q.communicate()[1][-6000:])
                raise AssertionError(f"rank {r} hung past {timeout} s; stderr tails: {outs}")
            path = os.path.join(outdir, f"{tag}.{r}.json")
            res = None
            if os.path.exists(path):
                with open(path) as f:
                    res = json.load(f)
                os.unlink(path)
            results.append(RankResult(r, p.returncode, out, err, res))
        return results
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        server.stop()


def run_passes(n, worker, passes, args=(), env=None, timeout=120, per_rank_env=None):
    """One launch of n ranks that runs the worker once per environment in
    `passes` (the worker loops with common.run_passes: set the pass's
    variables, init, run, shutdown), instead of one launch per
    configuration. `timeout` is per pass. Returns [pass][rank] of what each
    pass reported; fails like check_ok when a rank fails."""
    env = dict(env or {}, TEST_PASSES=json.dumps(passes))
    res = check_ok(run_ranks(n, worker, args, env=env, timeout=timeout * len(passes),
                             per_rank_env=per_rank_env))
    for r, out in enumerate(res):
        assert isinstance(out, list) and len(out) == len(passes), (r, out)
    return [list(per_rank) for per_rank in zip(*res)]


def check_ok(results):
    for r in results:
        assert r.returncode == 0, (
            f"rank {r.rank} exited {r.returncode}\nstdout:\n{r.stdout[-3000:]}\n"
            f"stderr:\n{r.stderr[-3000:]}")
    return [r.result for r in results]


def first_rank_named(message):
    """The first rank number a failure message names ("rank 7 ..."), or None."""
    m = re.search(r"\brank (\d+)", message)
    return int(m.group(1)) if m else None


def check_peer_failure(results, victim, within):
    """The victim died; every other rank exited normally after raising
    PeerFailureError that names it first (before the rank that noticed),
    `within` seconds into the scenario: death is detected, not waited out
    until TFRING_TIMEOUT."""
    for r in results:
        if r.rank == victim:
            assert r.returncode != 0, f"rank {victim} was to die"
            continue
        assert r.returncode == 0, r.stderr[-3000:]
        out = r.result
        assert out["error"] == "PeerFailureError", out
        assert first_rank_named(out["message"]) == victim, (r.rank, out["message"])
        assert out["elapsed"] < within, out


def rank_results(results, check):
    """Each rank's report for `check`, in rank order; fails, with the rank's
    output, if a rank exited without writing its results."""
    outs = []
    for r in results:
        assert r.result is not None, (
            f"rank {r.rank} exited {r.returncode} without results\n"
            f"stdout:\n{r.stdout[-3000:]}\nstderr:\n{r.stderr[-5000:]}")
        outs.append(r.result[check])
    return outs
