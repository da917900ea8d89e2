"""GPU state per communicator, on 3 ranks sharing one GPU, with process sets
a = [0, 1], b = [1, 2] and c = [2] (tests/gpu/test_gpu_sets.py). Reports
{"failures", "counts", "backends", "error"}.

Modes:
  isolation  (run with the one-shot allreduce forced, so every GPU allreduce
             is counted under "oneshot") a stream-completed (gated, as XLA's
             calls with TFRING_GPU_COMPLETION=stream) allreduce that fails in
             set a is kept by set a alone: set a's next gated call raises it,
             the world's and set b's still reduce. Each communicator counts
             its own GPU allreduces and has its own GPU backend (set c, of
             one rank, needs no communication: "local").
  names      (run with TFRING_GPU_BACKEND=nccl, which a shared GPU rules out)
             the GPU backend's error names the ranks sharing the GPU by
             their global ranks: set b's "ranks 1 and 2", the world's
             "ranks 0 and 1"; "error" is set b's on its members.
"""

import os
import sys
import time

import numpy as np

from common import report

import tfring
import tfring.basics as basics
from tfring import _core

basics.init()
rank, n = basics.rank(), basics.size()
device = int(os.environ.get("TFRING_TEST_DEVICE", "0"))
failures = []
a = tfring.add_process_set([0, 1])
b = tfring.add_process_set([1, 2])
c = tfring.add_process_set([2])
SETS = (("a", a), ("b", b), ("c", c))
stream = _core.cuda_stream_create(device)


def gated(ps, name, count=256):
    """A gated allreduce of `count` elements of rank + 1 on `ps` (None: the
    world), waited for on the stream; returns the output."""
    kw = {} if ps is None else {"process_set": ps.process_set_id}
    x = _core.CudaArray.from_numpy(np.full(count, rank + 1.0, np.float32), device)
    y = _core.CudaArray.from_numpy(np.zeros(count, np.float32), device)
    _core.cuda_allreduce_gated([x], [y], [name], stream, **kw)
    _core.cuda_synchronize(device, stream)  # the gate opened: no hang
    return y.to_numpy()


def reduce_checked(ps, name):
    ranks = list(range(n)) if ps is None else ps.ranks
    got = gated(ps, name)
    want = np.full(256, float(sum(r + 1 for r in ranks)))
    if not np.array_equal(got, want):
        failures.append(f"{name}: got {got[:4]}..., want {want[:4]}...")


def errors():
    """Every communicator's recorded error this rank can read."""
    out = {"world": _core.cuda_gated_error()}
    for tag, ps in SETS:
        if rank in ps.ranks:
            out[tag] = _core.cuda_gated_error(process_set=ps.process_set_id)
    return out


def run_names():
    """Each communicator's first GPU allreduce fails choosing its backend."""
    out = None
    for ps, want in ((None, "ranks 0 and 1 share GPU"), (b, "ranks 1 and 2 share GPU")):
        if ps is not None and rank not in ps.ranks:
            continue
        tag = "world" if ps is None else "b"
        try:
            gated(ps, f"{tag}.nccl")
            failures.append(f"{tag}: TFRING_GPU_BACKEND=nccl on a shared GPU should fail")
        except Exception as e:  # noqa: BLE001 - the message is what is checked
            if want not in str(e):
                failures.append(f"{tag}: the error should say {want!r}: {e}")
            out = str(e)
    return out


def run_isolation():
    """Returns ({communicator: GPU allreduce counts}, set a's raised error)."""
    error = None
    reduce_checked(None, "w.0")  # the world's first: completed on the host
    if rank in a.ranks:
        reduce_checked(a, "a.warm")  # a's first: on the host
        # Gated, with a shape that differs on rank 1: the call returns on
        # both members, the mismatch comes later and is kept by set a.
        x = _core.CudaArray.from_numpy(np.ones(100 + rank, np.float32), device)
        y = _core.CudaArray.from_numpy(np.zeros(100 + rank, np.float32), device)
        _core.cuda_allreduce_gated([x], [y], ["a.bad"], stream, process_set=a.process_set_id)
        _core.cuda_synchronize(device, stream)
        deadline = time.monotonic() + 10
        while errors()["a"] is None and time.monotonic() < deadline:
            time.sleep(0.02)
        err = errors()
        if err["a"] is None or "a.bad" not in err["a"]:
            failures.append(f"set a should keep the error naming a.bad: {err}")
        if any(v is not None for k, v in err.items() if k != "a"):
            failures.append(f"another communicator kept set a's error: {err}")
        try:
            gated(a, "a.next")
            failures.append("set a's next gated call should raise its recorded error")
        except Exception as e:  # noqa: BLE001 - the recorded error's type
            error = str(e)
    # The world and set b go on, gated (their second calls) and correct.
    reduce_checked(None, "w.1")
    if rank in b.ranks:
        reduce_checked(b, "b.0")
        reduce_checked(b, "b.1")
    if rank in c.ranks:
        reduce_checked(c, "c.0")
    reduce_checked(None, "w.2")
    final = errors()
    if any(v is not None for k, v in final.items() if k != "a"):
        failures.append(f"a communicator other than a has an error: {final}")
    counts = {"world": _core.gpu_allreduce_algorithms()}
    backends = {"world": _core.gpu_backend()}
    for tag, ps in SETS:
        if rank in ps.ranks:
            counts[tag] = _core.gpu_allreduce_algorithms(process_set=ps.process_set_id)
            backends[tag] = _core.gpu_backend(process_set=ps.process_set_id)
    return counts, backends, error


error = counts = backends = None
try:
    if sys.argv[1] == "isolation":
        counts, backends, error = run_isolation()
    else:
        error = run_names()
finally:
    _core.cuda_stream_destroy(stream, device)

report({"failures": failures, "counts": counts, "backends": backends, "error": error})
basics.shutdown()
