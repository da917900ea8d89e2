"""Per-node launch: the nodes' tfring-runs meet, start their ranks, and end
the job together.

Node 0's tfring-run serves the job's rendezvous store (a
``tfring._core.TcpStoreServer``, the same store the single launcher serves)
on the master port; every node's tfring-run connects to it, and so do the
ranks (``TFRING_STORE_ADDR``). The launchers' keys live under ``launch/``,
beside the ranks' own:

  launch/claim/<R>     counter: a second node with rank R sees 2 and stops
  launch/node/<R>      JSON {host, nnodes, nproc}: node R has arrived
  launch/beat/<R>      counter node R's launcher bumps every second
  launch/failures      counter of failures; failure number n is in
  launch/failure/<n>   JSON {code, text}: "rank 3 on node 1 (host2) exited ..."
  launch/end/<R>       node R's exit code, once its ranks are gone

1. Each node claims its rank, publishes launch/node/<R> and waits (the start
   timeout) until every node has; then all check that they agree on the
   node count and ranks per node. A node missing at the deadline is named
   on every node that is there.
2. Each node starts its ranks: rank = R * L + local_rank, cross_rank = R.
3. While they run, each launcher polls launch/failures. The first failure on
   a node (a rank exiting non-zero, a signal to its launcher) is recorded
   there; every other node then stops its ranks. Node 0 also watches the
   beats: a node whose launcher stops beating for NODE_LOST_S is recorded as
   a failure. A node that loses the store (node 0 is gone) stops its ranks.
4. Each node records launch/end/<R>. Node 0 keeps serving until every node
   has ended (or is lost), so no rank loses the store while it runs. Every
   node that fails prints the recorded failures and exits non-zero.
"""

import contextlib
import hashlib
import json
import os
import shlex
import signal
import socket
import sys
import time

from tfring.run.common import (
    EXIT_TIMEOUT,
    FORWARDED_SIGNALS,
    RANK_VARS,
    Job,
    OutputRelay,
    parse_env_items,
)

DEFAULT_START_TIMEOUT_S = 600.0  # pods may wait for images and scheduling
NODE_LOST_S = 30.0
POLL_S = 0.25
BEAT_S = 1.0


class MeetingError(Exception):
    def __init__(self, text, code=1):
        super().__init__(text)
        self.code = code


def job_secret(cfg):
    """TFRING_SECRET, else a secret every node derives from the job's shape
    (with a warning: anyone who knows it can compute it). Returns (secret,
    derived)."""
    secret = os.environ.get("TFRING_SECRET", "")
    if secret:
        return secret, False
    text = f"pernode:{cfg.master_addr}:{cfg.master_port}:{cfg.nnodes}:{os.getuid()}"
    return hashlib.sha256(text.encode()).hexdigest()[:32], True


class Meeting:
    """One node's view of the launchers' keys in the job's store."""

    def __init__(self, cfg, store_host, secret, start_timeout_s):
        from tfring import _core

        self.cfg = cfg
        self.R = cfg.node_rank
        self.where = f"the rendezvous at {cfg.master}"
        self.host = socket.gethostname()
        self.timeout_s = start_timeout_s
        self.deadline = time.monotonic() + start_timeout_s
        self.error_types = (_core.TfringError,)
        self.store = self._connect(_core, store_host, secret)
        self.exit_code = None  # read by Job.wait when poll() says to stop
        self.remote_stop = False
        self.next_poll = self.next_beat = 0.0
        self.beats = {}  # node -> (last count seen, when it changed)
        self.hosts = {}

    def _connect(self, _core, host, secret):
        """The store client, once node 0 answers. Retried until the start
        deadline: in Kubernetes, node 0's name resolves only once its pod
        exists, and a connection may go unanswered until it runs."""
        last = None
        while True:
            left = self.deadline - time.monotonic()
            if left <= 0:
                break
            try:
                return _core.TcpStore(host, self.cfg.master_port, secret, min(left, 30.0))
            except self.error_types as e:
                if "secret" in str(e):  # node 0 is there, with another secret
                    raise MeetingError(f"{self.where}: {e}; give every node the same "
                                       "TFRING_SECRET") from None
                last = e
            time.sleep(min(1.0, max(0.0, self.deadline - time.monotonic())))
        raise MeetingError(
            f"timeout: cannot reach {self.where} within {self.timeout_s:g} s "
            f"(--start-timeout): node rank 0, which serves it, has not come up there "
            f"(or {self.cfg.master_addr} does not lead to it); missing node rank(s): 0 "
            f"({last})", EXIT_TIMEOUT)

    # ---------------------------------------------------------------- meet --

    def meet(self):
        """Returns once every node has arrived; raises MeetingError."""
        cfg = self.cfg
        if self.store.add(f"launch/claim/{self.R}", 1) > 1:
            raise MeetingError(f"node rank {self.R} was taken by another tfring-run at "
                               f"{self.where}: give each node its own --node-rank")
        me = {"host": self.host, "nnodes": cfg.nnodes, "nproc": cfg.nproc_per_node}
        self.store.set(f"launch/node/{self.R}", json.dumps(me).encode())
        self.store.add(f"launch/beat/{self.R}", 1)
        keys = [f"launch/node/{i}" for i in range(cfg.nnodes)]
        while not self.store.check(keys):
            if self.store.add("launch/failures", 0) > 0:
                code, text = self._failures()[0]
                raise MeetingError(f"the job failed while the nodes met: {text}", code or 1)
            if time.monotonic() > self.deadline:
                missing = [i for i in range(cfg.nnodes)
                           if not self.store.check([f"launch/node/{i}"])]
                text = (f"timeout: node rank(s) {', '.join(map(str, missing))} did not "
                        f"arrive at {self.where} within {self.timeout_s:g} s "
                        f"(--start-timeout); {cfg.nnodes - len(missing)} of {cfg.nnodes} "
                        "node(s) did")
                self.record(text, EXIT_TIMEOUT)
                raise MeetingError(text, EXIT_TIMEOUT)
            time.sleep(POLL_S)
        infos = [json.loads(v) for v in self.store.get_many(keys, 10.0)]
        for i, info in enumerate(infos):
            self.hosts[i] = info["host"]
            if (info["nnodes"], info["nproc"]) != (cfg.nnodes, cfg.nproc_per_node):
                raise MeetingError(
                    f"node {i} ({info['host']}) was started with --nnodes {info['nnodes']} "
                    f"--nproc-per-node {info['nproc']}, node {self.R} ({self.host}) with "
                    f"--nnodes {cfg.nnodes} --nproc-per-node {cfg.nproc_per_node}: every "
                    "node must be given the same")
        now = time.monotonic()
        self.beats = {i: (0, now) for i in range(cfg.nnodes) if i != self.R}

    # ------------------------------------------------------------- failures --

    def node_name(self, node):
        return f"node {node} ({self.hosts.get(node, '?')})"

    def record(self, text, code):
        """Records a failure for every node to see (first come, first listed)."""
        with contextlib.suppress(*self.error_types):
            n = self.store.add("launch/failures", 1)
            self.store.set(f"launch/failure/{n}",
                           json.dumps({"code": code, "text": text}).encode())

    def _failures(self, wait_s=5.0):
        """[(code, text)] in the order they were recorded."""
        n = self.store.add("launch/failures", 0)
        keys = [f"launch/failure/{i}" for i in range(1, n + 1)]
        out = []
        for v in (self.store.get_many(keys, wait_s) if keys else []):
            d = json.loads(v)
            out.append((d["code"], d["text"]))
        return out

    # ----------------------------------------------------- while ranks run --

    def poll(self):
        """Called by Job.wait: None while the job runs on; the message to
        print once this node must stop its ranks (exit code in exit_code)."""
        now = time.monotonic()
        if now < self.next_poll:
            return None
        self.next_poll = now + POLL_S
        try:
            if now >= self.next_beat:
                self.next_beat = now + BEAT_S
                self.store.add(f"launch/beat/{self.R}", 1)
                if self.R == 0:
                    lost = self.lost_nodes(now)
                    if lost:
                        text = "; ".join(
                            f"{self.node_name(i)} stopped answering (its tfring-run sent no "
                            f"heartbeat for {NODE_LOST_S:g} s)" for i in lost)
                        self.record(text, 1)
            if self.store.add("launch/failures", 0) == 0:
                return None
            code, text = self._failures()[0]
        except self.error_types as e:
            self.exit_code, self.remote_stop = 1, True
            return (f"lost {self.where} (node 0's tfring-run is gone): {e}; stopping "
                    f"the ranks of node {self.R}")
        self.exit_code, self.remote_stop = code or 1, True
        return f"{text}; stopping the ranks of node {self.R}"

    def lost_nodes(self, now):
        ids = sorted(self.beats)
        if not ids:
            return []
        counts = self.store.get_many([f"launch/beat/{i}" for i in ids], 10.0)
        lost = []
        for i, c in zip(ids, counts):
            last, since = self.beats[i]
            if int(c) != last:
                self.beats[i] = (int(c), now)
            elif now - since > NODE_LOST_S:
                del self.beats[i]
                # A node that has ended beats no more, and is not lost.
                if not self.store.check([f"launch/end/{i}"]):
                    lost.append(i)
        return lost

    # ----------------------------------------------------------------- end --

    def end(self, code, relay):
        """Records this node's end; node 0 serves on until every node has
        ended. Returns the recorded failures (empty when there were none)."""
        known = []
        try:
            self.store.set(f"launch/end/{self.R}", str(code).encode())
            known = self._failures(2.0)
            waiting = set(range(self.cfg.nnodes)) - {self.R}
            # Node 0 waits for all; a failed node only briefly, to list
            # what the others record.
            until = None if self.R == 0 else time.monotonic() + (3.0 if code else 0.0)
            told, started = False, time.monotonic()
            while waiting:
                waiting = {i for i in waiting if not self.store.check([f"launch/end/{i}"])}
                now = time.monotonic()
                if not waiting or (until is not None and now >= until):
                    break
                if self.R == 0:
                    if not told and now > started + 5:
                        relay.message(f"node 0 serves {self.where} until node(s) "
                                      f"{', '.join(map(str, sorted(waiting)))} end")
                        told = True
                    if now >= self.next_beat:
                        self.next_beat = now + BEAT_S
                        for i in self.lost_nodes(now):
                            self.record(f"{self.node_name(i)} stopped answering before it "
                                        "ended", 1)
                            waiting.discard(i)
                known = self._failures(2.0)
                time.sleep(POLL_S)
            return self._failures(2.0)
        except self.error_types:  # node 0 is gone: it had all it needed
            return known


class NodeJob(Job):
    """A Job that records its first reason to stop for the other nodes."""

    def __init__(self, meeting, relay, grace_s):
        super().__init__(relay, grace_s)
        self.meeting = meeting

    def stop(self, exit_code, signum=signal.SIGTERM):
        first = self.exit_code is None
        super().stop(exit_code, signum)
        if not first or self.meeting.remote_stop:
            return
        m = self.meeting
        where = f"on {m.node_name(m.R)}"
        if self.failure is not None:
            rank, what = self.failure
            text = f"rank {rank} {where} {what}"
        elif self.signals_received:
            text = f"the tfring-run {where} received {signal.Signals(signum).name}"
        elif exit_code == EXIT_TIMEOUT:
            text = f"the job ran past --timeout {where}"
        else:
            text = f"the ranks {where} were stopped (exit code {exit_code})"
        self.relay.message(f"{text}; ending the job on every node")
        m.record(text, exit_code)


def run(parser, args, cfg, place_rank, relay=None):
    """Runs this node's part of the job. Returns the exit code.
    ``place_rank(relay, store_addr, secret, **place)`` gives a rank's
    variables and the cores it runs on (None: unbound) from its place
    (rank, size, local_rank, local_size, cross_rank, cross_size, host)."""
    from tfring import _core
    from tfring.run import horovodrun

    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        parser.error("no command given")
    for opt, bad in (("--restarts", args.restarts), ("--output-filename", args.output_filename)):
        if bad:
            parser.error(f"{opt}: not with a per-node launch (the cluster restarts nodes)")
    try:
        user_env = parse_env_items(args.env)
    except ValueError as e:
        parser.error(str(e))
    user_env = horovodrun.translate_x(user_env)
    relay = relay or OutputRelay(args.prefix_output_with_timestamp)
    secret, derived = job_secret(cfg)
    if derived and cfg.node_rank == 0 and cfg.nnodes > 1:
        relay.message("warning: TFRING_SECRET is not set, so the job's secret is derived "
                      "from the master address and port, which others can compute; set the "
                      "same random TFRING_SECRET on every node (a Kubernetes Secret)")
    timeout_s = float(args.start_timeout or DEFAULT_START_TIMEOUT_S)
    pinned = os.environ.get("TFRING_IFACE_ADDR") or os.environ.get("TFRING_IFACE")
    server = None
    if cfg.node_rank == 0:
        bind = _core._listen_address() if pinned else "0.0.0.0"
        alone = cfg.nnodes == 1 and cfg.sources.get("master_port") == "default"
        if alone:  # nobody else to meet: any free port on loopback
            bind = "127.0.0.1"
        try:
            server = _core.TcpStoreServer(bind, 0 if alone else cfg.master_port, secret)
            cfg.master_port = server.port
        except Exception as e:  # noqa: BLE001 - reported as the reason the node stops
            relay.message(f"node 0 cannot serve the rendezvous on port {cfg.master_port} "
                          f"({bind}): {e}")
            return 1
        store_host = "127.0.0.1" if bind == "0.0.0.0" else bind
    else:
        store_host = cfg.master_addr
    store_addr = f"[{store_host}]:{cfg.master_port}" if ":" in store_host else \
        f"{store_host}:{cfg.master_port}"
    try:
        return _run_node(args, cfg, command, user_env, relay, secret, store_host,
                         store_addr, timeout_s, place_rank)
    finally:
        if server is not None:
            with contextlib.suppress(Exception):  # the job is over either way
                server.stop()


def _run_node(args, cfg, command, user_env, relay, secret, store_host, store_addr,
              timeout_s, place_rank):
    from tfring import _core

    meeting = None
    try:
        meeting = Meeting(cfg, store_host, secret, timeout_s)
        meeting.meet()
    except MeetingError as e:
        relay.message(str(e))
        if meeting is not None and cfg.node_rank == 0:
            time.sleep(min(2.0, timeout_s))  # let the others read why
        return e.code
    except _core.TfringError as e:  # the store went away
        relay.message(f"lost the rendezvous at {cfg.master} while the nodes met: {e}")
        return 1
    L, R = cfg.nproc_per_node, cfg.node_rank
    # The core groups ranks into hosts by TFRING_HOSTNAME (shared memory,
    # local_rank); two nodes that share a host name (several tfring-runs on
    # one machine) stay apart, so local_rank and cross_rank follow the nodes.
    host_id = meeting.host
    if list(meeting.hosts.values()).count(host_id) > 1:
        host_id = f"{host_id}#node{R}"
    if args.verbose:
        relay.message(f"node {R} of {cfg.nnodes}: ranks {R * L}..{R * L + L - 1}; "
                      f"rendezvous at {cfg.master} (from "
                      + ", ".join(f"{k}: {v}" for k, v in cfg.sources.items()) + ")")
    base_env = dict(os.environ)
    base_env.update(user_env)
    base_env.update(PYTHONUNBUFFERED="1", TFRING_RESTART="0")
    job = NodeJob(meeting, relay, args.grace_period)
    previous = {s: signal.signal(s, job.on_signal) for s in FORWARDED_SIGNALS}
    cwd = os.getcwd()
    try:
        for lr in range(L):
            rank = R * L + lr
            renv, cpus = place_rank(relay, store_addr, secret, rank=rank, size=cfg.size,
                                    local_rank=lr, local_size=L, cross_rank=R,
                                    cross_size=cfg.nnodes, host=host_id)
            env = {k: v for k, v in base_env.items() if k not in RANK_VARS}
            env.update(renv)
            if args.verbose:
                relay.message(f"rank {rank}: {shlex.join(command)}")
            if job.exit_code is not None:
                break
            try:
                job.spawn(rank, command, env, cwd, args.output_dir, None, cpus)
            except OSError as e:
                relay.message(f"cannot start rank {rank} ({shlex.join(command)}): {e}")
                job.stop(127 if isinstance(e, FileNotFoundError) else 126)
                break
        code = job.wait(args.timeout, meeting)
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
    failures = meeting.end(code, relay)
    if code and failures:
        shown = "; ".join(text for _, text in failures[:5])
        more = f" (and {len(failures) - 5} more)" if len(failures) > 5 else ""
        relay.message(f"the job failed: {shown}{more}")
    elif code == 0 and failures and R == 0:
        relay.message(f"node 0's ranks succeeded, but: {failures[0][1]}")
        code = failures[0][0] or 1
    sys.stderr.flush()
    return code
