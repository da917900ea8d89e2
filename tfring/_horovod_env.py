"""Horovod's environment variables, read as the TFRING_* tunables they mean.

A job script written for Horovod sets ``HOROVOD_FUSION_THRESHOLD``,
``HOROVOD_CYCLE_TIME``, ``HOROVOD_TIMELINE``... Each one that has a meaning
here becomes, converted to tfring's units, the value of its ``TFRING_*``
tunable: at ``tfring.init()`` as part of the configuration passed to the
core's init (tfring/_tunables.py), and in ``tfring-run`` in the environment
of the ranks it starts, so that remote ranks get it too. A ``TFRING_*``
variable that is already set wins. Every ``HOROVOD_*`` variable gets one
notice per process: what it became, or why it is ignored.

``translate`` is pure (it reads a mapping and returns what to set);
``read`` translates the process's environment without changing it, and
gives each notice once per process.
"""

import os
import sys

__all__ = ["ALIASES", "IGNORED", "SEEN_VAR", "emit", "read", "translate"]

# tfring-run lists here the HOROVOD_* names it has already reported, so that
# its ranks do not report them again.
SEEN_VAR = "TFRING_HOROVOD_SEEN"

# Set by horovodrun (and by tfring-run, for scripts that read them): they
# describe the launch, not a tunable, and are skipped without a notice.
LAUNCHER_SET = frozenset((
    "HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE",
    "HOROVOD_CROSS_RANK", "HOROVOD_CROSS_SIZE", "HOROVOD_HOSTNAME",
    "HOROVOD_GLOO_RENDEZVOUS_ADDR", "HOROVOD_GLOO_RENDEZVOUS_PORT",
    "HOROVOD_SECRET_KEY",
))

_LOG_LEVELS = {"trace": "0", "debug": "0", "info": "1", "warning": "2",
               "error": "3", "fatal": "3"}

# Stands for "never" where tfring wants a number of seconds.
NEVER_S = "1e9"


class _Skip(Exception):
    """The value asks for nothing to be set (the reason is the message)."""


def _int(v):
    try:
        n = int(v.strip())
    except ValueError:
        raise ValueError(f"{v!r} is not an integer") from None
    if n < 0:
        raise ValueError(f"{v!r} is negative")
    return n


def _float(v):
    try:
        x = float(v.strip())
    except ValueError:
        raise ValueError(f"{v!r} is not a number") from None
    if x < 0:
        raise ValueError(f"{v!r} is negative")
    return x


def _flag(v):
    # Horovod reads these with strtol: a positive number is on.
    try:
        return int(v.strip()) > 0
    except ValueError:
        raise ValueError(f"{v!r} is not 0 or 1") from None


def _bytes(v):
    return str(_int(v))  # Horovod: bytes; TFRING_FUSION_THRESHOLD: bytes


def _ms(v):
    return f"{_float(v):g}"  # both in milliseconds


def _seconds(v):
    return f"{_float(v):g}"


def _positive_seconds(v):
    x = _float(v)
    if x == 0:
        raise _Skip("0 means never in Horovod; tfring keeps TFRING_TIMEOUT")
    return f"{x:g}"


def _log_level(v):
    level = _LOG_LEVELS.get(v.strip().lower())
    if level is None:
        raise ValueError(f"{v!r} is not one of {', '.join(n.upper() for n in _LOG_LEVELS)}")
    return level


def _cache(v):
    if _int(v) == 0:
        return "0"
    raise _Skip("tfring's negotiation cache has no capacity to set; it stays on")


def _timeline(v):
    if v.strip().upper() == "DYNAMIC":
        raise _Skip("DYNAMIC: no timeline file is opened at init")
    return v


def _hierarchical(v):
    if _flag(v):
        return "hier"
    raise _Skip("TFRING_ALLREDUCE_ALGO stays auto, which picks the allreduce "
                "by size and hosts (set TFRING_ALLREDUCE_ALGO=ring to force the flat ring)")


def _stall_disable(v):
    if _flag(v):
        return NEVER_S  # the warning never comes; TFRING_TIMEOUT still ends a stall
    raise _Skip("the stall check stays on")


def _dynamic_sets(v):
    return "1" if _flag(v) else "0"


# HOROVOD_* name -> (TFRING_* name, converter). A converter returns the
# TFRING value, raises ValueError for a malformed value, or _Skip when the
# value sets nothing. Where several HOROVOD names map to one TFRING name,
# the first in this table that yields a value wins (see _TIMEOUT for the
# exception).
ALIASES = {
    "HOROVOD_FUSION_THRESHOLD": ("TFRING_FUSION_THRESHOLD", _bytes),
    "HOROVOD_CYCLE_TIME": ("TFRING_CYCLE_TIME", _ms),
    "HOROVOD_CACHE_CAPACITY": ("TFRING_CACHE", _cache),
    "HOROVOD_TIMELINE": ("TFRING_TIMELINE", _timeline),
    "HOROVOD_LOG_LEVEL": ("TFRING_LOG_LEVEL", _log_level),
    "HOROVOD_GLOO_IFACE": ("TFRING_IFACE", lambda v: v.strip()),
    "HOROVOD_STALL_CHECK_DISABLE": ("TFRING_STALL_CHECK_TIME", _stall_disable),
    "HOROVOD_STALL_CHECK_TIME_SECONDS": ("TFRING_STALL_CHECK_TIME", _seconds),
    "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": ("TFRING_TIMEOUT", _positive_seconds),
    "HOROVOD_GLOO_TIMEOUT_SECONDS": ("TFRING_TIMEOUT", _positive_seconds),
    "HOROVOD_HIERARCHICAL_ALLREDUCE": ("TFRING_ALLREDUCE_ALGO", _hierarchical),
    "HOROVOD_TORUS_ALLREDUCE": ("TFRING_ALLREDUCE_ALGO", _hierarchical),
    "HOROVOD_DYNAMIC_PROCESS_SETS": ("TFRING_DYNAMIC_PROCESS_SETS", _dynamic_sets),
}

# Both bound how long a stalled collective may wait; tfring has one bound,
# TFRING_TIMEOUT, and takes the larger so neither is cut short.
_TIMEOUT = ("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", "HOROVOD_GLOO_TIMEOUT_SECONDS")

# Known names that mean nothing here, with the reason given in the notice.
IGNORED = {
    "HOROVOD_TIMELINE_MARK_CYCLES": "tfring's timeline has no cycle markers",
    "HOROVOD_LOG_HIDE_TIME": "tfring's log lines carry no timestamp",
    "HOROVOD_HIERARCHICAL_ALLGATHER": "tfring's allgather is a ring",
    "HOROVOD_AUTOTUNE": "tfring has no autotuner",
    "HOROVOD_AUTOTUNE_LOG": "tfring has no autotuner",
    "HOROVOD_AUTOTUNE_WARMUP_SAMPLES": "tfring has no autotuner",
    "HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE": "tfring has no autotuner",
    "HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES": "tfring has no autotuner",
    "HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE": "tfring has no autotuner",
    "HOROVOD_MPI_THREADS_DISABLE": "tfring does not run on MPI's threads",
    "HOROVOD_NUM_NCCL_STREAMS": "tfring uses one NCCL stream per rank",
    "HOROVOD_THREAD_AFFINITY": "tfring does not pin its background thread",
    "HOROVOD_BATCH_D2D_MEMCOPIES": "tfring batches GPU copies itself",
    "HOROVOD_CONTROLLER": "tfring has one controller of its own",
    "HOROVOD_CPU_OPERATIONS": "tfring has one CPU implementation of its own",
    "HOROVOD_CCL_CACHE": "tfring has no oneCCL backend",
    "HOROVOD_ADASUM_MPI_CHUNK_SIZE": "tfring's Adasum does not run on MPI",
    "HOROVOD_DISABLE_GROUP_FUSION": "tfring fuses grouped tensors like any others",
    "HOROVOD_DISABLE_NVTX_RANGES": "tfring emits no NVTX ranges",
    "HOROVOD_ENABLE_ASYNC_COMPLETION": "tfring's GPU ops always complete asynchronously",
    "HOROVOD_ENABLE_XLA_OPS": "tfring has no XLA ops to enable",
    "HOROVOD_ELASTIC": "tfring has no elastic mode (tfring-run --restarts restarts a failed job)",
    "HOROVOD_ELASTIC_TIMEOUT": "tfring has no elastic mode",
    "HOROVOD_START_TIMEOUT": "read by tfring-run only (--start-timeout)",
    "HOROVOD_GLOO": "tfring does not use Gloo",
    "HOROVOD_MPI": "tfring does not use MPI for collectives",
}

# Horovod's build-time settings (pip install options), often left exported.
_BUILD_PREFIXES = ("HOROVOD_WITH_", "HOROVOD_WITHOUT_", "HOROVOD_GPU", "HOROVOD_NCCL_",
                   "HOROVOD_CUDA_", "HOROVOD_ROCM_", "HOROVOD_BUILD_", "HOROVOD_CMAKE",
                   "HOROVOD_DEBUG", "HOROVOD_ALLOW_MIXED_GPU_IMPL", "HOROVOD_MPICXX_",
                   "HOROVOD_CCL_")


def translate(environ, quiet=()):
    """Returns ({TFRING name: value} to set, [notice, ...], [HOROVOD names
    seen]) for the HOROVOD_* variables in ``environ``. Nothing is set where
    the TFRING variable is already set (non-empty) in ``environ``. Names in
    ``quiet`` are translated without a notice."""
    names = sorted(k for k in environ if k.startswith("HOROVOD_") and environ[k] != "")
    updates, ignored = {}, []
    notices = _Notices(quiet)
    given = {}  # TFRING name -> (HOROVOD name, converted value), in table order
    for hvd in [n for n in ALIASES if n in names]:
        tfr, convert = ALIASES[hvd]
        value = environ[hvd]
        try:
            converted = convert(value)
        except _Skip as why:
            notices.append(f"{hvd}={value} sets nothing: {why}")
            continue
        except ValueError as e:
            notices.append(f"{hvd}={value} is ignored: {e}")
            continue
        if tfr == "TFRING_TIMEOUT" and tfr in given:
            first = given[tfr]
            if float(converted) > float(first[1]):
                notices.append(f"{first[0]}={environ[first[0]]} gives way to {hvd} "
                               f"(the larger bound is kept)")
                given[tfr] = (hvd, converted)
            else:
                notices.append(f"{hvd}={value} gives way to {first[0]} "
                               f"(the larger bound is kept)")
            continue
        if tfr in given:
            notices.append(f"{hvd}={value} is ignored: {given[tfr][0]} already sets {tfr}")
            continue
        given[tfr] = (hvd, converted)
    for tfr, (hvd, converted) in given.items():
        current = environ.get(tfr, "")
        if current != "":
            if current != converted:
                notices.append(f"{hvd}={environ[hvd]} is ignored: {tfr}={current} is set "
                               "and wins")
            continue
        updates[tfr] = converted
        notices.append(f"{hvd}={environ[hvd]} is read as {tfr}={converted}")
    for hvd in names:
        if hvd in ALIASES or hvd in LAUNCHER_SET or hvd in quiet:
            continue
        if hvd in IGNORED:
            ignored.append(f"{hvd} ({IGNORED[hvd]})")
        elif hvd.startswith(_BUILD_PREFIXES):
            ignored.append(f"{hvd} (a Horovod build setting)")
        else:
            ignored.append(f"{hvd} (no tfring equivalent)")
    if ignored:
        notices.texts.append("ignoring " + ", ".join(ignored))
    return updates, notices.texts, names


class _Notices:
    """Notice texts; a text about a quiet name is dropped."""

    def __init__(self, quiet):
        self.quiet = set(quiet)
        self.texts = []

    def append(self, text):
        if text.split("=", 1)[0] not in self.quiet:
            self.texts.append(text)


_reported = set()  # HOROVOD names this process has given a notice about


def read(environ=None):
    """Returns ({TFRING name: value}, notices): the TFRING_* equivalents of
    the HOROVOD_* variables in ``environ`` (default ``os.environ``, which is
    not changed), and the notices not given yet in this process (nor by the
    tfring-run that started it)."""
    environ = os.environ if environ is None else environ
    already = set(filter(None, environ.get(SEEN_VAR, "").split(",")))
    updates, notices, names = translate(environ, quiet=already | _reported)
    _reported.update(names)
    return updates, notices


def emit(notices, stream=None):
    stream = stream or sys.stderr
    for n in notices:
        stream.write(f"tfring: {n}\n")
    stream.flush()
