"""A small cluster on one machine: each host is a network namespace.

Layout (N hosts):

    ns <p>sw : bridge br0 (the switch)
    ns <p>h1 : eth0 10.231.0.1/24  --veth--  sw:p1 (port of br0)
    ns <p>h2 : eth0 10.231.0.2/24  --veth--  sw:p2
    ...

The switch lives in a namespace of its own, so the machine's root namespace
is never touched: deleting the namespaces deletes every link with them.
Processes of a host run under ``ip netns exec <ns> unshare --uts``, so each
host has its own hostname (``host1``, ``host2``...), and ``ip netns exec``
bind-mounts ``/etc/netns/<ns>/*`` over ``/etc``: each host gets a private
``/etc/hosts`` naming every host and a private ``/etc/ssh`` (keys, sshd and
ssh client configuration) without changing the machine's own files.

Every name starts with ``tfc<pid>`` (pid of the creating process), so a run
that crashed leaves names that the next run recognises (its pid is dead)
and removes (``cleanup_leftovers``).

Links can be shaped with ``tc`` (netem delay + tbf rate) on request.
"""

import os
import re
import shutil
import signal
import subprocess
import sys
import time

PREFIX = "tfc"
SUBNET = "10.231.0"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SETUP = os.path.join(ROOT, "tests", "cluster_setup.sh")


def _run(*argv, check=True, timeout=30):
    out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if check and out.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({out.returncode}): "
                           f"{(out.stderr or out.stdout).strip()}")
    return out


def netem_available():
    """True when tc's netem (delay) qdisc exists in this kernel."""
    ns = f"{PREFIX}{os.getpid()}netem"
    _run("ip", "netns", "add", ns)
    try:
        return _run("tc", "-n", ns, "qdisc", "add", "dev", "lo", "root", "netem",
                    "delay", "1ms", check=False).returncode == 0
    finally:
        _run("ip", "netns", "del", ns, check=False)


def why_unavailable():
    """None when namespaces can be made here, else the reason."""
    if os.geteuid() != 0:
        return "the cluster tests need root (network namespaces, veth, tc)"
    for tool in ("ip", "tc", "unshare"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed (apt-get install -y iproute2 util-linux)"
    probe = f"{PREFIX}{os.getpid()}probe"
    try:
        _run("ip", "netns", "add", probe)
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as e:
        return f"cannot create a network namespace here: {e}"
    _run("ip", "netns", "del", probe, check=False)
    return None


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _pids_in_netns(ns):
    out = _run("ip", "netns", "pids", ns, check=False)
    return [int(p) for p in out.stdout.split() if p.isdigit()]


def _kill_netns_processes(ns):
    for _ in range(50):
        pids = _pids_in_netns(ns)
        if not pids:
            return
        for p in pids:
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.05)


def _delete_netns(ns):
    _kill_netns_processes(ns)
    _run("ip", "netns", "del", ns, check=False)
    shutil.rmtree(f"/etc/netns/{ns}", ignore_errors=True)


def cleanup_leftovers():
    """Removes the namespaces of earlier runs whose creating process is dead."""
    out = _run("ip", "netns", "list", check=False)
    names = [line.split()[0] for line in out.stdout.splitlines() if line.strip()]
    if os.path.isdir("/etc/netns"):
        names += os.listdir("/etc/netns")
    for ns in set(names):
        m = re.match(rf"{PREFIX}(\d+)", ns)
        if m and int(m.group(1)) != os.getpid() and not _alive(int(m.group(1))):
            _delete_netns(ns)


class Host:
    def __init__(self, cluster, index):
        self.cluster = cluster
        self.index = index
        self.name = f"host{index}"
        self.ns = f"{cluster.tag}h{index}"
        self.addr = f"{SUBNET}.{index}"
        self.etc = f"/etc/netns/{self.ns}"

    def argv(self, args):
        """argv that runs ``args`` on this host (its netns and hostname)."""
        return ["ip", "netns", "exec", self.ns, "unshare", "--uts", "--",
                "sh", "-c", 'hostname "$0" && exec "$@"', self.name, *args]

    def popen(self, args, **kw):
        kw.setdefault("start_new_session", True)
        p = subprocess.Popen(self.argv(args), **kw)
        self.cluster.procs.append(p)
        return p

    def run(self, args, timeout=60, **kw):
        p = self.popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.cluster.kill(p)
            out, err = p.communicate()
            raise AssertionError(f"{args} on {self.name} ran past {timeout} s: {err[-2000:]}")
        return subprocess.CompletedProcess(args, p.returncode, out, err)

    def link_down(self):
        """Cuts this host's link at the switch, as a partition would."""
        _run("ip", "-n", self.cluster.switch, "link", "set", f"p{self.index}", "down")

    def link_up(self):
        _run("ip", "-n", self.cluster.switch, "link", "set", f"p{self.index}", "up")


class Cluster:
    """``Cluster(2)``: two hosts; ``close()`` (or ``with``) removes everything."""

    def __init__(self, nhosts=2, delay_ms=None, rate_mbit=None):
        self.tag = f"{PREFIX}{os.getpid()}{_next_id()}"
        self.switch = f"{self.tag}sw"
        self.hosts = [Host(self, i + 1) for i in range(nhosts)]
        self.procs = []
        self.namespaces = []
        try:
            self._build(delay_ms, rate_mbit)
        except BaseException:
            self.close()
            raise

    def _ns(self, name):
        _run("ip", "netns", "add", name)
        self.namespaces.append(name)
        _run("ip", "-n", name, "link", "set", "lo", "up")

    def _build(self, delay_ms, rate_mbit):
        self._ns(self.switch)
        sw = ("ip", "-n", self.switch)
        _run(*sw, "link", "add", "br0", "type", "bridge")
        _run(*sw, "link", "set", "br0", "up")
        hosts_file = "127.0.0.1 localhost\n" + "".join(
            f"{h.addr} {h.name}\n" for h in self.hosts)
        for h in self.hosts:
            self._ns(h.ns)
            # Both ends are created in the switch namespace, then one moves.
            _run(*sw, "link", "add", f"p{h.index}", "type", "veth", "peer", "name", "eth0")
            _run(*sw, "link", "set", "eth0", "netns", h.ns)
            _run(*sw, "link", "set", f"p{h.index}", "master", "br0")
            _run(*sw, "link", "set", f"p{h.index}", "up")
            _run("ip", "-n", h.ns, "addr", "add", f"{h.addr}/24", "dev", "eth0")
            _run("ip", "-n", h.ns, "link", "set", "eth0", "up")
            os.makedirs(h.etc, exist_ok=True)
            with open(os.path.join(h.etc, "hosts"), "w") as f:
                f.write(hosts_file)
            if delay_ms or rate_mbit:
                self.shape(h, delay_ms, rate_mbit)

    def shape(self, host, delay_ms=None, rate_mbit=None):
        """netem delay (when the kernel has sch_netem), then a tbf rate limit,
        on the host's egress. Raises RuntimeError naming what is missing."""
        dev = ("tc", "-n", host.ns, "qdisc", "replace", "dev", "eth0")
        parent = ("root",)
        if delay_ms:
            out = _run(*dev, "root", "handle", "1:", "netem", "delay", f"{delay_ms}ms",
                       check=False)
            if out.returncode != 0:
                raise RuntimeError(f"tc netem is not available here ({out.stderr.strip()}): "
                                   "the kernel has no sch_netem")
            parent = ("parent", "1:")
        if rate_mbit:
            _run(*dev, *parent, "handle", "10:", "tbf", "rate", f"{rate_mbit}mbit",
                 "burst", "256kb", "latency", "50ms")

    def kill(self, proc):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def close(self):
        for p in self.procs:
            if p.poll() is None:
                self.kill(p)
        for p in self.procs:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        for ns in reversed(self.namespaces):
            _delete_netns(ns)
        for h in self.hosts:
            shutil.rmtree(h.etc, ignore_errors=True)
        self.namespaces = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


_counter = [0]


def _next_id():
    _counter[0] += 1
    return chr(ord("a") + (_counter[0] - 1) % 26)


# ------------------------------------------------------------------ sshd ----

SSHD = "/usr/sbin/sshd"


def ssh_unavailable():
    """None when sshd/ssh exist (installing them with cluster_setup.sh when
    missing), else the reason."""
    if not (os.path.exists(SSHD) and shutil.which("ssh") and shutil.which("ssh-keygen")):
        out = subprocess.run(["bash", SETUP], capture_output=True, text=True, timeout=600)
        if out.returncode != 0:
            return f"openssh-server is missing and cannot be installed: {out.stderr[-500:]}"
    if not os.path.exists(SSHD):
        return "openssh-server is not installed"
    return None


def start_sshd(cluster):
    """sshd on port 22 of every host, with generated host and user keys and a
    private /etc/ssh per host (the machine's own ssh configuration is not
    read or changed). ``ssh hostN`` works from any host, as root, with no
    prompt. Returns when every sshd accepts connections."""
    keys = os.path.join("/etc/netns", cluster.tag + "keys")
    os.makedirs(keys, exist_ok=True)
    cluster.namespaces.append(cluster.tag + "keys")  # removed with the rest
    _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", f"{keys}/host_key")
    _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", f"{keys}/user_key")
    pub = open(f"{keys}/host_key.pub").read().split()
    known = "".join(f"{h.name},{h.addr} {pub[0]} {pub[1]}\n" for h in cluster.hosts)
    os.makedirs("/run/sshd", exist_ok=True)
    for h in cluster.hosts:
        d = os.path.join(h.etc, "ssh")
        os.makedirs(d, exist_ok=True)
        for name in ("host_key", "user_key"):
            shutil.copy(f"{keys}/{name}", f"{d}/{name}")
            os.chmod(f"{d}/{name}", 0o600)
        shutil.copy(f"{keys}/user_key.pub", f"{d}/authorized_keys")
        with open(f"{d}/known_hosts", "w") as f:
            f.write(known)
        with open(f"{d}/sshd_config", "w") as f:
            f.write(
                "Port 22\nListenAddress 0.0.0.0\nHostKey /etc/ssh/host_key\n"
                "PidFile none\nUsePAM no\nPermitRootLogin prohibit-password\n"
                "PubkeyAuthentication yes\nPasswordAuthentication no\n"
                "KbdInteractiveAuthentication no\nStrictModes no\n"
                "AuthorizedKeysFile /etc/ssh/authorized_keys\n"
                "MaxStartups 100:30:200\nMaxSessions 100\nLogLevel ERROR\n")
        with open(f"{d}/ssh_config", "w") as f:
            f.write(
                "Host *\n  IdentityFile /etc/ssh/user_key\n"
                "  UserKnownHostsFile /etc/ssh/known_hosts\n"
                "  GlobalKnownHostsFile /etc/ssh/known_hosts\n"
                "  StrictHostKeyChecking yes\n  BatchMode yes\n  LogLevel ERROR\n"
                "  ConnectTimeout 10\n  ServerAliveInterval 2\n  ServerAliveCountMax 3\n")
        h.popen([SSHD, "-D", "-e", "-f", "/etc/ssh/sshd_config"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 20
    for h in cluster.hosts:
        while True:
            out = cluster.hosts[0].run(["ssh", h.name, "true"], timeout=20)
            if out.returncode == 0:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"sshd on {h.name} does not answer: {out.stderr[-500:]}")
            time.sleep(0.2)


def python_env():
    """Variables a rank needs to find the tree and the venv (same filesystem)."""
    return {"PYTHONPATH": ROOT, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}


PYTHON = sys.executable

# Variables of a launcher this test process may itself run under, which a
# job started on the namespace hosts must not inherit.
LAUNCHER_PREFIXES = ("TFRING_", "OMPI_", "PMI", "SLURM_", "PET_", "MASTER_", "TF_CONFIG",
                     "HOROVOD_")


def launch_env(**values):
    """This environment less any launcher's variables, plus python_env()
    and ``values`` (as strings): what a job started on the hosts gets."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(LAUNCHER_PREFIXES)}
    env.update(python_env(), **{k: str(v) for k, v in values.items()})
    return env


# ------------------------------------------------------------- env jobs ----

STORE_PORT = 29400
WORKER = os.path.join(ROOT, "tests", "cluster_worker.py")

_STORE_SRC = (
    "import sys, time\nfrom tfring import _core\n"
    "s = _core.TcpStoreServer('0.0.0.0', int(sys.argv[1]), sys.argv[2])\n"
    "print('ready', flush=True)\ntime.sleep(3600)\n")


def start_store(host, secret, port=STORE_PORT):
    """A store server process on ``host``; returns once it listens."""
    env = dict(os.environ, **python_env())
    p = host.popen([PYTHON, "-c", _STORE_SRC, str(port), secret], env=env,
                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = p.stdout.readline()
    if line.strip() != "ready":
        raise RuntimeError(f"store on {host.name} did not start: {p.stderr.read()[-1000:]}")
    return p


def start_ranks(cluster, ranks_per_host, args, result_dir, env=None, hosts=None):
    """Starts ranks with the env-var bootstrap (TFRING_RANK/SIZE/STORE_ADDR),
    filling hosts in order; the store runs on the first host. Returns
    (store process, [rank processes])."""
    import secrets

    hosts = hosts or cluster.hosts
    secret = secrets.token_hex(16)
    store = start_store(hosts[0], secret)
    size = ranks_per_host * len(hosts)
    procs = []
    for r in range(size):
        h = hosts[r // ranks_per_host]
        e = launch_env(**{"TFRING_RANK": r, "TFRING_SIZE": size, "TFRING_SECRET": secret,
                          "TFRING_STORE_ADDR": f"{hosts[0].addr}:{STORE_PORT}",
                          "TFRING_RESULT_DIR": result_dir, "TFRING_TIMEOUT": 60, **(env or {})})
        procs.append(h.popen([PYTHON, WORKER, *args], env=e, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True))
    return store, procs


def wait_all(cluster, procs, timeout):
    """Waits for every process; kills all and raises on a hang. Returns the
    outputs (stdout+stderr) in order."""
    deadline = time.monotonic() + timeout
    outs = []
    for i, p in enumerate(procs):
        try:
            out, _ = p.communicate(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q in procs:
                cluster.kill(q)
            tails = [(q.communicate()[0] or "")[-1500:] for q in procs]
            raise AssertionError(f"process {i} hung past {timeout} s; output tails: {tails}")
        outs.append(out)
    return outs


def read_reports(result_dir, size):
    import json

    reps = []
    for r in range(size):
        path = os.path.join(str(result_dir), f"{r}.json")
        reps.append(json.load(open(path)) if os.path.exists(path) else None)
    return reps
