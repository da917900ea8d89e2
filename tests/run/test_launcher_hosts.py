"""tfring-run, where it places ranks: host lists, Horovod's and Open MPI's
host files, the ranks' local and cross topology, the usage errors of a bad
placement, and ssh for the ranks of remote hosts. The options, environment
and output it gives the ranks are tests/run/test_launcher.py; how it ends a
job, tests/run/test_launcher_faults.py.

Every subprocess has a deadline: a hang is a failure, not a stuck CI run.
"""

import json
import os
import socket
import stat
import sys
import textwrap

import pytest

from launch_util import ENV_DUMP, REPO, WORKER, _have_store_server, launch, script

from tfring.run.hostfile import parse_hostfile, parse_hostfile_text
from tfring.run.launcher import assign_ranks, is_local_host, parse_hosts, ssh_command


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



# --------------------------------------------------------------------- ssh --

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
