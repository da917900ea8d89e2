"""Per-node launch: which node this is, read from tfring-run's options or from
the environment Kubernetes training operators and torchrun users set.

    tfring-run --nnodes 3 --node-rank 1 --nproc-per-node 2 \\
        --master-addr node0.example --master-port 29500 python train.py

Every node runs one tfring-run with the same values except ``--node-rank``;
they meet at the master address (tfring/run/node_meeting.py) and each starts
its own ranks. Where an option is absent its value comes from:

    option              environment
    --nnodes            PET_NNODES
    --node-rank         PET_NODE_RANK
    --nproc-per-node    PET_NPROC_PER_NODE
    --master-addr       PET_MASTER_ADDR, else MASTER_ADDR
    --master-port       PET_MASTER_PORT, else MASTER_PORT

(``PET_*`` are torchrun's environment names; Kubeflow Trainer sets them in
each node's pod.) Options win over the environment. Two variables that name
the same value (``PET_MASTER_ADDR`` and ``MASTER_ADDR``) must agree.

Under an MPI Operator MPIJob the launcher pod has a host file instead
(``OMPI_MCA_orte_default_hostfile``, normally ``/etc/mpi/hostfile``, lines
``host slots=N``): ``tfring-run python train.py`` there runs the job under
mpirun on those hosts (``mpi_hostfile``).
"""

import os
import sys
from dataclasses import dataclass

__all__ = ["NodeConfig", "DEFAULT_PORT", "choose", "mpi_hostfile", "resolve"]

DEFAULT_PORT = 29500  # torchrun's
MPI_OPERATOR_HOSTFILE = "/etc/mpi/hostfile"
HOSTFILE_VAR = "OMPI_MCA_orte_default_hostfile"

# option dest -> (flag, environment variables read in order)
SOURCES = {
    "nnodes": ("--nnodes", ("PET_NNODES",)),
    "node_rank": ("--node-rank", ("PET_NODE_RANK",)),
    "nproc_per_node": ("--nproc-per-node", ("PET_NPROC_PER_NODE",)),
    "master_addr": ("--master-addr", ("PET_MASTER_ADDR", "MASTER_ADDR")),
    "master_port": ("--master-port", ("PET_MASTER_PORT", "MASTER_PORT")),
}


@dataclass
class NodeConfig:
    nnodes: int
    node_rank: int
    nproc_per_node: int
    master_addr: str
    master_port: int
    sources: dict  # dest -> where its value came from ("--nnodes", "PET_NNODES=3")

    @property
    def size(self):
        return self.nnodes * self.nproc_per_node

    @property
    def master(self):
        a = self.master_addr
        return f"[{a}]:{self.master_port}" if ":" in a else f"{a}:{self.master_port}"


def add_options(p):
    g = p.add_argument_group(
        "per-node launch", "run one tfring-run on each node (Kubernetes, torchrun style); "
        "absent options are read from PET_* / MASTER_* (docs/kubernetes.md)")
    g.add_argument("--nnodes", default=None, metavar="N",
                   help="number of nodes, each running one tfring-run (env PET_NNODES)")
    g.add_argument("--node-rank", default=None, metavar="R",
                   help="this node's index, 0..N-1; node 0 serves the rendezvous "
                   "(env PET_NODE_RANK)")
    g.add_argument("--nproc-per-node", default=None, metavar="L",
                   help="ranks on each node: an integer, or auto/gpu (one per GPU) "
                   "(env PET_NPROC_PER_NODE; default 1)")
    g.add_argument("--master-addr", default=None, metavar="A",
                   help="node 0's address, where the nodes meet "
                   "(env PET_MASTER_ADDR or MASTER_ADDR)")
    g.add_argument("--master-port", default=None, metavar="P",
                   help=f"the port node 0 serves the rendezvous on (env PET_MASTER_PORT "
                   f"or MASTER_PORT; default {DEFAULT_PORT})")


def _from_env(dest, environ):
    """(value, source) from the environment, or (None, None). Raises
    ValueError when two variables for the same value disagree."""
    found = [(n, environ[n].strip()) for n in SOURCES[dest][1]
             if environ.get(n, "").strip()]
    if not found:
        return None, None
    if len({v for _, v in found}) > 1:
        shown = " but ".join(f"{n}={v}" for n, v in found)
        raise ValueError(f"conflicting environment: {shown}; unset one or pass "
                         f"{SOURCES[dest][0]}")
    return found[0][1], f"{found[0][0]}={found[0][1]}"


def requested(args, environ=None):
    """True when the options or the environment ask for a per-node launch:
    any of its options, or PET_NNODES without -H/--hostfile."""
    environ = os.environ if environ is None else environ
    if any(getattr(args, d, None) is not None for d in SOURCES):
        return True
    if args.hosts or args.hostfile:
        return False
    return bool(environ.get("PET_NNODES", "").strip())


def _int(text, source, low, high=None):
    try:
        n = int(text)
    except (TypeError, ValueError):
        raise ValueError(f"{source}: expected an integer, got {text!r}") from None
    if n < low or (high is not None and n > high):
        span = f"{low}..{high}" if high is not None else f">= {low}"
        raise ValueError(f"{source}: {n} is out of range ({span})")
    return n


def _gpu_count(environ):
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip() and d.strip() != "-1"])
    try:
        return len([d for d in os.listdir("/dev") if d[6:].isdigit() and d.startswith("nvidia")])
    except OSError:
        return 0


def _nproc(text, source, environ):
    if text in ("auto", "gpu"):
        n = _gpu_count(environ)
        if n == 0 and text == "gpu":
            raise ValueError(f"{source}: 'gpu' asks for one rank per GPU, and this node "
                             "has none")
        return max(n, 1)
    if text == "cpu":
        raise ValueError(f"{source}: 'cpu' (one rank per core) is not supported: each "
                         "tfring rank runs TensorFlow's own thread pools; give a number")
    return _int(text, source, 1)


def resolve(args, environ=None):
    """The NodeConfig from the options, else the environment. Raises
    ValueError naming the option or variable that is missing or wrong."""
    environ = os.environ if environ is None else environ
    raw, sources = {}, {}
    for dest, (flag, _) in SOURCES.items():
        value = getattr(args, dest, None)
        env_value, env_source = _from_env(dest, environ)  # checked even when overridden
        if value is not None:
            raw[dest], sources[dest] = str(value).strip(), f"{flag} {value}"
        elif env_value is not None:
            raw[dest], sources[dest] = env_value, env_source
    if args.hosts or args.hostfile:
        raise ValueError(f"{sources.get('nnodes') or 'per-node launch'}: not with "
                         "-H/--hostfile (each node runs its own tfring-run)")
    if "nnodes" not in raw:
        raise ValueError("per-node launch needs the number of nodes: --nnodes N "
                         "(or PET_NNODES)")
    if ":" in raw["nnodes"]:
        raise ValueError(f"{sources['nnodes']}: a MIN:MAX range asks for an elastic job; "
                         "per-node launch takes a fixed number of nodes")
    nnodes = _int(raw["nnodes"], sources["nnodes"], 1)
    if "node_rank" not in raw:
        if nnodes > 1:
            raise ValueError(f"{sources['nnodes']}: each node needs its index too: "
                             "--node-rank R (or PET_NODE_RANK)")
        raw["node_rank"], sources["node_rank"] = "0", "default"
    node_rank = _int(raw["node_rank"], sources["node_rank"], 0, nnodes - 1)
    if "nproc_per_node" in raw:
        nproc = _nproc(raw["nproc_per_node"], sources["nproc_per_node"], environ)
    elif args.np is not None:
        if args.np % nnodes:
            raise ValueError(f"-np {args.np} does not split evenly over {nnodes} nodes; "
                             "give --nproc-per-node")
        nproc, sources["nproc_per_node"] = args.np // nnodes, f"-np {args.np}"
    else:
        nproc, sources["nproc_per_node"] = 1, "default"
    if args.np is not None and args.np != nnodes * nproc:
        raise ValueError(f"-np {args.np} conflicts with {sources['nnodes']} x "
                         f"{sources['nproc_per_node']} = {nnodes * nproc} ranks")
    if "master_addr" not in raw:
        if nnodes > 1:
            raise ValueError(f"{sources['nnodes']}: the nodes need node 0's address to "
                             "meet at: --master-addr A (or PET_MASTER_ADDR / MASTER_ADDR)")
        raw["master_addr"], sources["master_addr"] = "127.0.0.1", "default"
    addr = raw["master_addr"].strip("[]")
    if not addr:
        raise ValueError(f"{sources['master_addr']}: empty address")
    if "master_port" not in raw:
        raw["master_port"], sources["master_port"] = str(DEFAULT_PORT), "default"
    port = _int(raw["master_port"], sources["master_port"], 1, 65535)
    return NodeConfig(nnodes, node_rank, nproc, addr, port, sources)


def conflicts_with_mpi_hostfile(environ=None):
    """The MPI Operator's host file variable when it is set too, else None:
    a pod cannot be both an MPIJob launcher and one node of a per-node job."""
    environ = os.environ if environ is None else environ
    if environ.get(HOSTFILE_VAR) and environ.get("PET_NNODES"):
        return (f"conflicting environment: PET_NNODES={environ['PET_NNODES']} asks for a "
                f"per-node launch and {HOSTFILE_VAR}={environ[HOSTFILE_VAR]} for an "
                "MPIJob launch; pass --nnodes or -np/--hostfile to choose")
    return None


def mpi_hostfile(args, environ=None, default=MPI_OPERATOR_HOSTFILE):
    """The host file of an MPI Operator launcher pod when tfring-run should
    use it, else None: ``OMPI_MCA_orte_default_hostfile`` when set and no
    -H/--hostfile is given; the operator's default path only when -np is
    absent too (without it, tfring-run would have nothing to run)."""
    environ = os.environ if environ is None else environ
    if args.hosts or args.hostfile:
        return None
    path = environ.get(HOSTFILE_VAR, "").strip()
    if path:
        if not os.path.isfile(path):
            raise ValueError(f"{HOSTFILE_VAR}={path}: no such host file")
        return path
    if args.np is None and os.path.isfile(default):
        return default
    return None


def choose(parser, args, elastic, hosts_of):
    """tfring-run's choice: the NodeConfig of a per-node launch, or None.
    Under an MPIJob launcher (its host file and no hosts given) the job is
    switched to mpirun on that file's hosts instead (``args`` changed).
    ``elastic``: whether an elastic job was asked for; ``hosts_of(args)``
    reads the host file."""
    if requested(args):
        flags = [f for d, (f, _) in SOURCES.items() if getattr(args, d) is not None]
        why = None if flags else conflicts_with_mpi_hostfile()
        if why:
            parser.error(why)
        try:
            cfg = resolve(args)
        except ValueError as e:
            parser.error(str(e))
        if args.use_mpi or elastic:
            parser.error(f"{', '.join(flags) or 'PET_NNODES'}: a per-node launch starts its "
                         "ranks itself; not with --mpi or an elastic job")
        return cfg
    if args.use_mpi or elastic:
        return None
    try:
        hostfile = mpi_hostfile(args)
        if hostfile:
            args.hostfile, args.use_mpi = hostfile, True
            if args.np is None:
                args.np = sum(n for _, n in hosts_of(args))
    except ValueError as e:
        parser.error(str(e))
    if hostfile:
        sys.stderr.write(f"tfring-run: running {args.np} rank(s) under mpirun on the hosts "
                         f"of {hostfile} (MPI Operator)\n")
    return None
