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


def narrow(x, wire):
    """float32 -> the 16-bit value (as float32), round to nearest even."""
    x = np.asarray(x, np.float32)
    if wire == "float16":
        with np.errstate(over="ignore"):
            return x.astype(np.float16).astype(np.float32)
    b = x.view(np.uint32).astype(np.uint64)
    r = ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint32) << 16
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


def tree_bound(xs, wire, scale=1.0):
    """The same bound for Rabenseifner's recursive halving over n ranks, n
    a power of two: at the step with mask m, ranks v and v^m combine their
    partials over the ranks congruent to them modulo 2m, and one of the
    two is rounded to 16 bits (both are counted here); then the final sum
    is rounded once."""
    n = xs.shape[0]
    x = xs.astype(np.float64) * scale
    u = U[wire]
    total = np.zeros(xs.shape[1])
    mod = n
    while mod >= 2:
        for c in range(mod):
            total += np.abs(x[c::mod].sum(axis=0))
        mod //= 2
    total += np.abs(x.sum(axis=0))
    return 1.01 * (u + U32) * total


def errors(got, ref, wire):
    """(max |err| / max |ref|, rms err / rms ref), in units of u."""
    got = np.asarray(got, np.float64)
    err = got - ref
    u = U[wire]
    return (float(np.abs(err).max() / np.abs(ref).max() / u),
            float(np.sqrt(np.mean(err ** 2)) / np.sqrt(np.mean(ref ** 2)) / u))
