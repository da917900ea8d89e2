"""Float64 references and error bounds for allreduces on a 16-bit wire
(tests/core/test_wire16.py, tests/tf/test_wire16_op.py). Independent of the
core: numpy only.

Rounding to 16 bits. u is the unit roundoff: float16 2^-11, bfloat16 2^-8;
one rounding of x errs by at most u|x| (normal range).

Errors are normalised two ways: max |err| / max |ref| (the whole tensor's
scale) and the RMS error over the RMS of ref; both in units of u, so one
rounding of the exact float32 result reads <= 1.
"""

import numpy as np

U = {"float16": 2.0 ** -11, "bfloat16": 2.0 ** -8}
U32 = 2.0 ** -24
U24 = 2.0 ** -16  # the 24-bit words of Rabenseifner's tail steps


def narrow(x, wire):
    """float32 -> the 16-bit value (as float32), round to nearest even."""
    x = np.asarray(x, np.float32)
    if wire == "float16":
        with np.errstate(over="ignore"):
            return x.astype(np.float16).astype(np.float32)
    b = x.view(np.uint32).astype(np.uint64)
    r = ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint32) << 16
    return r.astype(np.uint32).view(np.float32)


def narrow24(x):
    """float32 -> its top 24 bits (15 fraction bits), round to nearest
    even, as float32: the words of Rabenseifner's tail steps."""
    b = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    r = ((b + 0x7F + ((b >> 8) & 1)) >> 8).astype(np.uint32) << 8
    return r.astype(np.uint32).view(np.float32)


def segments(count, n):
    """The ring's segments (collectives::evenSplit): n+1 offsets."""
    base, extra = divmod(count, n)
    off = [0]
    for i in range(n):
        off.append(off[-1] + base + (1 if i < extra else 0))
    return off


def chain_orders(count, n):
    """For every element, the order in which the ring adds the ranks'
    contributions (ring positions are ranks on one host): segment j starts
    at rank j and ends at rank j-1, its owner. Returns an (n, count) array
    of rank indices."""
    off = segments(count, n)
    order = np.empty((n, count), np.int64)
    for j in range(n):
        order[:, off[j]:off[j + 1]] = ((j + np.arange(n)) % n)[:, None]
    return order


def in_order(xs, order):
    """xs (n, count) rearranged so that row k is the k-th contribution."""
    return np.take_along_axis(xs, order, axis=0)


def ring_wire_sum(xs, wire, scale=1.0):
    """The in-ring scheme, emulated: every hop widens the received partial,
    adds its own float32 (scaled) input in float32 and narrows; the owner
    completes in float32 and narrows once more."""
    n = xs.shape[0]
    c = in_order(xs, chain_orders(xs.shape[1], n))
    s = np.float32(scale)
    p = narrow(c[0] * s if scale != 1.0 else c[0], wire)
    for k in range(1, n):
        add = c[k] * s if scale != 1.0 else c[k]
        p = (p + add).astype(np.float32)
        p = narrow(p, wire)
    return p


def ring_cast_sum(xs, wire):
    """Cast-then-sum (Horovod's FP16Compressor around a 16-bit ring): every
    input rounded to 16 bits, every hop's sum rounded to 16 bits."""
    n = xs.shape[0]
    c = in_order(xs, chain_orders(xs.shape[1], n))
    p = narrow(c[0], wire)
    for k in range(1, n):
        p = narrow(p + narrow(c[k], wire), wire)
    return p


def ring_bound(xs, wire, scale=1.0):
    """Per element, a first-order bound on the in-ring scheme's error: the
    N-1 partials sent are each rounded once to 16 bits (u |P_k|) after a
    float32 add (U32 |P_k|), and the final sum once more (u |S|). P_k are
    the float64 partials in chain order; the 1.01 covers the second-order
    terms (N u^2 << 0.01)."""
    n = xs.shape[0]
    c = in_order(xs.astype(np.float64) * scale, chain_orders(xs.shape[1], n))
    partials = np.abs(np.cumsum(c, axis=0))
    u = U[wire]
    return 1.01 * ((u + U32) * partials[:-1].sum(axis=0) + (u + U32) * partials[-1])


def tree_layout(n):
    """collectives' recursive layout: p the largest power of two <= n,
    r = n - p; virtual rank v is rank 2v+1 for v < r (it folds in the extra
    rank 2v) and rank v + r above. Returns (p, r, real rank of each v)."""
    p = 1 << (n.bit_length() - 1)
    r = n - p
    return p, r, [2 * v + 1 if v < r else v + r for v in range(p)]


def wire_tail_steps(p):
    """How many of the last reduce-scatter steps send 24-bit words on a
    16-bit wire (collectives::wireTailSteps): the most t with
    2^t - 1 <= (p-1)/4 (extra bytes at most 1/16 of the 16-bit ones)."""
    t = 0
    while (2 << t) - 1 <= (p - 1) / 4 and (2 << t) <= p:
        t += 1
    return t


def tree_wire_sum(xs, wire):
    """Rabenseifner's allreduce on a 16-bit wire, emulated (a sum, no
    scale): the fold adds the extra rank's narrowed input in float32; at
    reduce-scatter step s (mask p/2^(s+1)) every virtual rank adds its
    partner's partial of the half it keeps, narrowed to 16 bits, or to 24
    in the last wire_tail_steps(p) steps; the owner narrows its block
    once."""
    n, count = xs.shape
    p, r, real = tree_layout(n)
    bufs = [xs[real[v]].astype(np.float32).copy() for v in range(p)]
    for v in range(r):
        bufs[v] = (bufs[v] + narrow(xs[2 * v], wire)).astype(np.float32)
    blk = segments(count, p)
    steps = p.bit_length() - 1
    tail = wire_tail_steps(p)
    lo, hi = [0] * p, [p] * p
    for s in range(steps):
        mask = p >> (s + 1)
        new = []
        for v in range(p):
            mid = lo[v] + mask
            klo, khi = (mid, hi[v]) if v & mask else (lo[v], mid)
            a, b = blk[klo], blk[khi]
            theirs = bufs[v ^ mask][a:b]
            theirs = narrow(theirs, wire) if s < steps - tail else narrow24(theirs)
            mine = bufs[v].copy()
            mine[a:b] = (mine[a:b] + theirs).astype(np.float32)
            new.append((mine, klo, khi))
        for v, (mine, klo, khi) in enumerate(new):
            bufs[v], lo[v], hi[v] = mine, klo, khi
    out = np.empty(count, np.float32)
    for v in range(p):
        out[blk[v]:blk[v + 1]] = narrow(bufs[v][blk[v]:blk[v + 1]], wire)
    return out


def tree_bytes_sent(n, count, wire_rank):
    """Bytes rank `wire_rank` sends in tree_wire_sum's allreduce (2-byte
    words, 3-byte ones in the tail steps)."""
    p, r, real = tree_layout(n)
    if wire_rank < 2 * r and wire_rank % 2 == 0:
        return 2 * count  # an extra rank: its input, in words
    v = real.index(wire_rank)
    blk = segments(count, p)
    steps = p.bit_length() - 1
    tail = wire_tail_steps(p)
    sent = 2 * count if v < r else 0  # the result back to the extra rank
    lo, hi = 0, p
    for s in range(steps):
        mask = p >> (s + 1)
        mid = lo + mask
        (glo, ghi), (lo, hi) = ((lo, mid), (mid, hi)) if v & mask else ((mid, hi), (lo, mid))
        sent += (blk[ghi] - blk[glo]) * (3 if s >= steps - tail else 2)
    mask = 1
    while mask < p:
        mine = v & ~(mask - 1)
        sent += 2 * (blk[mine + mask] - blk[mine])
        mask <<= 1
    return sent


def tree_bound(xs, wire, scale=1.0):
    """The same bound for Rabenseifner's recursive halving on a 16-bit wire
    (tree_wire_sum): the fold rounds each extra rank's input once; at the
    step with mask m, virtual ranks v and v^m combine their partials over
    the virtual ranks congruent to them modulo 2m, and one of the two is
    rounded to 16 bits (both are counted here), or to 24 in the tail steps;
    then the final sum is rounded once."""
    n = xs.shape[0]
    p, r, real = tree_layout(n)
    x64 = xs.astype(np.float64) * scale
    u = U[wire]
    total = (u + U32) * sum(np.abs(x64[2 * v]) for v in range(r)) if r else 0.0
    x = np.stack([x64[real[v]] + (x64[2 * v] if v < r else 0.0) for v in range(p)])
    steps = p.bit_length() - 1
    tail = wire_tail_steps(p)
    for s in range(steps):
        mod = p >> s
        step_u = (U24 if s >= steps - tail else u) + U32
        for c in range(mod):
            total = total + step_u * np.abs(x[c::mod].sum(axis=0))
    total = total + (u + U32) * np.abs(x.sum(axis=0))
    return 1.01 * total


def errors(got, ref, wire):
    """(max |err| / max |ref|, rms err / rms ref), in units of u."""
    got = np.asarray(got, np.float64)
    err = got - ref
    u = U[wire]
    return (float(np.abs(err).max() / np.abs(ref).max() / u),
            float(np.sqrt(np.mean(err ** 2)) / np.sqrt(np.mean(ref ** 2)) / u))
