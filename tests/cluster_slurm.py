"""A real Slurm on the namespace cluster: slurmctld on host1, slurmd on every
host, configured per test in a private /etc/slurm per host (bind-mounted by
``ip netns exec`` from /etc/netns/<ns>/slurm). Authentication is auth/none
and credentials cred/none (Slurm 22.05 ships both): the cluster is private
to one machine, so no munge daemon or key is involved."""

import os
import shutil
import subprocess
import time

import cluster

SLURM_TOOLS = ("/usr/sbin/slurmctld", "/usr/sbin/slurmd")
PLUGIN_DIRS = ("/usr/lib/x86_64-linux-gnu/slurm-wlm", "/usr/lib/aarch64-linux-gnu/slurm-wlm",
               "/usr/lib/slurm-wlm", "/usr/lib64/slurm")


def _plugin_dir():
    for d in PLUGIN_DIRS:
        if os.path.exists(os.path.join(d, "auth_none.so")):
            return d
    return None


def slurm_unavailable():
    """None when Slurm can be started here (installing it with
    cluster_setup.sh when missing), else the reason."""
    if not all(os.path.exists(t) for t in SLURM_TOOLS) or shutil.which("srun") is None:
        subprocess.run(["bash", cluster.SETUP, "slurm"], capture_output=True, timeout=900)
    if not all(os.path.exists(t) for t in SLURM_TOOLS) or shutil.which("srun") is None:
        return ("Slurm is not installed (apt-get install -y slurmd slurmctld slurm-client, "
                "the slurm-wlm packages)")
    if _plugin_dir() is None:
        return "this Slurm has no auth_none plugin (Slurm >= 23.11 removed it)"
    return None


_MOUNT_CGROUPS = (
    "mount -t tmpfs cgroup /sys/fs/cgroup && "
    "for c in cpu cpuacct cpuset memory devices freezer pids; do "
    "mkdir -p /sys/fs/cgroup/$c && mount -t cgroup -o $c cgroup /sys/fs/cgroup/$c "
    "2>/dev/null; done; ")


def _conf(c, state_dir):
    nodes = "".join(
        f"NodeName={h.name} NodeAddr={h.addr} CPUs=2 RealMemory=1000 State=UNKNOWN\n"
        for h in c.hosts)
    return (
        f"ClusterName={c.tag}\nSlurmctldHost={c.hosts[0].name}({c.hosts[0].addr})\n"
        "AuthType=auth/none\nCredType=cred/none\nSlurmUser=root\nSlurmdUser=root\n"
        f"PluginDir={_plugin_dir()}\n"
        "ProctrackType=proctrack/pgid\nTaskPlugin=task/none\nMpiDefault=none\n"
        "SelectType=select/cons_tres\nSelectTypeParameters=CR_CPU\n"
        "SchedulerType=sched/builtin\nReturnToService=2\nSwitchType=switch/none\n"
        "JobCompType=jobcomp/none\nAccountingStorageType=accounting_storage/none\n"
        "JobAcctGatherType=jobacct_gather/none\n"
        f"StateSaveLocation={state_dir}/ctld\nSlurmdSpoolDir={state_dir}/%n\n"
        f"SlurmctldPidFile={state_dir}/ctld.pid\nSlurmdPidFile={state_dir}/%n.pid\n"
        f"SlurmctldLogFile={state_dir}/ctld.log\nSlurmdLogFile={state_dir}/%n.log\n"
        "SlurmctldPort=6817\nSlurmdPort=6818\nSlurmctldTimeout=10\nSlurmdTimeout=10\n"
        "InactiveLimit=0\nMinJobAge=10\nKillWait=2\n"
        + nodes +
        "PartitionName=test Nodes=ALL Default=YES MaxTime=10 State=UP OverSubscribe=YES\n")


def start_slurm(c, timeout=30):
    """Starts slurmctld on host1 and slurmd on every host; returns when sinfo
    reports every node idle. Daemons are children of the cluster (killed and
    removed with it)."""
    state_dir = os.path.join("/etc/netns", c.tag + "slurm")
    os.makedirs(os.path.join(state_dir, "ctld"), exist_ok=True)
    c.namespaces.append(c.tag + "slurm")  # removed with the rest
    conf = _conf(c, state_dir)
    for h in c.hosts:
        os.makedirs(os.path.join(state_dir, h.name), exist_ok=True)
        d = os.path.join(h.etc, "slurm")
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "slurm.conf"), "w") as f:
            f.write(conf)
        with open(os.path.join(d, "cgroup.conf"), "w") as f:
            f.write("CgroupPlugin=cgroup/v1\nCgroupAutomount=no\n")
    c.hosts[0].popen(["/usr/sbin/slurmctld", "-D", "-i"],
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for h in c.hosts:
        # `ip netns exec` mounts a fresh /sys, without the cgroup hierarchies
        # slurmd insists on initialising: mount the v1 ones the machine has.
        h.popen(["sh", "-c", _MOUNT_CGROUPS + "exec /usr/sbin/slurmd -D"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        out = c.hosts[0].run(["sinfo", "-h", "-N", "-o", "%N %t"], timeout=10)
        last = out.stdout + out.stderr
        states = dict(line.split() for line in out.stdout.splitlines() if line.strip())
        if len(states) == len(c.hosts) and all(s == "idle" for s in states.values()):
            return
        time.sleep(0.3)
    logs = ""
    for name in ("ctld.log", f"{c.hosts[-1].name}.log"):
        p = os.path.join(state_dir, name)
        if os.path.exists(p):
            logs += f"\n{name}: " + open(p).read()[-1500:]
    raise RuntimeError(f"Slurm did not come up within {timeout} s: {last.strip()}{logs}")
