"""tfring-run: start the ranks of a tfring job without MPI.

    tfring-run -np 4 python train.py
    tfring-run -np 8 -H node1:4,node2:4 python train.py
    tfring-run -np 8 --hostfile hosts.txt --fusion-threshold-mb 32 python train.py
    tfring-run --nnodes 2 --node-rank R --nproc-per-node 4 --master-addr A python train.py

The last form runs on each node, no ssh (tfring/run/pernode.py,
tfring/run/node_meeting.py, docs/kubernetes.md).

horovodrun's options are accepted too (tfring/run/horovodrun.py): its tunables
become TFRING_* variables in every rank, and HOROVOD_* variables in the
launcher's environment are read as their TFRING_* equivalents
(tfring/_horovod_env.py) and passed on to remote ranks.

The launcher hosts the job's rendezvous store (a ``tfring._core.TcpStoreServer``
guarded by a fresh per-job secret) and starts one process per rank with the
environment ``tfring.init()`` reads: ``TFRING_RANK``, ``TFRING_SIZE``,
``TFRING_LOCAL_RANK``, ``TFRING_LOCAL_SIZE``, ``TFRING_CROSS_RANK``,
``TFRING_CROSS_SIZE``, ``TFRING_STORE_ADDR``, ``TFRING_SECRET`` and
``TFRING_HOSTNAME``, and the ``HOROVOD_RANK``... variables horovodrun sets,
for scripts that read them.

Ranks on the launcher's own host are its children; ranks on other hosts start
over ``ssh -o BatchMode=yes`` (keys must already be set up). Each rank runs in
a process group of its own, so the launcher alone decides when ranks stop:
- every line a rank prints is relayed whole, prefixed ``[rank]<stdout>:``
  or ``[rank]<stderr>:`` (horovodrun's prefix, no space) (and optionally saved unprefixed per rank);
- SIGINT/SIGTERM/SIGHUP sent to the launcher are forwarded to every rank;
- when a rank fails, the launcher names it, sends SIGTERM to the others,
  SIGKILL after a grace period, and exits with the failing rank's code
  (128+N for a rank killed by signal N);
- ``--timeout`` bounds the whole job (exit code 124);
- ``--restarts N`` starts the whole job again, with a fresh store and secret,
  up to N times after a rank fails (not after a signal to the launcher or
  the timeout); ranks read the attempt number in ``TFRING_RESTART``
  (0 first) and resume from their checkpoints.
A remote rank's ssh client is signalled like a local rank; the remote process
itself stops when its ssh session ends only if the remote side hangs it up.
"""

import argparse
import contextlib
import os
import secrets
import shlex
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass

from tfring.run import affinity, horovodrun, mpi, pernode
from tfring.run.common import (
    EXIT_TIMEOUT,
    FORWARDED_SIGNALS,
    PROG,
    RANK_VARS,
    Job,
    OutputRelay,
    format_addr,
    guess_reachable_address,
    is_local_host,
    parse_env_items,
    parse_hosts,
    ssh_command,
    start_store,
)
from tfring.run.hostfile import parse_hostfile

__all__ = [
    "RankSpec",
    "assign_ranks",
    "is_local_host",
    "main",
    "parse_hosts",
    "rank_env",
    "ssh_command",
]

DEFAULT_GRACE_S = 5.0


# ------------------------------------------------------------ placement ----


@dataclass
class RankSpec:
    rank: int
    size: int
    local_rank: int
    local_size: int
    cross_rank: int
    cross_size: int
    host: str
    local: bool


def assign_ranks(np_, hosts):
    """Fills hosts in order: with ``a:2,b:2`` ranks 0,1 go to a and 2,3 to b.

    ``cross_rank``/``cross_size`` follow Horovod: among the hosts that have a
    rank with this ``local_rank``, the index of this host and their count."""
    capacity = sum(n for _, n in hosts)
    if np_ > capacity:
        raise ValueError(f"-np {np_} exceeds the {capacity} slots given in -H")
    merged = {}
    for host, slots in hosts:  # a host named twice gets the slots of both
        merged[host] = merged.get(host, 0) + slots
    per_host = []
    left = np_
    for host, slots in merged.items():
        take = min(slots, left)
        if take:
            per_host.append((host, take))
        left -= take
    specs = []
    for host_index, (host, count) in enumerate(per_host):
        local = is_local_host(host)
        for local_rank in range(count):
            peers = [i for i, (_, c) in enumerate(per_host) if c > local_rank]
            specs.append(
                RankSpec(
                    rank=len(specs),
                    size=np_,
                    local_rank=local_rank,
                    local_size=count,
                    cross_rank=peers.index(host_index),
                    cross_size=len(peers),
                    host=host,
                    local=local,
                )
            )
    return specs


def rank_env(spec, store_addr, secret):
    """The TFRING_* variables of one rank (store address omitted when None)."""
    env = {
        "TFRING_RANK": str(spec.rank),
        "TFRING_SIZE": str(spec.size),
        "TFRING_LOCAL_RANK": str(spec.local_rank),
        "TFRING_LOCAL_SIZE": str(spec.local_size),
        "TFRING_CROSS_RANK": str(spec.cross_rank),
        "TFRING_CROSS_SIZE": str(spec.cross_size),
        "TFRING_SECRET": secret,
        "TFRING_HOSTNAME": spec.host,
    }
    if store_addr:
        env["TFRING_STORE_ADDR"] = store_addr
    return env


def horovod_rank_env(spec):
    """The variables horovodrun sets in each rank, for scripts that read them."""
    return {
        "HOROVOD_RANK": str(spec.rank),
        "HOROVOD_SIZE": str(spec.size),
        "HOROVOD_LOCAL_RANK": str(spec.local_rank),
        "HOROVOD_LOCAL_SIZE": str(spec.local_size),
        "HOROVOD_CROSS_RANK": str(spec.cross_rank),
        "HOROVOD_CROSS_SIZE": str(spec.cross_size),
        "HOROVOD_HOSTNAME": spec.host,
    }


def _iface_address():
    """The address TFRING_IFACE_ADDR or TFRING_IFACE names, else None."""
    if not (os.environ.get("TFRING_IFACE_ADDR") or os.environ.get("TFRING_IFACE")):
        return None
    from tfring import _core

    return _core._listen_address()


def _is_ip(host):
    try:
        socket.inet_pton(socket.AF_INET6 if ":" in host else socket.AF_INET, host)
        return True
    except OSError:
        return False


# --------------------------------------------------------------- output ----


# ------------------------------------------------------------------ job ----


# ---------------------------------------------------------------- store ----


# ------------------------------------------------------------------ cli ----


def build_parser():
    p = argparse.ArgumentParser(
        prog=PROG,
        allow_abbrev=False,
        description="Start the ranks of a tfring job (no MPI needed). Takes "
        "horovodrun's options too (see docs/launching-horovod.md).",
        epilog="Examples: tfring-run -np 4 python train.py; "
        "tfring-run -np 8 --hostfile hosts.txt python train.py",
    )
    p.add_argument("-v", "--version", action="store_true", default=False,
                   help="print tfring's version and exit")
    p.add_argument(
        "-np",
        "-n",
        "--num-proc",
        dest="np",
        type=int,
        default=None,
        help="number of ranks (required)",
    )
    p.add_argument(
        "-H",
        "--hosts",
        default=None,
        help="host1:slots,host2:slots,... (default: all ranks on this host); "
        "or --hostfile",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="stop the job after this many seconds (exit code 124)",
    )
    p.add_argument(
        "--env",
        "-x",
        action="append",
        default=[],
        metavar="K=V",
        help="set K=V in every rank (K alone copies the launcher's value); repeatable",
    )
    p.add_argument(
        "--restarts",
        type=int,
        default=0,
        metavar="N",
        help="after a rank fails, start the whole job again, up to N times "
        "(default 0); the ranks see TFRING_RESTART=attempt",
    )
    p.add_argument(
        "--output-dir",
        default=None,
        help="also write each rank's output to DIR/rank.R/{stdout,stderr}",
    )
    p.add_argument(
        "--grace-period",
        type=float,
        default=DEFAULT_GRACE_S,
        help="seconds between SIGTERM and SIGKILL when stopping ranks "
        f"(default {DEFAULT_GRACE_S:g})",
    )
    p.add_argument(
        "--store-host",
        default=None,
        help="address the ranks use to reach the launcher's store "
        "(default: 127.0.0.1, or the route to the first remote host)",
    )
    p.add_argument(
        "-p", "--ssh-port", type=int, default=None, help="ssh port for remote hosts"
    )
    p.add_argument(
        "--bind-to",
        choices=affinity.MODES,
        default="auto" if affinity.binding_enabled() else "none",
        help="auto (default): bind each rank on this host to its own slice of "
        "the cores when there are at least as many cores as ranks; none: "
        "leave every rank free to use every core (env TFRING_BIND)",
    )
    pernode.add_options(p)
    horovodrun.add_options(p)
    p.add_argument(
        "command", nargs=argparse.REMAINDER, help="the program every rank runs"
    )
    return p


def _version():
    try:
        from importlib import metadata

        return metadata.version("tfring")
    except Exception:  # noqa: BLE001 - a source tree without metadata
        return "(source tree)"


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.version:
        print(f"tfring {_version()}")
        return 0
    from tfring.run import elastic

    node_cfg = pernode.choose(parser, args, elastic.requested(args), _hosts)
    horovodrun.check_args(parser, args)
    if args.check_build:
        horovodrun.check_build(sys.stdout, mpi.find_mpirun())
        return 0
    if args.np is None and not elastic.requested(args) and node_cfg is None:
        parser.error("the following arguments are required: -np")
    if args.restarts < 0:
        parser.error("--restarts must be >= 0")
    tunables = horovodrun.launcher_tunables(args, sys.stderr)
    if node_cfg is not None:
        from tfring.run import node_meeting

        with horovodrun.environ(tunables):
            return node_meeting.run(
                parser, args, node_cfg,
                lambda relay, addr, secret, **place: _place_rank(args, relay, addr, secret,
                                                                 **place))
    if args.use_mpi:
        return mpi.run_job(parser, args, tunables, _hosts, parse_env_items)
    with horovodrun.environ(tunables):
        if elastic.requested(args):
            return elastic.main(parser, args)
        return _run_attempts(parser, args)


def _run_attempts(parser, args):
    deadline = None if args.timeout is None else time.monotonic() + args.timeout
    for attempt in range(args.restarts + 1):
        if attempt:
            sys.stderr.write(
                f"{PROG}: restarting the job (restart {attempt} of "
                f"{args.restarts})\n")
            sys.stderr.flush()
        if deadline is not None:
            args.timeout = max(0.0, deadline - time.monotonic())
        code, final = _run_once(parser, args, attempt)
        if code == 0 or final:
            return code
    return code


def _run_once(parser, args, attempt, driver=None):
    """Runs the job once. Returns (exit code, whether restarting is ruled
    out: the launcher was signalled or timed out).

    ``driver`` (a function job, tfring/runner.py) is told when the store is
    up (``store_ready(host, port, secret)``, before any rank starts; it may
    return a start watch) and when the ranks have ended
    (``job_ended(job, code)``, while the store still serves)."""
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        parser.error("no command given")
    if args.np < 1:
        parser.error("-np must be >= 1")
    try:
        specs = assign_ranks(args.np, _hosts(args))
        user_env = parse_env_items(args.env)
    except ValueError as e:
        parser.error(str(e))
    user_env = horovodrun.translate_x(user_env, relay_notices=attempt == 0)

    relay = OutputRelay(args.prefix_output_with_timestamp)
    remote_hosts = sorted({s.host for s in specs if not s.local})
    if remote_hosts:
        # Listen on the interface the ranks are told to use (TFRING_IFACE /
        # TFRING_IFACE_ADDR, else the route to the first remote host), not on
        # every interface; a --store-host name may be an alias: listen wide.
        chosen = _iface_address()
        store_host = args.store_host or chosen or guess_reachable_address(remote_hosts)
        bind_host = chosen or (store_host if not args.store_host and _is_ip(store_host)
                               else "0.0.0.0")
    else:
        bind_host = args.store_host or "127.0.0.1"
        store_host = bind_host
    secret = secrets.token_hex(16)
    server, why = start_store(bind_host, secret)
    store_addr = format_addr(store_host, server.port) if server else None
    if server is None:
        relay.message(
            f"warning: cannot host the rendezvous store: {why}; ranks get no "
            "TFRING_STORE_ADDR, so tfring.init() in them will fail"
        )

    cwd = os.getcwd()
    base_env = dict(os.environ)
    base_env["PYTHONUNBUFFERED"] = "1"
    # Remote ranks get the tunables set here, not the whole local environment.
    forwarded = {
        k: v
        for k, v in os.environ.items()
        if k.startswith("TFRING_") and k not in RANK_VARS
    }
    forwarded["PYTHONUNBUFFERED"] = "1"
    # Which start of the job this is (--restarts), never inherited.
    forwarded["TFRING_RESTART"] = base_env["TFRING_RESTART"] = str(attempt)

    output_dir = args.output_dir or args.output_filename
    if args.output_filename:  # horovodrun pads ranks to sort: rank.07 before rank.10
        width = len(str(max(args.np - 1, 0)))
        job = Job(relay, args.grace_period, lambda rank: f"rank.{rank:0{width}d}")
    else:
        job = Job(relay, args.grace_period)
    ssh_args = ("-i", args.ssh_identity_file) if args.ssh_identity_file else ()
    if args.verbose:
        relay.message(f"{len(specs)} rank(s): " + ", ".join(
            f"{s.rank}@{s.host}" for s in specs) + f"; store at {store_addr}")
        tuned = {k: v for k, v in os.environ.items() if k.startswith("TFRING_")}
        tuned.update({k: v for k, v in user_env.items() if k.startswith("TFRING_")})
        if tuned:
            relay.message("tunables: " + " ".join(f"{k}={v}" for k, v in sorted(tuned.items())
                                                  if k not in RANK_VARS))
    # Signals reach only the main thread's handlers (a function job may be
    # driven from another thread; its caller then stops it).
    previous = ({s: signal.signal(s, job.on_signal) for s in FORWARDED_SIGNALS}
                if threading.current_thread() is threading.main_thread() else {})
    try:
        driver_watch = None
        if driver is not None:
            if server is None:
                raise RuntimeError(f"cannot run a function job: {why}")
            driver_watch = driver.store_ready(bind_host, server.port, secret)
        for spec in specs:
            renv = rank_env(spec, store_addr, secret)
            renv.update(horovod_rank_env(spec))
            if spec.local:
                env = dict(base_env)
                env.update(user_env)
                env.update(renv)
                for k in RANK_VARS:
                    if k not in renv:
                        env.pop(k, None)
                argv = command
            else:
                env = dict(os.environ)
                remote_env = dict(forwarded)
                remote_env.update(user_env)
                remote_env.update(renv)
                remote_command = (command if args.bind_to == "none" else
                                  affinity.wrap_remote(command, spec.local_rank, spec.local_size))
                argv = ssh_command(spec.host, cwd, remote_env, remote_command, args.ssh_port,
                                   ssh_args)
            if args.verbose:
                relay.message(f"rank {spec.rank}: {shlex.join(argv)}")
            if job.exit_code is not None:
                break  # a signal arrived while starting: start no more ranks
            stdin_data = None if spec.local else (secret + "\n").encode()
            try:
                cpus = _local_cpus(args, spec, relay)
                job.spawn(spec.rank, argv, env, cwd, output_dir, stdin_data, cpus)
            except OSError as e:
                relay.message(
                    f"cannot start rank {spec.rank} ({shlex.join(argv)}): {e}"
                )
                job.stop(127 if isinstance(e, FileNotFoundError) else 126)
                break
        watch = None
        if args.start_timeout and server is not None and job.exit_code is None:
            try:
                watch = horovodrun.StartWatch(bind_host, server.port, secret, args.np,
                                              args.start_timeout)
            except Exception as e:  # noqa: BLE001 - the job runs on without it
                relay.message(f"warning: --start-timeout is not watched: cannot reach "
                              f"the store: {e}")
        code = job.wait(args.timeout, watch or driver_watch)
        if driver is not None:
            driver.job_ended(job, code)
        return code, bool(job.signals_received) or code == EXIT_TIMEOUT
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        if server is not None:
            with contextlib.suppress(Exception):  # the job is over either way
                server.stop()


def _place_rank(args, relay, store_addr, secret, **place):
    """A rank a per-node launch starts on this node: its variables and the
    cores it runs on (tfring/run/node_meeting.py)."""
    spec = RankSpec(local=True, **place)
    env = rank_env(spec, store_addr, secret)
    env.update(horovod_rank_env(spec))
    return env, _local_cpus(args, spec, relay)


def _local_cpus(args, spec, relay):
    """The slice of the cores a rank started on this host runs on
    (--bind-to, see tfring/run/affinity.py); None to leave it unbound."""
    if not spec.local or args.bind_to == "none":
        return None
    cpus = affinity.slice_for(spec.local_rank, spec.local_size)
    if cpus is not None and args.verbose:
        relay.message(f"rank {spec.rank} bound to CPUs {affinity.describe(cpus)}")
    return cpus


def _hosts(args):
    """[(host, slots)] from -H, --hostfile, or all ranks on this host."""
    if args.hostfile:
        return parse_hostfile(args.hostfile)
    if args.hosts:
        return parse_hosts(args.hosts)
    return [(socket.gethostname(), args.np)]
