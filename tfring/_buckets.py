"""Gradient buckets: which gradients share one fused allreduce op.

Gradients are bucketed in the order backprop produces them (the last
layers' first). A bucket's op starts as soon as all of its gradients
exist, so smaller buckets go on the wire earlier and overlap more of the
remaining backprop, while each op still fuses many small tensors into one
ring pass. As in PyTorch DDP, the first bucket is small (its gradients are
the first ready, and nothing else can overlap the start of backprop) and
the others are capped well below a whole model; a tensor larger than its
bucket's cap forms a bucket of its own and so never waits for others.
"""

FIRST_BUCKET_BYTES = 1 << 20
BUCKET_BYTES = 25 << 20


def plan(sizes, limit, first=FIRST_BUCKET_BYTES, cap=BUCKET_BYTES):
    """Splits tensors of the given byte sizes (in backprop order; None for
    an unknown size, counted as 0) into consecutive runs; returns lists of
    indices. The first run holds at most min(first, limit) bytes, later ones
    min(cap, limit); a tensor larger than that is a run alone."""
    runs, run, run_bytes = [], [], 0
    for i, n in enumerate(sizes):
        n = n or 0
        bound = min(first if not runs else cap, limit)
        if run and run_bytes + n > bound:
            runs.append(run)
            run, run_bytes = [], 0
        run.append(i)
        run_bytes += n
        if not runs and run_bytes >= min(first, limit):
            runs.append(run)
            run, run_bytes = [], 0
    if run:
        runs.append(run)
    return runs
