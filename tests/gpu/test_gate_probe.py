"""tools/gpu_gate_probe.cu, the stream-gate probe tools/gpu_run.sh runs on a
GPU machine: it compiles with nvcc, says when there is no GPU, and on a GPU
reports every case it promises."""

import os
import re
import shutil
import subprocess

import pytest

from gpu_util import HAVE_GPU

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SOURCE = os.path.join(ROOT, "tools", "gpu_gate_probe.cu")


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("no nvcc on PATH")
    exe = str(tmp_path_factory.mktemp("gate") / "gpu_gate_probe")
    # The flags tools/gpu_run.sh and tools/gpu_carry.sh use.
    subprocess.run([nvcc, "-O2", "-gencode", "arch=compute_90,code=sm_90",
                    "-gencode", "arch=compute_75,code=compute_75", "-o", exe, SOURCE],
                   check=True, capture_output=True, timeout=300)
    return exe


def test_probe_runs_and_reports(probe):
    r = subprocess.run([probe, "--streams", "2", "--timeout-ms", "200"],
                       capture_output=True, text=True, timeout=120)
    out = r.stdout
    if not HAVE_GPU:
        # No device (or no driver): said, with its own exit status.
        assert r.returncode == 2, out
        assert re.search(r"gate-probe: (no CUDA device|.* failed: )", out), out
        return
    assert r.returncode in (0, 1), out
    assert re.search(r"^gate-probe: release: (ok|FAILED)", out, re.M), out
    for kind in ("kernel", "copy d2d", "copy d2h"):
        assert re.search(rf"^gate-probe: {kind} on the engine's stream: (ok|HELD)", out, re.M), out
    verdict = "FAILED" if r.returncode else "ok"
    assert out.rstrip().endswith(f"gate-probe: {verdict}"), out
