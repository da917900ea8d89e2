"""What tfring-run's launcher (tfring/run/launcher.py) and its elastic driver
(tfring/run/elastic.py) share: host lists and ssh command lines, the ranks'
process handling and output relay, and the job's rendezvous store.
"""

import collections
import contextlib
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time

from tfring.run import affinity

# The line that states a Python error: "ValueError: ...", "tfring._core.TfringError: ..."
# (tfring-run's elastic driver and tfring.spark pick a failed worker's error out of its
# output with it).
ERROR_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)\b(:.*)?$")

PROG = "tfring-run"


EXIT_TIMEOUT = 124


# Signals forwarded to the ranks when the launcher receives them.
FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


# Variables that describe one rank's place in the job: set by the launcher,
# never inherited from its own environment.
RANK_VARS = (
    "TFRING_RANK",
    "TFRING_SIZE",
    "TFRING_LOCAL_RANK",
    "TFRING_LOCAL_SIZE",
    "TFRING_CROSS_RANK",
    "TFRING_CROSS_SIZE",
    "TFRING_STORE_ADDR",
    "TFRING_SECRET",
    "TFRING_HOSTNAME",
)


def parse_hosts(spec):
    """``"a:4,b:2,c"`` -> ``[("a", 4), ("b", 2), ("c", 1)]``."""
    hosts = []
    for item in spec.split(","):
        item = item.strip()
        if not item:
            continue
        # "[::1]:2" or "host:2" or "host"; a bare IPv6 address has no slots.
        if item.startswith("["):
            end = item.find("]")
            if end < 0:
                raise ValueError(f"bad host entry {item!r}")
            host, rest = item[1:end], item[end + 1 :]
            slots = rest[1:] if rest.startswith(":") else ""
        elif item.count(":") == 1:
            host, slots = item.split(":")
        else:
            host, slots = item, ""
        if not host:
            raise ValueError(f"bad host entry {item!r}: empty host name")
        try:
            n = int(slots) if slots else 1
        except ValueError:
            raise ValueError(
                f"bad host entry {item!r}: slots must be an integer"
            ) from None
        if n < 1:
            raise ValueError(f"bad host entry {item!r}: slots must be >= 1")
        hosts.append((host, n))
    if not hosts:
        raise ValueError(f"no hosts in {spec!r}")
    return hosts


def local_names():
    names = {"localhost", "127.0.0.1", "::1", "localhost.localdomain"}
    try:
        hn = socket.gethostname()
        names.update({hn, hn.split(".")[0]})
    except OSError:
        pass
    return {n.lower() for n in names}


def is_local_host(host):
    """True for names that mean this machine. Does no DNS lookup."""
    h = host.lower()
    return h in local_names() or h.startswith("127.")


def ssh_command(host, cwd, env, command, ssh_port=None, ssh_args=()):
    """argv that runs ``command`` in ``cwd`` on ``host`` with ``env`` set.

    TFRING_SECRET is not put on the command line, where `ps` on either host
    would show it: the remote shell reads it from the first line of stdin,
    which the caller writes (see Job.spawn's stdin_data)."""
    assignments = [f"{k}={v}" for k, v in env.items() if k != "TFRING_SECRET"]
    read_secret = ("IFS= read -r TFRING_SECRET && export TFRING_SECRET && "
                   if "TFRING_SECRET" in env else "")
    remote = "cd {} && {}exec env {} {}".format(
        shlex.quote(cwd),
        read_secret,
        " ".join(shlex.quote(a) for a in assignments),
        " ".join(shlex.quote(c) for c in command),
    )
    argv = ["ssh", "-o", "BatchMode=yes"]
    if ssh_port:
        argv += ["-p", str(ssh_port)]
    argv += list(ssh_args)
    argv += [host, remote]
    return argv


def format_addr(host, port):
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def guess_reachable_address(remote_hosts):
    """This machine's address on the route to the first remote host.

    A UDP connect() only picks a route and sends nothing."""
    for host in remote_hosts:
        try:
            infos = socket.getaddrinfo(host, 22, type=socket.SOCK_DGRAM)
        except OSError:
            continue
        for family, _, _, _, sockaddr in infos:
            try:
                with socket.socket(family, socket.SOCK_DGRAM) as s:
                    s.connect(sockaddr)
                    return s.getsockname()[0]
            except OSError:
                continue
    return socket.getfqdn()


class OutputRelay:
    """Relays ranks' output a whole line at a time, so lines never mix."""

    TAIL_LINES = 40

    def __init__(self, timestamps=False):
        self._lock = threading.Lock()
        self._broken = False
        self.timestamps = timestamps  # -prefix-timestamp: the time before each line
        self.tails = {}  # rank -> its last TAIL_LINES lines of stderr (to name its error)

    def write(self, stream, data):
        if self._broken:
            return
        out = getattr(stream, "buffer", None)
        with self._lock:
            try:
                if out is not None:
                    out.write(data)
                    out.flush()
                else:
                    stream.write(data.decode("utf-8", "replace"))
                    stream.flush()
            except (BrokenPipeError, ValueError):
                # Our reader went away (e.g. `| head`): keep the job going.
                self._broken = True

    def message(self, text):
        self.write(sys.stderr, f"{PROG}: {text}\n".encode())

    def pump(self, pipe, rank, name, stream, copy_path=None):
        prefix = f"[{rank}]<{name}>:".encode()  # Horovod's horovodrun prefix
        tail = None
        if name == "stderr":
            tail = self.tails.setdefault(rank, collections.deque(maxlen=self.TAIL_LINES))
        with contextlib.ExitStack() as stack:
            stack.callback(pipe.close)
            copy = stack.enter_context(open(copy_path, "wb")) if copy_path else None
            try:
                for line in iter(pipe.readline, b""):
                    if copy is not None:
                        copy.write(line)
                        copy.flush()
                    if not line.endswith(b"\n"):
                        line += b"\n"
                    if tail is not None:
                        tail.append(line.decode("utf-8", "replace").rstrip())
                    stamp = time.strftime("%a %b %d %H:%M:%S %Y").encode() if \
                        self.timestamps else b""
                    self.write(stream, stamp + prefix + line)
            except (OSError, ValueError):
                pass  # the pipe broke: the rank is gone, Job.wait reports how

    def start(self, pipe, rank, name, stream, copy_path=None):
        t = threading.Thread(
            target=self.pump,
            name=f"relay-{rank}-{name}",
            args=(pipe, rank, name, stream, copy_path),
            daemon=True,
        )
        t.start()
        return t


def signal_name(signum):
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


class Job:
    """The running ranks: spawning, watching, stopping."""

    def __init__(self, relay, grace_s, rank_dir=lambda rank: f"rank.{rank}"):
        self.relay = relay
        self.grace_s = grace_s
        self.rank_dir = rank_dir  # name of a rank's directory under output_dir
        self.procs = []  # (rank, Popen)
        self.returncodes = {}  # rank -> returncode
        self.threads = []
        self.kill_at = None  # when survivors of a stop get SIGKILL
        self.exit_code = None  # decided by the first reason to stop
        self.signals_received = 0
        self.failure = None  # (rank, what happened) of the first rank that failed

    def spawn(self, rank, argv, env, cwd, output_dir=None, stdin_data=None, cpus=None):
        """Starts one process; with ``cpus`` it runs on them from its start
        (affinity.inherited), and this launcher's own threads stay free."""
        with affinity.inherited(cpus):
            proc = subprocess.Popen(
                argv,
                env=env,
                cwd=cwd,
                stdin=subprocess.DEVNULL if stdin_data is None else subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
        if stdin_data is not None:
            # A line or so: fits the pipe buffer, so this never blocks.
            with contextlib.suppress(OSError):
                proc.stdin.write(stdin_data)
            with contextlib.suppress(OSError):
                proc.stdin.close()
        self.procs.append((rank, proc))
        for name, pipe, stream in (
            ("stdout", proc.stdout, sys.stdout),
            ("stderr", proc.stderr, sys.stderr),
        ):
            copy_path = None
            if output_dir:
                rank_dir = os.path.join(output_dir, self.rank_dir(rank))
                os.makedirs(rank_dir, exist_ok=True)
                copy_path = os.path.join(rank_dir, name)
            self.threads.append(self.relay.start(pipe, rank, name, stream, copy_path))
        return proc

    def running(self):
        return [(r, p) for r, p in self.procs if r not in self.returncodes]

    def signal_all(self, signum):
        for _, proc in self.running():
            try:
                os.killpg(proc.pid, signum)
            except (ProcessLookupError, PermissionError):
                pass

    def stop(self, exit_code, signum=signal.SIGTERM):
        """Signals every running rank; SIGKILL follows after the grace period."""
        if self.exit_code is None:
            self.exit_code = exit_code
        self.signal_all(signum)
        if self.kill_at is None:
            self.kill_at = time.monotonic() + self.grace_s

    def on_signal(self, signum, frame):
        self.signals_received += 1
        if self.signals_received == 1:
            self.relay.message(
                f"received {signal_name(signum)}; forwarding it to all ranks"
            )
            self.stop(128 + signum, signum)
        else:
            self.relay.message(
                f"received {signal_name(signum)} again; killing all ranks"
            )
            self.signal_all(signal.SIGKILL)

    def wait(self, timeout_s=None, start_watch=None):
        """Runs until every rank has ended. ``start_watch.poll()`` (when
        given) returns a message once the job must stop, with the exit code
        in its ``exit_code`` attribute (default EXIT_TIMEOUT)."""
        start = time.monotonic()
        while True:
            if start_watch is not None and self.exit_code is None:
                late = start_watch.poll()
                if late:
                    self.relay.message(late)
                    self.stop(getattr(start_watch, "exit_code", None) or EXIT_TIMEOUT)
            for rank, proc in self.running():
                rc = proc.poll()
                if rc is None:
                    continue
                self.returncodes[rank] = rc
                if rc != 0 and self.exit_code is None:
                    others = bool(self.running())
                    if rc < 0:
                        what = f"was killed by signal {signal_name(-rc)}"
                        code = 128 - rc
                    else:
                        what = f"exited with code {rc}"
                        code = rc
                    tail = "; terminating the other ranks" if others else ""
                    self.relay.message(f"rank {rank} (pid {proc.pid}) {what}{tail}")
                    self.failure = (rank, what)
                    self.stop(code)
            if not self.running():
                break
            now = time.monotonic()
            if (
                timeout_s is not None
                and self.exit_code is None
                and now - start > timeout_s
            ):
                self.relay.message(
                    f"timeout: the job ran longer than {timeout_s:g} s (--timeout); "
                    "terminating all ranks"
                )
                self.stop(EXIT_TIMEOUT)
            if self.kill_at is not None and now >= self.kill_at:
                left = ", ".join(str(r) for r, _ in self.running())
                self.relay.message(
                    f"rank(s) {left} still running {self.grace_s:g} s after SIGTERM; "
                    "sending SIGKILL"
                )
                self.signal_all(signal.SIGKILL)
                self.kill_at = float("inf")
            time.sleep(0.02)
        # Let the relays drain what the ranks printed last. A grandchild that
        # outlives its rank may hold a pipe open: don't wait for it forever.
        deadline = time.monotonic() + 2.0
        for t in self.threads:
            t.join(max(0.0, deadline - time.monotonic()))
        return self.exit_code if self.exit_code is not None else 0


def start_store(bind_host, secret):
    """Starts the job's TcpStoreServer. Returns (server, None) or (None, why)."""
    try:
        from tfring import _core
    except ImportError as e:
        return None, f"tfring._core cannot be imported ({e})"
    server_cls = getattr(_core, "TcpStoreServer", None)
    if server_cls is None:
        return None, "tfring._core has no TcpStoreServer"
    try:
        return server_cls(bind_host, 0, secret), None
    except Exception as e:  # noqa: BLE001 - any failure is reported the same way
        return None, f"TcpStoreServer({bind_host!r}, 0) failed: {e}"


def parse_env_items(items):
    env = {}
    for item in items or []:
        if "=" in item:
            k, v = item.split("=", 1)
        else:
            k = item
            if k not in os.environ:
                raise ValueError(f"--env {k}: not set in the launcher's environment")
            v = os.environ[k]
        if not k:
            raise ValueError(f"--env {item!r}: empty name")
        env[k] = v
    return env
