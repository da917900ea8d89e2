"""One rank of a cluster test. Started by any launcher (env-var bootstrap,
tfring-run -H over ssh, mpirun, srun); writes a JSON report to
$TFRING_RESULT_DIR/<rank>.json.

    cluster_worker.py collectives
        allreduce / allgather / broadcast on inputs every rank can recompute;
        reports each output's sha256 (for bitwise comparison with a
        single-host run) and its largest error against numpy float64.
    cluster_worker.py fault <op>
        loops the collective <op> (allreduce, allgather, broadcast) until it
        fails (the harness injects the fault); with VICTIM=<rank> and
        STALL_BEFORE_SUBMIT=1 that rank submits nothing, so the others wait
        in negotiation; with KILL_RANK=<rank> that rank SIGKILLs itself
        KILL_AFTER (0.3) seconds into the loop. Reports the error class, message and when it came.
"""

import hashlib
import json
import os
import signal
import sys
import threading
import time

import numpy as np

# Bitwise equality with a single-host run holds when both reduce in the same
# order: the ring. (Across hosts, auto picks the hierarchical and small
# cross-host schemes, whose results tests/core/test_algorithms.py checks against
# numpy and across ranks.) The launchers do not pass TFRING_* through, so
# the worker sets it itself.
os.environ.setdefault("TFRING_ALLREDUCE_ALGO", os.environ.get("CLUSTER_ALGO", "ring"))

import tfring.basics as basics  # noqa: E402
from tfring import _core  # noqa: E402

SIZES = (1, 7, 1000, 65537, 1 << 20)


def _input(rank, n, salt, dtype=np.float32):
    rng = np.random.default_rng(1000 * salt + rank)
    return rng.standard_normal(n).astype(dtype)


def _digest(a):
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()


def collectives(rank, size):
    out = {}
    for i, n in enumerate(SIZES):
        x = _input(rank, n, i)
        got = _core.allreduce(x, name=f"ar{i}")
        ref = sum(_input(r, n, i).astype(np.float64) for r in range(size))
        out[f"allreduce{n}"] = (_digest(got), float(np.max(np.abs(got - ref))))
    for i, n in enumerate((3, 1000)):
        rows = n + rank  # the first dimension differs between ranks
        x = _input(rank, rows * 4, 50 + i).reshape(rows, 4)
        got = _core.allgather(x, name=f"ag{i}")
        ref = np.concatenate([_input(r, (n + r) * 4, 50 + i).reshape(n + r, 4)
                              for r in range(size)])
        out[f"allgather{n}"] = (_digest(got), float(np.max(np.abs(got - ref))))
    for root in range(size):
        x = _input(rank, 100003, 80 + root)
        got = _core.broadcast(x, root=root, name=f"bc{root}")
        out[f"broadcast{root}"] = (_digest(got),
                                   float(np.max(np.abs(got - _input(root, 100003, 80 + root)))))
    return out


def fault(rank, op):
    if rank == int(os.environ.get("VICTIM", "-1")) and os.environ.get("STALL_BEFORE_SUBMIT"):
        _ready(rank)
        time.sleep(3600)  # the others negotiate, waiting for this rank
    if rank == int(os.environ.get("KILL_RANK", "-1")):
        threading.Timer(float(os.environ.get("KILL_AFTER", "0.3")), os.kill,
                        (os.getpid(), signal.SIGKILL)).start()
    x = _input(rank, int(os.environ.get("FAULT_ELEMS", str(1 << 20))), 7)
    _ready(rank)
    i = 0
    while True:
        if op in ("allreduce", "negotiation"):
            _core.allreduce(x, name=f"f{i % 4}")
        elif op == "allgather":
            _core.allgather(x[: len(x) // 4], name=f"f{i % 4}")
        elif op == "broadcast":
            _core.broadcast(x, root=i % basics.size(), name=f"f{i % 4}")
        i += 1


def _ready(rank):
    """Marks that the collectives start (the harness times faults from here)."""
    d = os.environ.get("TFRING_RESULT_DIR")
    if d:
        open(os.path.join(d, f"{rank}.ready"), "w").close()


def main():
    mode = sys.argv[1]
    t_start = time.time()
    rep = {"error": None, "message": "", "t_error": None}
    rank = -1
    try:
        basics.init()
        rank, size = basics.rank(), basics.size()
        rep.update(rank=rank, size=size, local_rank=basics.local_rank(),
                   local_size=basics.local_size(), cross_rank=basics.cross_rank(),
                   cross_size=basics.cross_size(), transport=_core.transport())
        if mode == "collectives":
            rep["results"] = collectives(rank, size)
        else:
            fault(rank, sys.argv[2])
    except Exception as e:  # noqa: BLE001 - reported to the harness
        rep.update(error=type(e).__name__, message=str(e), t_error=time.time())
    rep["t_start"] = t_start
    if rank < 0:
        rank = int(os.environ.get("TFRING_RANK") or os.environ.get("OMPI_COMM_WORLD_RANK")
                   or os.environ.get("SLURM_PROCID") or 0)
    with open(os.path.join(os.environ["TFRING_RESULT_DIR"], f"{rank}.json"), "w") as f:
        json.dump(rep, f)
    sys.stdout.flush()
    # Leave as a program that caught the error would: shutdown, exit 1.
    basics.shutdown()
    sys.exit(1 if rep["error"] else 0)


if __name__ == "__main__":
    main()
