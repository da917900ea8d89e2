"""benchmarks/gpu_bench.py on the CUDA emulation build (tests/gpu_emu.sh):
it refuses to time the emulation, and its dry run takes every code path.
Skipped without the emulation build."""

import glob
import math
import os

import pytest
from bench_util import REPO, _env, _run, _run_raw, requires_core

pytestmark = requires_core


EMU_PKG = os.path.join(REPO, os.environ.get("TFRING_EMU_BUILD", "build-emu"), "pkg")


def _emu_env(tmp_path):
    """A package dir: the emulation build's libraries and links to the sources."""
    libs = glob.glob(os.path.join(EMU_PKG, "tfring", "*.so"))
    if not any(os.path.basename(f).startswith("_core") for f in libs):
        pytest.skip("no CUDA emulation build (bash tests/gpu_emu.sh builds build-emu)")
    pkg = tmp_path / "pkg" / "tfring"
    pkg.mkdir(parents=True)
    for f in libs + glob.glob(os.path.join(REPO, "tfring", "*.py")) + [
        d for d in glob.glob(os.path.join(REPO, "tfring", "*")) if os.path.isdir(d)
    ]:
        os.symlink(f, pkg / os.path.basename(f.rstrip("/")))
    env = _env(str(pkg.parent), TFRING_EMU_DEVICES="1")
    nccl = os.path.join(os.path.dirname(EMU_PKG), "nccl", "libnccl.so.2")
    if os.path.exists(nccl):
        env["TFRING_NCCL_LIB"] = nccl
    env.pop("CUDA_VISIBLE_DEVICES")
    return env


def test_gpu_bench_refuses_to_time_the_emulation(tmp_path):
    r = _run_raw(tmp_path, "gpu_bench.py", "--skip", "allreduce,batch,nccl",
                 env=_emu_env(tmp_path))
    assert r.returncode != 0 and "emulation" in r.stderr, r.stdout + r.stderr


def test_gpu_bench_dry_run_on_the_emulation(tmp_path):
    """Every code path: kernels (pack/unpack through cuda_bench_pack), each
    algorithm at 1 and 2 ranks or its reason for being skipped, the batch,
    NCCL; labelled a dry run and with the --mode given."""
    stdout, doc = _run(tmp_path, "gpu_bench.py", "--dry-run", "--mode", "mps",
                       "--procs", "1,2", env=_emu_env(tmp_path))
    assert "DRY RUN" in stdout and doc["dry_run"] and doc["emulated"]
    assert doc["mode"] == "mps"
    names = [k["kernel"] for k in doc["kernels"]]
    assert {"pack 4 x 256 B", "unpack 4 x 256 B", "pack 16 x 1 KiB"} <= set(names), names
    assert all(k["seconds"] > 0 and math.isfinite(k["pct_of_copy"]) for k in doc["kernels"])
    ring = [r for r in doc["allreduce"] if r["algo"] == "ring"]
    assert {(r["procs"], r["kind"]) for r in ring} == {
        (n, k) for n in (1, 2) for k in ("latency", "bandwidth")}
    assert all(r["ok"] and r["mode"] == "mps" for r in doc["allreduce"])
    assert all(math.isfinite(r["pct_of_bound"]) for r in ring if r["procs"] == 2)
    # Every algorithm runs on the emulation too (a probe that wrongly skipped
    # one-shot and two-shot once went unnoticed); host is the staged ring.
    measured = {r["algo"] for r in doc["allreduce"]}
    assert measured == {"ring", "oneshot", "twoshot", "auto", "host"}, doc["skipped_algos"]
    assert doc["skipped_algos"] == {}
    assert [b["procs"] for b in doc["batch"]] == [1, 2]
    assert all(b["ok"] and b["count"] == 8 for b in doc["batch"])
    # ResNet-50's gradients (8 of them, shrunk) fused, next to one tensor.
    assert [m["procs"] for m in doc["model"]] == [1, 2]
    assert all(m["ok"] and m["count"] == 8 and m["ratio"] > 0 for m in doc["model"])
    assert "nccl" in doc
