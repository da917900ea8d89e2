"""Process sets written the way Horovod's process-set documentation writes
them: static sets given to init(), collectives on a set, and a set added
and removed while the job runs. Moving it from Horovod to tfring changes
the import line only:

    import horovod.tensorflow as hvd     # before
    import tfring as hvd                 # after

Run it with `tfring-run -np 4 python examples/horovod_style_process_sets.py`
(any number of ranks from 2). Each rank prints one JSON line with what it
computed, so a test can check it against numpy.
"""

import json

import numpy as np
import tensorflow as tf

import tfring as hvd


def rank_tensor(rank):
    return tf.constant(np.arange(6, dtype=np.float32) + 10.0 * rank)


def main():
    # Horovod: the sets every rank creates at init, in the same order.
    size_hint = int(__import__("os").environ.get("TFRING_SIZE", "1"))
    even_set = hvd.ProcessSet(list(range(0, size_hint, 2)))
    odd_set = hvd.ProcessSet(list(range(1, size_hint, 2)))
    hvd.init(process_sets=[even_set, odd_set])

    # Horovod: each rank reduces over the set it belongs to.
    tensor = rank_tensor(hvd.rank())
    if even_set.included():
        result = hvd.allreduce(tensor, process_set=even_set, op=hvd.Sum)
    else:
        result = hvd.allreduce(tensor, process_set=odd_set, op=hvd.Sum)

    # A collective of the whole job still works beside the sets.
    gathered = hvd.allgather(tf.reshape(tensor[:2], [1, 2]))

    # Horovod: a set added while the job runs (collective on every rank),
    # used, then removed. (With 2 ranks it would repeat the global set,
    # which Horovod, like tfring, refuses.)
    bcast = None
    if hvd.size() > 2:
        ends = hvd.add_process_set([0, hvd.size() - 1])
        if ends.included():
            bcast = hvd.broadcast(tensor, root_rank=hvd.size() - 1,
                                  process_set=ends)
        hvd.remove_process_set(ends)

    print(json.dumps({
        "rank": hvd.rank(),
        "set_ranks": even_set.ranks if even_set.included() else odd_set.ranks,
        "set_rank": (even_set if even_set.included() else odd_set).rank(),
        "allreduce": result.numpy().tolist(),
        "allgather": gathered.numpy().tolist(),
        "broadcast": None if bcast is None else bcast.numpy().tolist(),
    }), flush=True)


if __name__ == '__main__':
    main()
