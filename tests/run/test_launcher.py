"""tfring-run, the program: where it places ranks (host lists, Horovod and
Open MPI host files, ssh for remote hosts), the environment and tunables it
gives them (horovodrun's options, config files, HOROVOD_* variables, -x),
the rendezvous store it hosts, how it relays their output, and how it ends
a job (a failing or killed rank, a timeout, a rank late to init, forwarded
signals). How the ranks then join their job under tfring-run and every
other launcher is tests/run/test_bootstrap.py.

The ranks are plain Python scripts, or tests/workers/hvd_env.py where the
core must have read the options (it prints each rank's environment and
``_core.config()``). Every subprocess has a deadline: a hang is a failure,
not a stuck CI run.
"""

import json
import os
import re
import signal
import socket
import stat
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from multiproc import WORKERS

from tfring import _horovod_env
from tfring.run import horovodrun, launcher
from tfring.run.hostfile import parse_hostfile, parse_hostfile_text
from tfring.run.launcher import (assign_ranks, build_parser, is_local_host, parse_hosts,
                                 ssh_command)

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
WORKER = os.path.join(WORKERS, "hvd_env.py")
DEADLINE_S = 120  # a launch's deadline
WAIT_S = 30  # for what a test waits on while a job runs
LAUNCHER_VARS = ("TFRING_", "HOROVOD_", "OMPI_", "PMI_", "PMIX_", "SLURM_", "MV2_", "TF_CONFIG")


def _have_store_server():
    try:
        from tfring import _core
    except ImportError:
        return False
    return hasattr(_core, "TcpStoreServer")


def _clean_env(extra=None):
    """This environment less any launcher's variables (the test may run
    under one), with a deadline on every collective."""
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


def script(tmp_path, body, name="rank.py"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return str(path)


def wait_for(predicate, timeout=WAIT_S, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    pytest.fail(f"timed out waiting for {what}")


def pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); it is dead for our purpose.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


# --------------------------------------------------------------- placement --

def test_parse_hosts():
    assert parse_hosts("a:4,b:2") == [("a", 4), ("b", 2)]
    assert parse_hosts("a, b:3") == [("a", 1), ("b", 3)]
    assert parse_hosts("[::1]:2") == [("::1", 2)]
    for bad in ("a:x", "a:0", ":2", ""):
        with pytest.raises(ValueError):
            parse_hosts(bad)


def test_assign_ranks_fills_hosts_in_order():
    specs = assign_ranks(5, [("a", 2), ("b", 4)])
    got = [
        (s.rank, s.host, s.local_rank, s.local_size, s.cross_rank, s.cross_size)
        for s in specs
    ]
    # cross_* as in Horovod: hosts having a rank with this local_rank.
    assert got == [
        (0, "a", 0, 2, 0, 2),
        (1, "a", 1, 2, 0, 2),
        (2, "b", 0, 3, 1, 2),
        (3, "b", 1, 3, 1, 2),
        (4, "b", 2, 3, 0, 1),
    ]
    assert all(s.size == 5 for s in specs)
    with pytest.raises(ValueError, match="exceeds"):
        assign_ranks(7, [("a", 2), ("b", 4)])


def test_assign_ranks_merges_repeated_host():
    specs = assign_ranks(3, [("a", 1), ("a", 2)])
    assert [(s.host, s.local_rank, s.local_size) for s in specs] == [
        ("a", 0, 3),
        ("a", 1, 3),
        ("a", 2, 3),
    ]


def test_local_host_names():
    assert is_local_host("localhost")
    assert is_local_host("127.0.0.1")
    assert is_local_host(socket.gethostname())
    assert not is_local_host("node-that-is-not-here")


def test_ssh_command_quotes_everything():
    argv = ssh_command(
        "node1",
        "/data/my run",
        {"TFRING_RANK": "3", "X": "a b"},
        ["python", "train.py", "--tag=$HOME"],
        ssh_port=2222,
    )
    assert argv[:5] == ["ssh", "-o", "BatchMode=yes", "-p", "2222"]
    assert argv[5] == "node1"
    assert argv[6] == (
        "cd '/data/my run' && exec env TFRING_RANK=3 'X=a b' "
        "python train.py '--tag=$HOME'"
    )
    assert len(argv) == 7


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


def test_usage_errors():
    assert launch(["-np", "2"]).returncode == 2
    r = launch(["-np", "5", "-H", "localhost:2", "true"])
    assert r.returncode == 2 and "exceeds" in r.stderr


def test_elastic_and_conflicting_options_fail_clearly(tmp_path):
    out = launch(["-np", "2", "--reset-limit", "1", "true"], timeout=60)
    assert out.returncode == 2 and "only in elastic mode" in out.stderr, out.stderr
    out = launch(["-np", "2", "-H", "localhost:2", "--hostfile", "x", "true"], timeout=60)
    assert out.returncode == 2 and "mutually exclusive" in out.stderr, out.stderr


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

ENV_DUMP = """
    import json, os, sys
    out = os.path.join(sys.argv[1], "rank%s.json" % os.environ["TFRING_RANK"])
    keep = {k: v for k, v in os.environ.items()
            if k.startswith(("TFRING_", "PYTHONUNBUFFERED", "MY_"))}
    with open(out, "w") as f:
        json.dump(keep, f)
"""


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


def test_remote_ranks_start_through_ssh(tmp_path):
    # A stand-in `ssh` records its argv and runs the remote command locally,
    # so the whole remote path runs without a second host.
    bindir = tmp_path / "bin"
    bindir.mkdir()
    fake_ssh = bindir / "ssh"
    fake_ssh.write_text(
        textwrap.dedent(f"""\
        #!{sys.executable}
        import json, subprocess, sys
        with open({str(tmp_path / "ssh_argv.json")!r}, "w") as f:
            json.dump(sys.argv[1:], f)
        sys.exit(subprocess.call(["/bin/sh", "-c", sys.argv[-1]]))
    """)
    )
    fake_ssh.chmod(fake_ssh.stat().st_mode | stat.S_IEXEC)
    dump = script(tmp_path, ENV_DUMP)
    r = launch(
        [
            "-np",
            "3",
            "-H",
            "localhost:2,remote-node:1",
            "--store-host",
            "127.0.0.1",
            "--env",
            "MY_FLAG=remote",
            sys.executable,
            dump,
            str(tmp_path),
        ],
        env={
            "PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}",
            "TFRING_FUSION_THRESHOLD": "1M",
        },
    )
    assert r.returncode == 0, r.stderr
    argv = json.loads((tmp_path / "ssh_argv.json").read_text())
    assert argv[:3] == ["-o", "BatchMode=yes", "remote-node"]
    assert argv[3].startswith(f"cd {REPO} && IFS= read -r TFRING_SECRET && ")
    assert "TFRING_SECRET=" not in " ".join(argv)  # the secret travels on stdin
    remote = json.loads((tmp_path / "rank2.json").read_text())
    assert remote["TFRING_RANK"] == "2"
    assert remote["TFRING_HOSTNAME"] == "remote-node"
    assert remote["TFRING_LOCAL_RANK"] == "0" and remote["TFRING_LOCAL_SIZE"] == "1"
    assert remote["TFRING_CROSS_RANK"] == "1" and remote["TFRING_CROSS_SIZE"] == "2"
    assert remote["TFRING_FUSION_THRESHOLD"] == "1M"  # tunables travel along
    assert remote["MY_FLAG"] == "remote"
    for i in range(2):  # the host list's names, not this machine's
        local = json.loads((tmp_path / f"rank{i}.json").read_text())
        assert local["TFRING_HOSTNAME"] == "localhost"
        assert local["TFRING_LOCAL_RANK"] == str(i) and local["TFRING_LOCAL_SIZE"] == "2"
        assert local["TFRING_SECRET"] == remote["TFRING_SECRET"]
    if _have_store_server():
        assert remote["TFRING_STORE_ADDR"].startswith("127.0.0.1:")


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
            m = re.fullmatch(rf"\[(\d)\]<{stream}>: (.*)", line)
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
    assert "[1]<stdout>: out 1" in r.stdout


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


# ---------------------------------------------------------------- failures --

# Rank FAIL_RANK fails (how: argv[2]) once every rank has written its pid;
# the others would sleep far past the test's deadline.
FAILING = """
    import os, signal, sys, time
    d, how = sys.argv[1], sys.argv[2]
    rank, size = int(os.environ["TFRING_RANK"]), int(os.environ["TFRING_SIZE"])
    if how == "ignore-term" and rank != 1:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    with open(os.path.join(d, "pid%d" % rank), "w") as f:
        f.write(str(os.getpid()))
    if rank == 1:
        while len([n for n in os.listdir(d) if n.startswith("pid")]) < size:
            time.sleep(0.01)
        if how == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        sys.exit(3)
    time.sleep(120)
"""


def _pids(tmp_path, n):
    return [int((tmp_path / f"pid{i}").read_text()) for i in range(n)]


def test_failing_rank_stops_the_job(tmp_path):
    fail = script(tmp_path, FAILING)
    t0 = time.monotonic()
    r = launch(["-np", "3", sys.executable, fail, str(tmp_path), "exit"])
    assert time.monotonic() - t0 < 15
    assert r.returncode == 3
    pids = _pids(tmp_path, 3)
    assert (
        f"tfring-run: rank 1 (pid {pids[1]}) exited with code 3; "
        "terminating the other ranks"
    ) in r.stderr
    assert not any(pid_alive(p) for p in pids)


def test_rank_killed_by_signal_is_named(tmp_path):
    fail = script(tmp_path, FAILING)
    r = launch(["-np", "2", sys.executable, fail, str(tmp_path), "kill"])
    assert r.returncode == 128 + signal.SIGKILL
    pid = _pids(tmp_path, 2)[1]
    assert f"rank 1 (pid {pid}) was killed by signal SIGKILL" in r.stderr


def test_ranks_ignoring_sigterm_get_sigkill(tmp_path):
    fail = script(tmp_path, FAILING)
    t0 = time.monotonic()
    r = launch(
        [
            "-np",
            "3",
            "--grace-period",
            "0.5",
            sys.executable,
            fail,
            str(tmp_path),
            "ignore-term",
        ]
    )
    assert time.monotonic() - t0 < 15
    assert r.returncode == 3
    assert "sending SIGKILL" in r.stderr
    assert not any(pid_alive(p) for p in _pids(tmp_path, 3))


def test_timeout_stops_the_job(tmp_path):
    sleeper = script(tmp_path, "import time\ntime.sleep(120)\n")
    t0 = time.monotonic()
    r = launch(["-np", "2", "--timeout", "1", sys.executable, sleeper])
    assert time.monotonic() - t0 < 15
    assert r.returncode == 124
    assert "timeout" in r.stderr and "--timeout" in r.stderr


def test_start_timeout_names_the_late_rank():
    out = launch(["-np", "2", "--start-timeout", "3", "--grace-period", "1",
                  sys.executable, WORKER, "late", "300"], timeout=90)
    assert out.returncode == 124, out.stdout[-2000:] + out.stderr[-3000:]
    assert "rank(s) 1 did not reach tfring.init() within 3 s" in out.stderr, out.stderr


def test_success_exits_zero_and_missing_command_fails(tmp_path):
    ok = script(tmp_path, "print('ok')\n")
    r = launch(["-np", "2", sys.executable, ok])
    assert r.returncode == 0
    assert sorted(r.stdout.splitlines()) == ["[0]<stdout>: ok", "[1]<stdout>: ok"]
    r = launch(["-np", "2", str(tmp_path / "no-such-program")])
    assert r.returncode == 127
    assert "cannot start rank 0" in r.stderr


# ----------------------------------------------------------------- signals --

@pytest.mark.parametrize(
    "signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"]
)
def test_signals_are_forwarded_to_every_rank(tmp_path, signum):
    catcher = script(
        tmp_path,
        """
        import os, signal, sys, time
        d = sys.argv[1]
        rank = os.environ["TFRING_RANK"]
        def on_signal(signum, frame):
            with open(os.path.join(d, "got%s" % rank), "w") as f:
                f.write(signal.Signals(signum).name)
            sys.exit(0)
        signal.signal(signal.SIGINT, on_signal)
        signal.signal(signal.SIGTERM, on_signal)
        open(os.path.join(d, "ready%s" % rank), "w").close()
        time.sleep(120)
    """,
    )
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tfring.run",
            "-np",
            "3",
            sys.executable,
            catcher,
            str(tmp_path),
        ],
        cwd=REPO,
        env=_clean_env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(
            lambda: all((tmp_path / f"ready{i}").exists() for i in range(3)),
            what="ranks to start",
        )
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=DEADLINE_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    name = signal.Signals(signum).name
    assert proc.returncode == 128 + signum
    assert f"received {name}; forwarding it to all ranks" in err
    for i in range(3):
        assert (tmp_path / f"got{i}").read_text() == name
