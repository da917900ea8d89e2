"""tfring-run as an elastic driver (horovodrun's elastic options).

    tfring-run --min-np 2 --max-np 8 --host-discovery-script ./hosts.sh python train.py
    tfring-run -np 4 --min-np 2 -H a:2,b:2 python train.py

The driver hosts the rendezvous store, starts one worker process per free
slot of every known host (local hosts as children, others over ssh), and
decides the job's membership, published to the workers as numbered epochs
(the protocol is described in tfring/elastic/_worker.py). It re-forms the
job when:

  * a member process exits with an error or is killed: its host is
    blacklisted (for good, or for a cool-down with
    --blacklist-cooldown-range), the host's other workers are stopped, and
    the next epoch holds the survivors (and any ready new workers);
  * members report a collective error but none died (a cut link, a hung
    peer): members that have not reported within a grace period are
    stopped as unreachable, and the rest form the next epoch;
  * a new worker (a host added by discovery, a host back from its
    cool-down) is ready: the next epoch adds it, and the members learn of it
    at their next commit (HostsUpdatedInterrupt);
  * discovery no longer lists a host: the next epoch leaves its workers
    out; they leave at the next commit.

Fewer than --min-np ranks: the driver waits up to --elastic-timeout for
hosts, then stops the job naming the hosts it lost. When every worker has
failed and no host can ever be admitted (each host the driver knows is
blacklisted for good), there is nothing to wait for: the job stops at once
with the first worker's error and exit code. More than --reset-limit
re-formations stop the job too. Every transition is logged with its reason.
The job ends when its members exit: successfully when all exit with 0.
"""

import contextlib
import json
import math
import os
import secrets
import shlex
import signal
import time

from tfring import _tunables
from tfring.elastic._worker import POISON
from tfring.run import affinity, horovodrun
from tfring.run.common import (
    ERROR_LINE,
    EXIT_TIMEOUT,
    FORWARDED_SIGNALS,
    RANK_VARS,
    Job,
    OutputRelay,
    format_addr,
    guess_reachable_address,
    is_local_host,
    parse_env_items,
    signal_name,
    ssh_command,
    start_store,
)
from tfring.run.elastic_hosts import HostPool

KEY = "elastic/"
DEFAULT_ELASTIC_TIMEOUT_S = 600
# Members that have not reported a collective error this long after another
# did are taken as unreachable (TFRING_ELASTIC_REPORT_GRACE overrides).
REPORT_GRACE_S = _tunables.default("TFRING_ELASTIC_REPORT_GRACE")
POLL_S = 0.02
START_WAIT_S = 60.0

STARTING, READY, MEMBER, LEAVING, GONE = "starting", "ready", "member", "leaving", "gone"


def requested(args):
    return any(getattr(args, d, None) is not None
               for d in ("host_discovery_script", "min_num_proc", "max_num_proc"))


class Worker:
    def __init__(self, wid, host, proc, slot=0):
        self.wid, self.host, self.proc = wid, host, proc
        self.slot = slot  # which of the host's slots (and slice of its cores)
        self.state = STARTING
        self.stop_at = None  # SIGKILL time once asked to stop
        self.rank = None  # its rank in the last membership that listed it
        self.relays = []  # the threads relaying its output

    def __repr__(self):
        return f"worker {self.wid} (pid {self.proc.pid}) on {self.host}"


class Driver:
    def __init__(self, args, command, relay):
        self.args, self.command, self.relay = args, command, relay
        self.min_np = args.min_num_proc or args.np or 1
        self.max_np = args.max_num_proc or args.np or math.inf
        if self.max_np < self.min_np:
            raise ValueError(f"--max-np {self.max_np} is below --min-np {self.min_np}")
        self.timeout_s = float(args.elastic_timeout if args.elastic_timeout is not None
                               else DEFAULT_ELASTIC_TIMEOUT_S)
        self.report_grace = float(os.environ.get("TFRING_ELASTIC_REPORT_GRACE",
                                                 REPORT_GRACE_S))
        self.pool = HostPool(args, self.log, args.np or (
            self.max_np if self.max_np != math.inf else self.min_np))
        self.workers = {}
        self.next_wid = 0
        self.epoch = -1
        self.members = []
        self.broken = None  # why the current epoch must be replaced
        self.change = None  # why a healthy epoch should be replaced
        self.fail_seen = None
        self.short_since = None  # when the job fell below --min-np
        self.first_failure = None  # (worker or None, why): the job's first failure
        self.first_code = None  # that worker's exit code (128+N: killed by signal N)
        self.started = time.monotonic()
        self.resets = 0
        self.finishing = False
        self.exit_code = None

    # ---------------------------------------------------------- logging --
    def log(self, text):
        self.relay.message(f"elastic: {text}")

    # -------------------------------------------------------- discovery --
    def _apply_discovery(self):
        # Workers beyond their host's slots (or on a removed host) leave at
        # the next membership change.
        for host, slots in self.pool.take_discovery().items():
            on_host = [w for w in self.workers.values()
                       if w.host == host and w.state in (STARTING, READY, MEMBER)]
            for w in on_host[slots:]:
                self._retire(w, f"host {host} " + ("removed by discovery" if slots == 0
                                                    else "has fewer slots"))

    def _retire(self, w, why):
        if w.state == MEMBER:
            w.state = LEAVING
            self.change = self.change or why
        else:
            self._stop_worker(w, signal.SIGTERM)

    # ---------------------------------------------------------- workers --
    def _alive(self):
        return [w for w in self.workers.values() if w.state in (STARTING, READY, MEMBER)]

    def _spawn_missing(self, now):
        if self.finishing:
            return
        alive = self._alive()
        for host, slots in self.pool.hosts.items():
            if not self.pool.usable(host, now):
                continue
            taken = {w.slot for w in alive if w.host == host}
            while len(taken) < slots and len(alive) < self.max_np:
                slot = min(set(range(slots)) - taken)
                w = self._spawn(host, slot, slots)
                if w is None:
                    return
                alive.append(w)
                taken.add(slot)

    def _spawn(self, host, slot=0, slots=1):
        wid = self.next_wid
        self.next_wid += 1
        env = {"TFRING_ELASTIC_ID": str(wid), "TFRING_STORE_ADDR": self.store_addr,
               "TFRING_SECRET": self.secret, "TFRING_HOSTNAME": host,
               "TFRING_ELASTIC_JOIN_TIMEOUT": str(self.timeout_s + 120)}
        if is_local_host(host):
            full = dict(self.base_env)
            full.update(self.user_env)
            for k in RANK_VARS:
                full.pop(k, None)
            full.update(env)
            argv, stdin_data = self.command, None
        else:
            remote = dict(self.forwarded)
            remote.update(self.user_env)
            remote.update(env)
            full = dict(os.environ)
            ssh_args = ("-i", self.args.ssh_identity_file) if self.args.ssh_identity_file else ()
            command = (self.command if self.args.bind_to == "none"
                       else affinity.wrap_remote(self.command, slot, slots))
            argv = ssh_command(host, os.getcwd(), remote, command, self.args.ssh_port,
                               ssh_args)
            stdin_data = (self.secret + "\n").encode()
        # A worker on this host gets its slot's slice of the cores from its
        # start, as tfring-run's ranks do (tfring/run/affinity.py).
        cpus = (affinity.slice_for(slot, slots)
                if is_local_host(host) and self.args.bind_to != "none" else None)
        try:
            proc = self.job.spawn(wid, argv, full, os.getcwd(), self.output_dir, stdin_data,
                                  cpus)
        except OSError as e:
            self.log(f"cannot start a worker on {host} ({shlex.join(argv)}): {e}")
            self._host_failed(host, f"cannot start a worker on {host}: {e}")
            return None
        w = Worker(wid, host, proc, slot)
        w.relays = self.job.threads[-2:]
        self.workers[wid] = w
        self.log(f"started {w}")
        return w

    def _stop_worker(self, w, signum=signal.SIGKILL):
        if w.state != GONE:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(w.proc.pid, signum)
            if w.stop_at is None:
                w.stop_at = time.monotonic() + self.args.grace_period
            if w.state != MEMBER:
                w.state = LEAVING

    def _host_failed(self, host, why, worker=None):
        if self.first_failure is None:
            self.first_failure = (worker, why)
        self.pool.failed(host, why)
        for w in self.workers.values():
            if w.host == host and w.state in (STARTING, READY, MEMBER):
                if w.state == MEMBER:
                    self.broken = self.broken or why
                self._stop_worker(w)

    def _reap(self, now):
        for w in list(self.workers.values()):
            if w.state == GONE:
                continue
            rc = w.proc.poll()
            if rc is None:
                if w.stop_at is not None and now >= w.stop_at:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(w.proc.pid, signal.SIGKILL)
                    w.stop_at = math.inf
                continue
            was, w.state = w.state, GONE
            what = (f"was killed by {signal_name(-rc)}" if rc < 0 else f"exited with code {rc}")
            if was == MEMBER and rc == 0:
                if not self.finishing:
                    self.log(f"{w} finished; the job ends when every member has finished")
                self.finishing = True
                continue
            if was == MEMBER and self.finishing:
                if w.stop_at is None:
                    self.log(f"{w} {what} while the job was finishing")
                    self.exit_code = self.exit_code or (128 - rc if rc < 0 else rc)
                continue
            if was in (MEMBER, STARTING, READY) and w.stop_at is None:
                self.log(f"{w} {what}")
                if was == MEMBER:
                    self.broken = self.broken or f"{w} {what}"
                self._host_failed(w.host, f"{w} {what}", w)
                if self.first_failure[0] is w:
                    self.first_code = 128 - rc if rc < 0 else rc

    def _poll_ready(self):
        for w in self.workers.values():
            if w.state == STARTING and self.store.check([f"{KEY}ready.{w.wid}"]):
                w.state = READY

    def _poll_reports(self, now):
        if self.epoch < 0 or self.broken or self.finishing:
            return
        key = f"{KEY}failed.{self.epoch}"
        if not self.store.check([key]):
            return
        members = [self.workers[i] for i in self.members]
        reported = [w for w in members if
                    self.store.check([f"{KEY}failmsg.{self.epoch}.{w.wid}"])]
        if self.fail_seen is None:
            self.fail_seen = now
            first = reported[0] if reported else None
            if first is not None:
                msg = self.store.get(f"{KEY}failmsg.{self.epoch}.{first.wid}", 5.0)
                self.log(f"{first} reports: {msg.decode('utf-8', 'replace')}")
        alive = [w for w in members if w.state == MEMBER]
        silent = [w for w in alive if w not in reported]
        if not silent:
            self.broken = "every member reported a collective error"
        elif now - self.fail_seen > self.report_grace:
            for w in silent:
                self._host_failed(w.host, f"{w} did not report within {self.report_grace:g} s "
                                  "after a collective error (unreachable or hung)", w)
            self.broken = self.broken or "unreachable members"

    # ------------------------------------------------------- membership --
    def _maybe_publish(self, now):
        if self.finishing:
            return
        members = [self.workers[i] for i in self.members
                   if self.workers[i].state == MEMBER and self.workers[i].stop_at is None]
        ready = [w for w in self.workers.values() if w.state == READY]
        if self.epoch < 0:
            # Start with every worker once all are ready; workers slow to
            # start (an ssh that hangs) are left for a later epoch once
            # --min-np are ready and START_WAIT_S passed.
            starting = [w for w in self.workers.values() if w.state == STARTING]
            waited = now - self.started
            if starting and waited < self.timeout_s and (
                    len(ready) < self.min_np or waited < START_WAIT_S):
                return
            if len(ready) < self.min_np:
                self._wait_for_min(now, len(ready), "to start the job")
                return
            self._publish(ready, "the job starts")
            return
        if self.broken:
            want = members + ready
            if len(want) < self.min_np:
                self._wait_for_min(now, len(want), f"after: {self.broken}")
                return
            self._publish(want, self.broken)
            return
        if self.change or (ready and len(members) < self.max_np):
            reason = self.change or ", ".join(f"{w} is ready" for w in ready)
            self._publish(members + ready, reason)

    def _wait_for_min(self, now, have, why):
        if self.short_since is None:
            self.short_since = now
            self.log(f"{have} worker(s) available, --min-np is {self.min_np}; waiting up to "
                     f"{self.timeout_s:g} s (--elastic-timeout) for hosts {why}")
        elif now - self.short_since > self.timeout_s:
            lost = self.pool.describe_lost()
            known = self.pool.describe() or "none"
            self._fail(f"only {have} of --min-np {self.min_np} workers available after "
                       f"{self.timeout_s:g} s (--elastic-timeout); hosts lost: {lost}; "
                       f"hosts known: {known}")

    def _check_all_failed(self):
        """Ends the job when every worker has failed and no host can be
        admitted: each known host is blacklisted for good (a cool-down ends,
        and discovery may list a new host, so both are worth waiting for)."""
        if self.first_failure is None or self._alive() or self.finishing:
            return
        if not self.pool.none_admissible():
            return
        w, why = self.first_failure
        if w is not None:
            for t in w.relays:  # its last lines, once the process is gone
                t.join(2.0)
            error = last_error(self.relay.tails.get(w.wid, ()))
            if w.rank is not None:
                why += f" (it was rank {w.rank})"
            if error:
                why += f": {error}"
        hosts = ", ".join(sorted(self.pool.hosts))
        self._fail(f"every worker has failed and no host can be admitted (blacklisted: "
                   f"{hosts}); first error: {why}", self.first_code or 1)

    def _publish(self, workers, reason):
        self.short_since = None
        workers = workers[:self.max_np] if self.max_np != math.inf else workers
        if self.epoch >= 0:
            self.resets += 1
            limit = self.args.reset_limit
            if limit is not None and self.resets > limit:
                self._fail(f"the job re-formed {self.resets} times, over --reset-limit "
                           f"{limit} (last reason: {reason})")
                return
            if self.broken:  # the worker's side of this: tfring/elastic/_worker.py _arrive
                v = self.store.add(f"{KEY}arrived.{self.epoch}", POISON)
                if POISON <= v < POISON + len(self.members):
                    self.store.set(f"{KEY}dead.{self.epoch}", b"1")
        old = set(self.members)
        e = self.epoch + 1
        record = {"epoch": e, "members": [w.wid for w in workers],
                  "hosts": [w.host for w in workers], "token": secrets.token_hex(16),
                  "added": any(w.wid not in old for w in workers), "reason": reason}
        for r, w in enumerate(workers):
            w.state, w.rank = MEMBER, r
        for wid in old - set(record["members"]):
            w = self.workers[wid]
            if w.state in (MEMBER, LEAVING):
                w.state = LEAVING
                if w.stop_at is None:
                    w.stop_at = time.monotonic() + max(30.0, self.args.grace_period)
        self.store.set(f"{KEY}epoch.{e}", json.dumps(record).encode())
        self.store.set(f"{KEY}epoch", str(e).encode())
        self.epoch, self.members = e, record["members"]
        self.broken = self.change = self.fail_seen = None
        ranks = " ".join(f"{r}:w{w.wid}@{w.host}" for r, w in enumerate(workers))
        self.log(f"epoch {e}: {len(workers)} rank(s) [{ranks}]; reason: {reason}")

    def _fail(self, why, code=1):
        self.log(f"error: {why}")
        e = self.epoch + 1
        self.store.set(f"{KEY}epoch.{e}", json.dumps({"epoch": e, "abort": why}).encode())
        self.store.set(f"{KEY}epoch", str(e).encode())
        self.epoch = e
        # Workers waiting to join read the reason and leave by themselves;
        # whoever is left gets SIGKILL after the grace period.
        self._stop_all(code, signum=None)

    def _stop_all(self, code, signum=signal.SIGTERM):
        if self.exit_code is None:
            self.exit_code = code
        self.finishing = True
        for w in self.workers.values():
            if w.state != GONE and signum is not None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(w.proc.pid, signum)
                if w.stop_at is None:
                    w.stop_at = time.monotonic() + self.args.grace_period

    def _on_signal(self, signum, frame):
        self.log(f"received {signal_name(signum)}; stopping every worker")
        self._stop_all(128 + signum, signum)

    # -------------------------------------------------------------- run --
    def run(self):
        a = self.args
        self.pool.start()
        hosts = self.pool.hosts
        remote = sorted(h for h in hosts if not is_local_host(h))
        if a.store_host:
            bind, host = "0.0.0.0", a.store_host
        elif remote or a.host_discovery_script and not all(map(is_local_host, hosts)):
            host = guess_reachable_address(remote)
            bind = "0.0.0.0"
        else:
            bind = host = "127.0.0.1"
        self.secret = secrets.token_hex(16)
        server, why = start_store(bind, self.secret)
        if server is None:
            self.pool.stop()
            self.log(f"error: cannot host the rendezvous store: {why}")
            return 1
        from tfring import _core

        self.store = _core.TcpStore("127.0.0.1" if bind == "0.0.0.0" else bind, server.port,
                                    self.secret, 30.0)
        self.store_addr = format_addr(host, server.port)
        self.base_env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.forwarded = {k: v for k, v in os.environ.items()
                          if k.startswith("TFRING_") and k not in RANK_VARS}
        self.forwarded["PYTHONUNBUFFERED"] = "1"
        self.output_dir = a.output_dir or a.output_filename
        self.job = Job(self.relay, a.grace_period, lambda wid: f"worker.{wid}")
        self.log(f"--min-np {self.min_np} --max-np "
                 f"{'unlimited' if self.max_np == math.inf else self.max_np}, hosts "
                 + (self.pool.describe() or "none yet"))
        previous = {s: signal.signal(s, self._on_signal) for s in FORWARDED_SIGNALS}
        deadline = None if a.timeout is None else time.monotonic() + a.timeout
        try:
            while True:
                now = time.monotonic()
                if deadline is not None and now > deadline and self.exit_code is None:
                    self.log(f"timeout: the job ran longer than {a.timeout:g} s (--timeout)")
                    self._stop_all(EXIT_TIMEOUT)
                self._apply_discovery()
                self._reap(now)
                if self.exit_code is None:
                    self._poll_ready()
                    self._poll_reports(now)
                    self._spawn_missing(now)
                    self._check_all_failed()
                if self.exit_code is None:
                    self._maybe_publish(now)
                if self.finishing and not any(self.workers[i].state == MEMBER
                                              for i in self.members):
                    if self.exit_code is None:
                        self.exit_code = 0
                    self._stop_all(self.exit_code)
                    if all(w.state == GONE for w in self.workers.values()):
                        break
                time.sleep(POLL_S)
        finally:
            self.pool.stop()
            for s, h in previous.items():
                signal.signal(s, h)
            deadline = time.monotonic() + 2.0
            for t in self.job.threads:
                t.join(max(0.0, deadline - time.monotonic()))
            with contextlib.suppress(Exception):
                server.stop()
        return self.exit_code


def last_error(lines):
    """The error a failed worker printed last: its exception's line, else its
    last line of output."""
    lines = [ln.strip() for ln in lines if ln.strip()]
    for ln in reversed(lines):
        if ERROR_LINE.match(ln):
            return ln
    return lines[-1] if lines else ""


def main(parser, args):
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        parser.error("no command given")
    if args.restarts:
        parser.error("--restarts: not with elastic options (the job re-forms itself)")
    for opt, v in (("--min-np", args.min_num_proc), ("--max-np", args.max_num_proc),
                   ("-np", args.np), ("--slots-per-host", args.slots_per_host)):
        if v is not None and v < 1:
            parser.error(f"{opt} must be >= 1")
    if args.host_discovery_script and (args.hosts or args.hostfile):
        parser.error("--host-discovery-script and -H/--hostfile are mutually exclusive")
    try:
        user_env = parse_env_items(args.env)
        relay = OutputRelay(args.prefix_output_with_timestamp)
        driver = Driver(args, command, relay)
    except ValueError as e:
        parser.error(str(e))
    driver.user_env = horovodrun.translate_x(user_env)
    return driver.run()
