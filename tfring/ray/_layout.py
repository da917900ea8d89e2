"""Ranks of a job whose processes Ray placed: which actor gets which rank,
and each rank's place among its node's ranks.

A rank's *host* here is its Ray node id (RayExecutor) or its node's address
(Ray Train, whose own local ranks count workers by node address). The ranks
also get it as TFRING_HOSTNAME, so tfring's core groups ranks exactly as this
module does (under RayExecutor two simulated Ray nodes on one machine are two
hosts to tfring too, joined over TCP).
"""

from tfring.run.launcher import RankSpec


def order_by_node(node_ids):
    """The rank order of actors that Ray placed on ``node_ids`` (one per
    actor, in creation order): nodes in the order they first appear, the
    actors of one node in creation order. ``order[r]`` is the index of the
    actor that gets rank r, so every node's ranks are consecutive."""
    first_seen = {}
    for i, node in enumerate(node_ids):
        first_seen.setdefault(node, i)
    return sorted(range(len(node_ids)), key=lambda i: (first_seen[node_ids[i]], i))


def layout(node_ids):
    """The RankSpec of every rank, ``node_ids[r]`` being rank r's node.

    ``local_rank`` is r's index among the ranks of its node, ``local_size``
    their count; ``cross_rank``/``cross_size`` follow Horovod: among the nodes
    that have a rank with this local_rank (in the order the nodes first
    appear), the index of r's node and their count. Any order of node ids is
    accepted (a Ray Train worker group's world ranks are Ray's to choose);
    ``order_by_node`` makes them consecutive."""
    nodes = []
    ranks_of = {}
    for r, node in enumerate(node_ids):
        if node not in ranks_of:
            nodes.append(node)
            ranks_of[node] = []
        ranks_of[node].append(r)
    specs = []
    for r, node in enumerate(node_ids):
        local_rank = ranks_of[node].index(r)
        peers = [n for n in nodes if len(ranks_of[n]) > local_rank]
        specs.append(RankSpec(rank=r, size=len(node_ids), local_rank=local_rank,
                              local_size=len(ranks_of[node]),
                              cross_rank=peers.index(node), cross_size=len(peers),
                              host=node, local=False))
    return specs


def forwarded_env(environ):
    """The driver's tfring tunables (TFRING_*, and HOROVOD_* ones, which the
    ranks read as their TFRING_* equivalents) that every rank gets, as
    tfring-run forwards them to remote ranks: never the variables that place
    one rank, nor the elastic driver's."""
    from tfring._horovod_env import LAUNCHER_SET
    from tfring.run.common import RANK_VARS

    return {k: v for k, v in environ.items()
            if (k.startswith("TFRING_") and k not in RANK_VARS
                and not k.startswith("TFRING_ELASTIC"))
            or (k.startswith("HOROVOD_") and k not in LAUNCHER_SET)}


def rank_envs(infos, store_addr, secret, common, host_key="node_id"):
    """The environment of every rank: ``infos[r]`` is rank r's node_info()
    (tfring/ray/_worker.py), ``common`` what every rank gets first.
    ``host_key`` names what tells hosts apart: the Ray node id (RayExecutor,
    as Horovod), or the node's address ("ip", as Ray Train counts local
    ranks; Ray nodes that share an address are one host then).

    Beyond tfring-run's variables: TFRING_HOSTNAME is that host key; a job
    on several nodes binds each rank to the address Ray reaches its node at
    (TFRING_IFACE_ADDR), unless ``common`` pins an interface; the ranks of a
    node that hold GPUs all see that node's GPUs, listed in local-rank order
    (the GPU of local rank i is device i), so CUDA IPC can join them."""
    from tfring.run.launcher import horovod_rank_env, rank_env

    specs = layout([info[host_key] for info in infos])
    multi_node = len({s.host for s in specs}) > 1
    pinned = common.get("TFRING_IFACE") or common.get("TFRING_IFACE_ADDR")
    gpus_of = {}
    for spec, info in zip(specs, infos):
        gpus_of.setdefault(spec.host, []).extend(info["gpu_ids"])
    envs = []
    for spec, info in zip(specs, infos):
        env = dict(common)
        env.update(rank_env(spec, store_addr, secret))
        env.update(horovod_rank_env(spec))
        if multi_node and not pinned:
            env["TFRING_IFACE_ADDR"] = info["ip"]
        if gpus_of[spec.host]:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus_of[spec.host])
        envs.append(env)
    return specs, envs


def machine_slots(infos):
    """(index, count) of every rank among the ranks on its machine
    (``infos[r]["machine"]``, which two Ray nodes on one machine share):
    the slice of the machine's cores rank r is bound to."""
    ranks_of = {}
    for r, info in enumerate(infos):
        ranks_of.setdefault(info["machine"], []).append(r)
    return [(ranks_of[info["machine"]].index(r), len(ranks_of[info["machine"]]))
            for r, info in enumerate(infos)]
