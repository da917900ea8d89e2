"""Binding each local rank to its own share of the host's cores.

Two ranks on one host exchange every collective through shared memory, and
each side's progress loop has to run while the other's does. Left to the
scheduler, a futex wake-up tends to pull the woken thread onto the waker's
core, so both ranks' loops (and the framework's thread pools of both
processes) end up taking turns on one core while another sits idle; which
way a job falls is decided early and holds for its whole life. On a 2-core
VM, a 100 x 16 KiB grouped allreduce in a ``tf.function`` step took 680-740
us in every job with each rank bound to its core, against 860-1200 us in
jobs left unbound.

So the launcher binds, as ``mpirun`` does by default: local rank i of n
gets the i-th of n contiguous, equal slices of the cores the launcher may
use (hyperthreads of a core stay together, so a slice is whole cores). The
framework then sizes its thread pools to the slice, as TensorFlow does from
the process's CPU affinity. When the ranks outnumber the cores nothing is
bound: every rank may then use every core, and the core's waits yield
instead of spinning.
"""

import contextlib
import os

MODES = ("auto", "none")


def _read(path):
    with open(path) as f:
        return f.read().strip()


def core_groups(cpus):
    """``cpus`` grouped by physical core (a core's hyperthreads together),
    cores ordered by package and then by their lowest CPU number."""
    groups = {}
    for cpu in sorted(cpus):
        topo = f"/sys/devices/system/cpu/cpu{cpu}/topology"
        try:
            key = (int(_read(f"{topo}/physical_package_id")), int(_read(f"{topo}/core_id")))
        except (OSError, ValueError):
            key = (-1, cpu)  # no topology (containers, some VMs): a CPU is a core
        groups.setdefault(key, []).append(cpu)
    return sorted(groups.values(), key=lambda g: (min(g) if g else 0))


def allowed_cpus():
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return []


def slice_for(local_rank, local_size, cpus=None):
    """The CPUs local rank ``local_rank`` of ``local_size`` is bound to, or
    None when there are fewer cores than ranks (or no affinity support)."""
    cpus = allowed_cpus() if cpus is None else sorted(cpus)
    cores = core_groups(cpus)
    if local_size < 1 or not cores or local_size > len(cores):
        return None
    if not 0 <= local_rank < local_size:
        raise ValueError(f"local rank {local_rank} out of range for {local_size} local ranks")
    base, extra = divmod(len(cores), local_size)
    start = local_rank * base + min(local_rank, extra)
    count = base + (1 if local_rank < extra else 0)
    return sorted(cpu for group in cores[start:start + count] for cpu in group)


@contextlib.contextmanager
def inherited(cpus):
    """Processes started inside the block run on ``cpus`` from their first
    instruction: the calling thread takes that mask while it forks (Linux
    gives a child its forking thread's mask), then goes back to its own.
    Binding a child after it has started leaves a window in which it runs,
    and may start threads, unbound. Yields whether the mask was taken."""
    old = None
    if cpus:
        try:
            old = os.sched_getaffinity(0)
            os.sched_setaffinity(0, cpus)
        except (AttributeError, OSError):
            old = None
    try:
        yield old is not None
    finally:
        if old is not None:
            with contextlib.suppress(OSError):
                os.sched_setaffinity(0, old)


def machine_identity():
    """This machine as the core names a host (csrc/common/net.cc
    hostIdentity): the hostname and the kernel's boot id, which containers
    on one kernel share and machines do not. Ranks with the same identity
    share the machine's cores."""
    import socket

    host = socket.gethostname() or "unknown-host"
    try:
        boot = _read("/proc/sys/kernel/random/boot_id")
    except OSError:
        boot = ""
    return f"{host}/{boot}" if boot else host


def bind_process(cpus):
    """Binds every thread of this running process to ``cpus`` (a Spark
    task's Python worker, a Ray actor: processes tfring did not start, so
    it cannot bind them from their first instruction as ``inherited``
    does); threads started later inherit the mask. Returns the calling
    thread's previous mask, for ``unbind_process``, or None when nothing
    was bound (no ``cpus``, or no affinity support)."""
    if not cpus:
        return None
    try:
        old = os.sched_getaffinity(0)
    except (AttributeError, OSError):
        return None
    _set_all_threads(cpus)
    return old


def unbind_process(old):
    """Puts every thread of this process back on ``old`` (what
    ``bind_process`` returned; None does nothing)."""
    if old:
        _set_all_threads(old)


def _set_all_threads(cpus):
    try:
        tids = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        tids = [0]
    for tid in tids:
        with contextlib.suppress(OSError):  # a thread that has just exited
            os.sched_setaffinity(tid, cpus)


def binding_enabled(environ=None):
    """Whether ranks are bound to their cores (TFRING_BIND in ``environ``,
    default os.environ; unset: the declared default)."""
    from tfring import _tunables

    value = (os.environ if environ is None else environ).get("TFRING_BIND")
    return (value or _tunables.default("TFRING_BIND")) != "none"


def describe(cpus):
    """"0-3,8" for [0, 1, 2, 3, 8]."""
    out, run = [], []
    for cpu in sorted(cpus):
        if run and cpu == run[-1] + 1:
            run.append(cpu)
            continue
        if run:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [cpu]
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(out)


def wrap_remote(command, local_rank, local_size):
    """``command`` for a rank started on another host: when it is a Python
    interpreter, that interpreter first runs this module, which binds the
    process to its slice of that host's cores and then execs ``command``
    (unchanged otherwise: another program is started unbound)."""
    if not command or not os.path.basename(command[0]).startswith("python"):
        return list(command)
    return [command[0], "-m", "tfring.run.affinity", str(local_rank), str(local_size),
            "--", *command]


def main(argv):
    """python -m tfring.run.affinity LOCAL_RANK LOCAL_SIZE -- COMMAND...:
    binds this process to the rank's slice of the cores, then execs COMMAND
    (which keeps the binding)."""
    if len(argv) < 4 or argv[2] != "--":
        raise SystemExit("usage: python -m tfring.run.affinity LOCAL_RANK LOCAL_SIZE -- COMMAND...")
    cpus = slice_for(int(argv[0]), int(argv[1]))
    if cpus:
        with contextlib.suppress(OSError):
            os.sched_setaffinity(0, cpus)  # the only thread: the exec keeps it
    os.execvp(argv[3], argv[3:])


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
