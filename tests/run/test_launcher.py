"""tfring-run, the program: the environment and tunables it gives the ranks
(horovodrun's options, config files, HOROVOD_* variables, -x), the
rendezvous store it hosts, and how it relays their output. Where it places
ranks (host files, ssh) is tests/run/test_launcher_hosts.py; how it ends a
job (a failing or killed rank, a timeout, a rank late to init, forwarded
signals), tests/run/test_launcher_faults.py. How the ranks then join their
job under tfring-run and every other launcher is tests/run/test_bootstrap.py.

The ranks are plain Python scripts, or tests/workers/hvd_env.py where the
core must have read the options (it prints each rank's environment and
``_core.config()``). Every subprocess has a deadline: a hang is a failure,
not a stuck CI run.
"""

import json
import os
import re
import socket
import sys

import pytest

from launch_util import (ENV_DUMP, WORKER, _have_store_server, expected_allreduce, launch,
                         script)

from tfring import _horovod_env
from tfring.run import horovodrun, launcher
from tfring.run.launcher import build_parser


def rank_results(out):
    """{rank: RESULT json} from tfring-run's relayed stdout."""
    got = {}
    for line in out.stdout.splitlines():
        m = re.match(r"(?:.*?)\[(\d+)\]<stdout>:RESULT (.*)$", line)
        if m:
            got[int(m.group(1))] = json.loads(m.group(2))
    return got


# ----------------------------------------------------------------- options --

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


def test_options_reach_every_rank(tmp_path):
    """One launch from a host file in Horovod's format with every tunable
    option: each rank's environment holds the TFRING_* values and
    horovodrun's per-rank variables, and the core read them at init."""
    path = tmp_path / "hosts"
    path.write_text("# Horovod's format\nlocalhost slots=2\n")
    argv = ["-np", "2", "--hostfile", str(path), "--fusion-threshold-mb", "16",
            "--cycle-time-ms", "4.5", "--log-level", "ERROR", "--cache-capacity", "0",
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
        assert (res["rank"], res["size"], res["local_size"]) == (r, 2, 2)
        # horovodrun's per-rank variables, for scripts that read them
        assert env["HOROVOD_RANK"] == str(r) and env["HOROVOD_SIZE"] == "2"
        assert env["HOROVOD_LOCAL_RANK"] == str(r)
        assert env["HOROVOD_HOSTNAME"] == "localhost"
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


def test_launcher_module_exports_main():
    import tfring.run

    assert tfring.run.main is launcher.main


# ---------------------------------------------- rank environment and store --

def test_rank_environment(tmp_path):
    dump = script(tmp_path, ENV_DUMP)
    r = launch(
        [
            "-np",
            "3",
            "--env",
            "MY_FLAG=on",
            "-x",
            "MY_COPIED",
            sys.executable,
            dump,
            str(tmp_path),
        ],
        env={"MY_COPIED": "yes"},
    )
    assert r.returncode == 0, r.stderr
    envs = [json.loads((tmp_path / f"rank{i}.json").read_text()) for i in range(3)]
    secrets_seen = set()
    for i, e in enumerate(envs):
        assert e["TFRING_RANK"] == str(i)
        assert e["TFRING_SIZE"] == "3"
        assert e["TFRING_LOCAL_RANK"] == str(i)
        assert e["TFRING_LOCAL_SIZE"] == "3"
        assert e["TFRING_CROSS_RANK"] == "0"
        assert e["TFRING_CROSS_SIZE"] == "1"
        assert e["TFRING_HOSTNAME"] == socket.gethostname()
        assert re.fullmatch(r"[0-9a-f]{32}", e["TFRING_SECRET"])
        assert e["PYTHONUNBUFFERED"] == "1"
        assert e["MY_FLAG"] == "on"
        assert e["MY_COPIED"] == "yes"
        secrets_seen.add(e["TFRING_SECRET"])
    assert len(secrets_seen) == 1
    if _have_store_server():
        addrs = {e["TFRING_STORE_ADDR"] for e in envs}
        assert len(addrs) == 1
        assert re.fullmatch(r"127\.0\.0\.1:\d+", addrs.pop())
    else:
        assert all("TFRING_STORE_ADDR" not in e for e in envs)
        assert "cannot host the rendezvous store" in r.stderr


def test_each_job_gets_a_new_secret(tmp_path):
    dump = script(tmp_path, ENV_DUMP)
    seen = set()
    for _ in range(2):
        assert launch(["-np", "1", sys.executable, dump, str(tmp_path)]).returncode == 0
        seen.add(json.loads((tmp_path / "rank0.json").read_text())["TFRING_SECRET"])
    assert len(seen) == 2


@pytest.mark.skipif(
    not _have_store_server(), reason="tfring._core has no TcpStoreServer yet"
)
def test_ranks_rendezvous_through_the_launchers_store(tmp_path):
    # Every rank publishes a key in the store tfring-run hosts and reads all
    # the others', authenticated by the job's secret.
    exchange = script(
        tmp_path,
        """
        import os
        from tfring import _core
        host, port = os.environ["TFRING_STORE_ADDR"].rsplit(":", 1)
        store = _core.TcpStore(host, int(port), os.environ["TFRING_SECRET"], 10.0)
        rank, size = int(os.environ["TFRING_RANK"]), int(os.environ["TFRING_SIZE"])
        store.set("hello/%d" % rank, b"from %d" % rank)
        got = [bytes(store.get("hello/%d" % r, 10.0)).decode() for r in range(size)]
        print(",".join(got))
    """,
    )
    r = launch(["-np", "3", "--timeout", "20", sys.executable, exchange])
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("from 0,from 1,from 2") == 3



# ------------------------------------------------------------------ output --

def test_output_is_prefixed_and_never_interleaved(tmp_path):
    # Each rank writes long lines in small unflushed-by-line pieces to both
    # streams at once; the launcher must relay only whole lines.
    writer = script(
        tmp_path,
        """
        import os, sys
        r = os.environ["TFRING_RANK"]
        for i in range(50):
            for stream in (sys.stdout, sys.stderr):
                line = ("%s:%d:" % (r, i)) + r * 3000
                for j in range(0, len(line), 7):
                    stream.write(line[j:j + 7])
                stream.write("\\n")
        sys.stdout.write("no newline at the end " + r)
    """,
    )
    r = launch(["-np", "3", sys.executable, writer])
    assert r.returncode == 0, r.stderr
    for stream, text in (("stdout", r.stdout), ("stderr", r.stderr)):
        per_rank = {0: [], 1: [], 2: []}
        for line in text.splitlines():
            if line.startswith("tfring-run:"):
                continue
            m = re.fullmatch(rf"\[(\d)\]<{stream}>:(.*)", line)
            assert m, f"unprefixed or mixed line on {stream}: {line[:80]!r}"
            per_rank[int(m.group(1))].append(m.group(2))
        for rank, lines in per_rank.items():
            want = [f"{rank}:{i}:{str(rank) * 3000}" for i in range(50)]
            if stream == "stdout":
                want.append(f"no newline at the end {rank}")
            assert lines == want, f"rank {rank} {stream} lines differ"


def test_output_dir_keeps_unprefixed_copies(tmp_path):
    hello = script(
        tmp_path,
        """
        import os, sys
        print("out", os.environ["TFRING_RANK"])
        print("err", os.environ["TFRING_RANK"], file=sys.stderr)
    """,
    )
    out_dir = tmp_path / "logs"
    r = launch(["-np", "2", "--output-dir", str(out_dir), sys.executable, hello])
    assert r.returncode == 0, r.stderr
    for i in range(2):
        assert (out_dir / f"rank.{i}" / "stdout").read_text() == f"out {i}\n"
        assert (out_dir / f"rank.{i}" / "stderr").read_text() == f"err {i}\n"
    assert "[1]<stdout>:out 1" in r.stdout


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
    lines = [ln for ln in out.stdout.splitlines() if ln.endswith("<stdout>:line")]
    assert len(lines) == 2, out.stdout
    for ln in lines:
        assert re.match(r"\w{3} \w{3} [ \d]\d \d\d:\d\d:\d\d \d{4}\[[01]\]<stdout>:line$", ln), ln
