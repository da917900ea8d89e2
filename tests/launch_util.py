"""What the tests of starting jobs share (tests/run/test_launcher*.py,
test_bootstrap*.py, test_elastic.py): an environment for a job's ranks that
holds no launcher's variables (the tests may themselves run under one),
``tfring-run`` with a deadline, and the values a 2-rank allreduce of
tests/workers/hvd_env.py must give."""

import importlib.util
import os
import subprocess
import sys
import textwrap

import numpy as np

from multiproc import WORKERS

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
WORKER = os.path.join(WORKERS, "hvd_env.py")  # prints its environment and _core.config()
DEADLINE_S = 120  # a launch's deadline
LAUNCHER_VARS = ("TFRING_", "HOROVOD_", "TF_CONFIG", "OMPI_", "PMI_", "PMIX_", "SLURM_", "MV2_",
                 "PRTE_", "MPI4PY_", "HYDRA_", "MPIEXEC_", "I_MPI_")

# A rank script that writes its TFRING_*, PYTHONUNBUFFERED and MY_*
# variables to DIR/rank<RANK>.json (DIR: its first argument).
ENV_DUMP = """
    import json, os, sys
    out = os.path.join(sys.argv[1], "rank%s.json" % os.environ["TFRING_RANK"])
    keep = {k: v for k, v in os.environ.items()
            if k.startswith(("TFRING_", "PYTHONUNBUFFERED", "MY_"))}
    with open(out, "w") as f:
        json.dump(keep, f)
"""


def expected_allreduce(size):
    return (np.arange(16, dtype=np.float64) * sum(r + 1 for r in range(size))).tolist()


def _have_store_server():
    try:
        from tfring import _core
    except ImportError:
        return False
    return hasattr(_core, "TcpStoreServer")


# ------------------------------------------------------------- tfring-run --

def _clean_env(extra=None):
    """This environment less any launcher's variables, with a deadline on
    every collective."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(LAUNCHER_VARS)}
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    env.update({"TFRING_TIMEOUT": "60", "OMP_NUM_THREADS": "1"})
    env.update(extra or {})
    return env


def launch(args, env=None, timeout=DEADLINE_S):
    """Runs ``python -m tfring.run ARGS`` to completion (or fails the test)."""
    return subprocess.run([sys.executable, "-m", "tfring.run", *args], cwd=REPO,
                          env=_clean_env(env), stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=timeout)


def script(tmp_path, body, name="rank.py"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return str(path)


# ------------------------------------------------- any launcher's ranks --

def _env(**extra):
    """This environment less any launcher's variables, plus quiet TF, one
    CPU device and a deadline on every collective."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(LAUNCHER_VARS)}
    # The ranks import the same tfring as this process, wherever they run.
    spec = importlib.util.find_spec("tfring")
    root = os.path.dirname(os.path.dirname(spec.origin))
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (root, env.get("PYTHONPATH")) if p)
    env.update({"TF_CPP_MIN_LOG_LEVEL": "3", "TF_NUM_INTRAOP_THREADS": "1",
                "TF_NUM_INTEROP_THREADS": "2", "CUDA_VISIBLE_DEVICES": "",
                "TFRING_TIMEOUT": "60", "PYTHONUNBUFFERED": "1"})
    env.update({k: str(v) for k, v in extra.items()})
    return env
