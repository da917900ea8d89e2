"""Per-node launch: where tfring-run --nnodes ... takes its values (options,
PET_* / MASTER_* variables, an MPI Operator host file) and the errors for
wrong or conflicting ones; and a real two-node job on this machine, one
tfring-run per node (tests/run/test_cluster_pernode.py runs it across hosts)."""

import json
import os
import socket
import stat
import subprocess
import sys
import time

import numpy as np
import pytest

from tfring.run import launcher, pernode

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CLEAN = ("TFRING_", "PET_", "MASTER_", "OMPI_", "PMI", "SLURM_", "TF_CONFIG", "HOROVOD_")


def _args(*argv):
    return launcher.build_parser().parse_args([*argv, "python", "x.py"])


def _resolve(argv=(), env=None):
    return pernode.resolve(_args(*argv), env or {})


PET = {"PET_NNODES": "3", "PET_NODE_RANK": "2", "PET_NPROC_PER_NODE": "4",
       "PET_MASTER_ADDR": "job-node-0-0.job", "PET_MASTER_PORT": "29400"}


def test_flags():
    c = _resolve(["--nnodes", "2", "--node-rank", "1", "--nproc-per-node", "3",
                  "--master-addr", "10.0.0.1", "--master-port", "1234"])
    assert (c.nnodes, c.node_rank, c.nproc_per_node, c.size) == (2, 1, 3, 6)
    assert (c.master_addr, c.master_port, c.master) == ("10.0.0.1", 1234, "10.0.0.1:1234")


def test_trainer_env():
    args = _args()
    assert pernode.requested(args, PET)
    c = pernode.resolve(args, PET)
    assert (c.nnodes, c.node_rank, c.nproc_per_node) == (3, 2, 4)
    assert (c.master_addr, c.master_port) == ("job-node-0-0.job", 29400)
    assert c.sources["node_rank"] == "PET_NODE_RANK=2"


def test_torchrun_master_vars_and_defaults():
    env = {"PET_NNODES": "2", "PET_NODE_RANK": "0", "MASTER_ADDR": "m", "MASTER_PORT": "7"}
    c = _resolve(env=env)
    assert (c.master_addr, c.master_port, c.nproc_per_node) == ("m", 7, 1)
    c = _resolve(["--nnodes", "2", "--node-rank", "1", "--master-addr", "m"])
    assert c.master_port == pernode.DEFAULT_PORT
    single = _resolve(["--nnodes", "1"])
    assert (single.node_rank, single.master_addr) == (0, "127.0.0.1")


def test_flags_win_over_env():
    c = _resolve(["--node-rank", "0", "--master-port", "5000"], PET)
    assert (c.node_rank, c.master_port, c.nnodes) == (0, 5000, 3)


def test_np_gives_or_checks_ranks_per_node():
    assert _resolve(["-np", "6", "--nnodes", "3", "--node-rank", "0", "--master-addr",
                     "m"]).nproc_per_node == 2
    with pytest.raises(ValueError, match=r"-np 8 does not split evenly over 3 nodes"):
        _resolve(["-np", "8", "--nnodes", "3", "--node-rank", "0", "--master-addr", "m"])
    with pytest.raises(ValueError, match=r"-np 5 conflicts with PET_NNODES=3 x "
                                         r"PET_NPROC_PER_NODE=4 = 12 ranks"):
        _resolve(["-np", "5"], PET)


@pytest.mark.parametrize("env, match", [
    ({"PET_MASTER_ADDR": "a", "MASTER_ADDR": "b"},
     r"conflicting environment: PET_MASTER_ADDR=a but MASTER_ADDR=b"),
    ({"PET_MASTER_PORT": "1", "MASTER_PORT": "2"},
     r"PET_MASTER_PORT=1 but MASTER_PORT=2"),
    ({"PET_NODE_RANK": "3"}, r"PET_NODE_RANK=3: 3 is out of range \(0\.\.2\)"),
    ({"PET_NNODES": "1:4"}, r"PET_NNODES=1:4: a MIN:MAX range"),
    ({"PET_NNODES": "two"}, r"PET_NNODES=two: expected an integer"),
    ({"PET_MASTER_PORT": "70000"}, r"PET_MASTER_PORT=70000: 70000 is out of range"),
    ({"PET_NPROC_PER_NODE": "cpu"}, r"'cpu' .* is not supported"),
    ({"PET_NODE_RANK": ""}, r"needs its index too: --node-rank"),
    ({"PET_MASTER_ADDR": ""}, r"node 0's address .* --master-addr"),
])
def test_bad_or_conflicting_values_are_named(env, match):
    with pytest.raises(ValueError, match=match):
        _resolve(env=PET | env)


def test_conflicting_env_is_refused_even_when_a_flag_decides():
    """A flag decides the value, but two variables that disagree are still
    a mistake in the pod spec worth stopping for."""
    with pytest.raises(ValueError, match="conflicting environment"):
        _resolve(["--master-addr", "c"], PET | {"MASTER_ADDR": "other"})


def test_nproc_auto_counts_visible_gpus():
    env = PET | {"PET_NPROC_PER_NODE": "auto", "CUDA_VISIBLE_DEVICES": "0,1"}
    assert _resolve(env=env).nproc_per_node == 2
    assert _resolve(env=env | {"CUDA_VISIBLE_DEVICES": ""}).nproc_per_node == 1
    with pytest.raises(ValueError, match="one rank per GPU, and this node has none"):
        _resolve(env=env | {"PET_NPROC_PER_NODE": "gpu", "CUDA_VISIBLE_DEVICES": ""})


def test_not_requested_without_options_or_pet_nnodes():
    assert not pernode.requested(_args(), {"MASTER_ADDR": "m", "MASTER_PORT": "1"})
    assert not pernode.requested(_args("-H", "a:2"), PET)
    assert pernode.requested(_args("--master-addr", "m"), {})
    with pytest.raises(ValueError, match="not with -H/--hostfile"):
        pernode.resolve(_args("--nnodes", "2", "-H", "a:2"), {})


def test_mpi_operator_hostfile(tmp_path):
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("job-worker-0.job.ns.svc slots=2\njob-worker-1.job.ns.svc slots=2\n")
    env = {pernode.HOSTFILE_VAR: str(hostfile)}
    assert pernode.mpi_hostfile(_args(), env, default="/nonexistent") == str(hostfile)
    assert pernode.mpi_hostfile(_args("-np", "2"), env, default="/nonexistent") == str(hostfile)
    assert pernode.mpi_hostfile(_args("-H", "a:1"), env) is None
    # The operator's default path counts only when -np is absent too.
    assert pernode.mpi_hostfile(_args(), {}, default=str(hostfile)) == str(hostfile)
    assert pernode.mpi_hostfile(_args("-np", "2"), {}, default=str(hostfile)) is None
    with pytest.raises(ValueError, match="no such host file"):
        pernode.mpi_hostfile(_args(), {pernode.HOSTFILE_VAR: str(tmp_path / "nope")})
    assert "conflicting environment" in pernode.conflicts_with_mpi_hostfile(PET | env)


def _env(extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith(CLEAN)}
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra)
    return env


def test_mpijob_launcher_runs_mpirun_on_the_hostfile(tmp_path):
    """In an MPIJob launcher pod, `tfring-run python train.py` runs mpirun
    with the host file's hosts and its slot count as -np."""
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("w0 slots=2\nw1 slots=3\n")
    fake = tmp_path / "mpirun"
    fake.write_text(f"#!/bin/sh\nprintf '%s\\n' \"$@\" > {tmp_path}/argv\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    out = subprocess.run(
        [sys.executable, "-m", "tfring.run", "python", "train.py"], cwd=REPO,
        env=_env({pernode.HOSTFILE_VAR: str(hostfile), "TFRING_MPIRUN": str(fake)}),
        capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    argv = (tmp_path / "argv").read_text().split("\n")
    assert argv[argv.index("-np") + 1] == "5"
    assert argv[argv.index("-H") + 1] == "w0:2,w1:3"
    assert argv[-3:-1] == ["python", "train.py"]
    assert "under mpirun on the hosts of" in out.stderr


def test_cli_errors_name_the_source():
    out = subprocess.run(
        [sys.executable, "-m", "tfring.run", "python", "x.py"], cwd=REPO,
        env=_env({"PET_NNODES": "2", "PET_NODE_RANK": "0", "PET_MASTER_ADDR": "a",
                  "MASTER_ADDR": "b"}), capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert "PET_MASTER_ADDR=a but MASTER_ADDR=b" in out.stderr
    out = subprocess.run(
        [sys.executable, "-m", "tfring.run", "--nnodes", "2", "--node-rank", "0",
         "--master-addr", "m", "--mpi", "python", "x.py"], cwd=REPO,
        env=_env({}), capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "not with --mpi" in out.stderr


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


WORKER = r"""
import json, os, sys
import numpy as np
import tfring.basics as basics
from tfring import _core
basics.init()
r, n = basics.rank(), basics.size()
x = np.random.default_rng(r).standard_normal(1001).astype(np.float32)
out = _core.allreduce(x, name="x")
json.dump({"rank": r, "size": n, "local_rank": basics.local_rank(),
           "local_size": basics.local_size(), "cross_rank": basics.cross_rank(),
           "cross_size": basics.cross_size(), "sum": out.tolist()},
          open(os.path.join(sys.argv[1], f"{r}.json"), "w"))
"""


def test_two_nodes_on_this_machine(tmp_path):
    """Two tfring-runs with the same host name: the ranks still group by
    node (node-major), and the allreduce matches numpy float64."""
    pytest.importorskip("tfring._core")
    script = tmp_path / "w.py"
    script.write_text(WORKER)
    port = _free_port()
    procs = [subprocess.Popen(
        [sys.executable, "-m", "tfring.run", "--nnodes", "2", "--node-rank", str(i),
         "--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port", str(port),
         "--start-timeout", "30", "--timeout", "60", sys.executable, str(script),
         str(tmp_path)],
        cwd=REPO, env=_env({"TFRING_SECRET": "s", "OMP_NUM_THREADS": "1"}),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for i in range(2)]
    try:
        outs = [p.communicate(timeout=90)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
    for p, out in zip(procs, outs):
        assert p.returncode == 0, out[-3000:]
    ref = sum(np.random.default_rng(r).standard_normal(1001).astype(np.float32)
              .astype(np.float64) for r in range(4))
    for r in range(4):
        rep = json.load(open(tmp_path / f"{r}.json"))
        assert (rep["rank"], rep["size"]) == (r, 4)
        assert (rep["local_rank"], rep["local_size"]) == (r % 2, 2), rep
        assert (rep["cross_rank"], rep["cross_size"]) == (r // 2, 2), rep
        assert np.max(np.abs(np.array(rep["sum"]) - ref)) < 1e-5


def test_a_node_with_another_secret_is_told_at_once(tmp_path):
    """Node 1 reaches node 0 but with another TFRING_SECRET: it stops well
    before the start timeout, saying so; node 0 then times out naming it."""
    pytest.importorskip("tfring._core")
    port = _free_port()
    procs = [subprocess.Popen(
        [sys.executable, "-m", "tfring.run", "--nnodes", "2", "--node-rank", str(i),
         "--master-addr", "127.0.0.1", "--master-port", str(port), "--start-timeout", "6",
         sys.executable, "-c", "pass"],
        cwd=REPO, env=_env({"TFRING_SECRET": f"secret-{i}"}), stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True) for i in range(2)]
    t0 = time.monotonic()
    try:
        out1 = procs[1].communicate(timeout=60)[0]
        t1 = time.monotonic() - t0
        out0 = procs[0].communicate(timeout=60)[0]
    finally:
        for p in procs:
            p.kill()
    assert procs[1].returncode == 1 and t1 < 5, (t1, out1)
    assert "wrong job secret" in out1 and "same TFRING_SECRET" in out1, out1
    assert procs[0].returncode == 124 and "node rank(s) 1 did not arrive" in out0, out0


def _meetings(nnodes, port):
    """Every node's Meeting, met, in this process (one thread per node)."""
    import threading

    from tfring.run import node_meeting

    cfgs = [pernode.NodeConfig(nnodes, r, 1, "127.0.0.1", port, {}) for r in range(nnodes)]
    out, errors = [None] * nnodes, []

    def meet(r):
        try:
            m = node_meeting.Meeting(cfgs[r], "127.0.0.1", "s", 10.0)
            m.meet()
            out[r] = m
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=meet, args=(r,)) for r in range(nnodes)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors
    return out


def test_node_zero_tells_a_silent_node_from_one_that_ended(monkeypatch):
    """Node 0 records a node whose tfring-run stopped beating as a failure
    every node sees, but not a node that recorded its end."""
    _core = pytest.importorskip("tfring._core")
    from tfring.run import node_meeting

    monkeypatch.setattr(node_meeting, "NODE_LOST_S", 0.3)
    monkeypatch.setattr(node_meeting, "BEAT_S", 0.05)
    monkeypatch.setattr(node_meeting, "POLL_S", 0.01)
    server = _core.TcpStoreServer("127.0.0.1", 0, "s")
    try:
        m0, m1, m2 = _meetings(3, server.port)
        m1.store.set("launch/end/1", b"0")  # node 1 ended; node 2 goes silent
        deadline = time.monotonic() + 10
        message = None
        while message is None and time.monotonic() < deadline:
            message = m0.poll()
            time.sleep(0.01)
        assert message is not None, "node 0 never noticed the silent node"
        assert "node 2 (" in message and "stopped answering" in message, message
        assert "node 1 (" not in message, message
        assert m0.exit_code == 1
        # Node 1, still polling, sees the same failure.
        m1.next_poll = 0.0
        assert "node 2 (" in (m1.poll() or ""), "node 1 did not see the failure"
    finally:
        server.stop()


def test_nodes_started_with_different_shapes_are_refused(monkeypatch):
    _core = pytest.importorskip("tfring._core")
    from tfring.run import node_meeting

    server = _core.TcpStoreServer("127.0.0.1", 0, "s")
    try:
        a = node_meeting.Meeting(pernode.NodeConfig(2, 0, 2, "127.0.0.1", server.port, {}),
                                 "127.0.0.1", "s", 5.0)
        b = node_meeting.Meeting(pernode.NodeConfig(2, 1, 3, "127.0.0.1", server.port, {}),
                                 "127.0.0.1", "s", 5.0)
        b.store.set("launch/node/1", json.dumps(
            {"host": "h1", "nnodes": 2, "nproc": 3}).encode())
        with pytest.raises(node_meeting.MeetingError,
                           match=r"node 1 \(h1\) was started with --nnodes 2 "
                                 r"--nproc-per-node 3, node 0 .* --nproc-per-node 2"):
            a.meet()
        # a second node 0 (node 0 above has claimed its rank)
        with pytest.raises(node_meeting.MeetingError, match="node rank 0 was taken"):
            node_meeting.Meeting(pernode.NodeConfig(2, 0, 2, "127.0.0.1", server.port, {}),
                                 "127.0.0.1", "s", 5.0).meet()
    finally:
        server.stop()
