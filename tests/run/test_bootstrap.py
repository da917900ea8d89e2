"""How a rank joins its job: what init() reads from tfring-run's, Open MPI's,
MPICH's, Slurm's and horovodrun's environments and from TF_CONFIG
(tfring/_bootstrap.py, tfring/_tf_config.py), and HOROVOD_* variables read
as TFRING_* tunables. Each launcher running real jobs (mpirun, MPICH's
mpiexec, tfring-run --mpi, one training script under every launcher) is
tests/run/test_bootstrap_launchers.py; what tfring-run itself does
(placement, options, output, failures, signals) is
tests/run/test_launcher*.py.

Every subprocess has a deadline, and each collective TFRING_TIMEOUT.
"""

import json
import socket
import subprocess
import sys

import numpy as np
import pytest

from launch_util import DEADLINE_S, LAUNCHER_VARS, REPO, WORKER, _env, expected_allreduce
from multiproc import run_ranks

from tfring import _bootstrap, _core, _horovod_env
from tfring import _tf_config as tf_config_parser


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
