"""The job as TF_CONFIG describes it (tf.distribute's MultiWorkerMirroredStrategy,
Kubernetes training operators).

    TF_CONFIG='{"cluster": {"chief": ["c0:2222"], "worker": ["w0:2222", "w1:2222"]},
                "task": {"type": "worker", "index": 1}}'

Ranks follow MultiWorkerMirroredStrategy: the chief, when there is one, is
rank 0 and the workers follow in their listed order; without a chief,
worker i is rank i. The size is the number of chief and worker tasks. Rank
0's address (host:port) hosts the job's rendezvous store: rank 0 listens on
that port, the others connect to it.
"""

import json

__all__ = ["TfConfigJob", "parse"]

_TRAINING = ("chief", "worker")


class TfConfigJob:
    def __init__(self, rank, size, store_host, store_port, cluster_id):
        self.rank = rank
        self.size = size
        self.store_host = store_host
        self.store_port = store_port
        self.cluster_id = cluster_id  # the same text on every task of the job

    def __repr__(self):
        return (f"TfConfigJob(rank={self.rank}, size={self.size}, "
                f"store={self.store_host}:{self.store_port})")


def _error(msg):
    return ValueError(f"TF_CONFIG: {msg}")


def _split_address(addr, where):
    if not isinstance(addr, str) or not addr.strip():
        raise _error(f"{where} must be a 'host:port' string, got {addr!r}")
    addr = addr.strip()
    host, sep, port = addr.rpartition(":")
    if addr.startswith("["):  # [v6]:port
        host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise _error(f"{where} must be 'host:port' with a port in 1..65535, got {addr!r}")
    return host, int(port)


def parse(text):
    """TF_CONFIG's JSON text -> TfConfigJob. Raises ValueError naming what
    is wrong."""
    try:
        config = json.loads(text)
    except ValueError as e:
        raise _error(f"not valid JSON ({e})") from None
    if not isinstance(config, dict):
        raise _error("must be a JSON object with 'cluster' and 'task'")
    cluster = config.get("cluster")
    if not isinstance(cluster, dict) or not cluster:
        raise _error("has no 'cluster' object listing the tasks' addresses")
    task = config.get("task")
    if not isinstance(task, dict):
        raise _error("has no 'task' object saying which task this process is "
                     "(e.g. {\"type\": \"worker\", \"index\": 0})")
    for kind, addrs in cluster.items():
        if kind not in _TRAINING + ("ps", "evaluator"):
            raise _error(f"unknown task type {kind!r} in 'cluster' "
                         "(tfring runs 'chief' and 'worker' tasks)")
        if not isinstance(addrs, list):
            raise _error(f"cluster[{kind!r}] must be a list of 'host:port' strings")
    if cluster.get("ps"):
        raise _error("describes a parameter-server cluster ('ps' tasks); tfring "
                     "runs data-parallel 'chief' and 'worker' tasks only")
    chief = cluster.get("chief", [])
    workers = cluster.get("worker", [])
    if len(chief) > 1:
        raise _error(f"has {len(chief)} 'chief' tasks; there can be one at most")
    if not chief and not workers:
        raise _error("'cluster' lists no 'chief' or 'worker' task")
    ttype = task.get("type")
    index = task.get("index", 0)
    if ttype == "evaluator":
        raise _error("task type 'evaluator' does not take part in training; "
                     "run the evaluator without tfring.init()")
    if ttype not in _TRAINING:
        raise _error(f"unknown task type {ttype!r} in 'task' (expected 'chief' or 'worker')")
    if isinstance(index, bool) or not isinstance(index, int):
        raise _error(f"task index must be an integer, got {index!r}")
    tasks = chief if ttype == "chief" else workers
    if not 0 <= index < len(tasks):
        raise _error(f"task {ttype!r} index {index} is out of range: 'cluster' lists "
                     f"{len(tasks)} {ttype!r} task(s)")
    ordered = list(chief) + list(workers)
    for i, addr in enumerate(ordered):
        kind, k = ("chief", 0) if i < len(chief) else ("worker", i - len(chief))
        _split_address(addr, f"cluster[{kind!r}][{k}]")
    rank = index if ttype == "chief" else len(chief) + index
    host, port = _split_address(ordered[0], "rank 0's address")
    cluster_id = json.dumps({"chief": chief, "worker": workers}, sort_keys=True)
    return TfConfigJob(rank, len(ordered), host, port, cluster_id)
