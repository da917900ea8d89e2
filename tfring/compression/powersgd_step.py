"""One PowerSGD reduction of a training step's gradients (the algorithm is
described in tfring/compression/powersgd.py).

The gradients split three ways: sparse ones (tf.IndexedSlices, unless
sparse_as_dense) are allgathered uncompressed as tfring.allreduce does;
dense ones too small to gain (or of rank < 2) form the uncompressed batch,
one grouped allreduce; the rest are the candidates. During warm-up the
candidates are allreduced as they are; after it they are compressed. The
choice is a tf.cond on the reduction's step counter, so one traced graph
holds both and every rank takes the same branch (they count the same
steps); eagerly the branch is chosen in Python. The counter advances once
the step's results exist. The Python here builds the ops as written:
autograph leaves it unconverted.
"""

import tensorflow as tf

from tfring import _collectives, basics
from tfring import ops as _ops
from tfring.compression import powersgd_math as _math


def _key(variables, i):
    """The state key of the gradient at position i: its variable's identity
    (a Keras 3 variable by the tf.Variable it holds) or name, else (no
    variable, or a watched tensor, new every step) the position."""
    v = None if variables is None else variables[i]
    if isinstance(v, str):
        return ("name", v, v)
    if v is None or not hasattr(v, "assign"):
        return ("position", i, f"gradient {i}")
    inner = getattr(v, "_value", None)
    base = v if inner is None else inner
    label = getattr(v, "path", None) or getattr(v, "name", None) or f"gradient {i}"
    return ("variable", id(base), str(label))


def _set_size(process_set):
    if process_set is None:
        return basics.size()
    size = getattr(process_set, "size")
    return int(size() if callable(size) else size)


def _with_step_advanced(group, results):
    """The results, passed on after the group's step counter advanced
    (which itself waits for them): in a tf.compat.v1 graph, running what
    consumes the results runs the increment."""
    deps = []
    for r in results:
        if r is None:
            continue
        deps.append(r.values if isinstance(r, tf.IndexedSlices) else r)
    with tf.control_dependencies(deps):
        advanced = group.step.assign_add(1)
    if tf.executing_eagerly():
        return results
    out = []
    with tf.control_dependencies([advanced]):
        for r in results:
            if r is None:
                out.append(None)
            elif isinstance(r, tf.IndexedSlices):
                out.append(tf.IndexedSlices(tf.identity(r.values),
                                            tf.identity(r.indices),
                                            r.dense_shape))
            else:
                out.append(tf.identity(r))
    return out


def _compress(c, group, cands, slots, step, factor, name, kw):
    """The compressed branch: P and Q of every candidate in two grouped
    allreduces; returns each candidate's estimate in its own dtype."""
    ms = []
    for (_, g, n, m, ct), slot in zip(cands, slots):
        mat = tf.reshape(tf.cast(g, ct), [n, m])
        if slot.error is not None:
            mat = mat + slot.error.read_value()
        ms.append(mat)
    ready = group.q_ready.read_value() if c.warm_start else None
    qs = []
    for (i, _, _, m, ct), slot in zip(cands, slots):
        q = _math.random_q(m, slot.rank, c.seed, i, step, ct)
        if ready is not None:
            q = tf.where(ready, slot.q.read_value(), q)
        qs.append(_math.orthogonalize(q, c.epsilon))
    ps = [tf.matmul(mat, q) for mat, q in zip(ms, qs)]
    ps = _ops.grouped_allreduce(ps, "sum", name=f"{name}.P", **kw)
    ps = [_math.orthogonalize(p, c.epsilon) for p in ps]
    qs = [tf.matmul(mat, p, transpose_a=True) for mat, p in zip(ms, ps)]
    qs = _ops.grouped_allreduce(qs, "average", name=f"{name}.Q", **kw)
    approx = [tf.matmul(p, q, transpose_b=True) for p, q in zip(ps, qs)]
    updates = []
    for slot, mat, a, q in zip(slots, ms, approx, qs):
        if slot.error is not None:
            updates.append(slot.error.assign(mat - a))
        if c.warm_start:
            updates.append(slot.q.assign(q))
    if c.warm_start:
        with tf.control_dependencies(updates):
            updates.append(group.q_ready.assign(True))
    out = []
    with tf.control_dependencies(updates):
        for (_, g, _, _, _), a in zip(cands, approx):
            if factor != 1.0:
                a = a * tf.cast(factor, a.dtype)
            out.append(tf.cast(tf.reshape(a, tf.shape(g)), g.dtype))
    return out


@tf.autograph.experimental.do_not_convert
def reduce_step(c, grads, variables=None, op="average", prescale_factor=1.0,
                postscale_factor=1.0, process_set=None, sparse_as_dense=False,
                name="powersgd"):
    """Reduces a training step's gradients (None entries stay None) with
    the PowerSGD compressor `c`; returns the list of results. `variables`
    (tf or Keras variables, or names) key the state; without them it is
    keyed by position. op is "average" or "sum"; the scale factors multiply
    the result as they would a plain allreduce's."""
    op = _collectives.reduce_op_name(op)
    if op not in ("sum", "average"):
        raise ValueError(f"tfring: PowerSGD approximates the average (or the "
                         f"sum) of the gradients over ranks; op={op} cannot "
                         f"be compressed")
    grads = list(grads)
    if variables is not None:
        variables = list(variables)
        if len(variables) != len(grads):
            raise ValueError(f"tfring: {len(grads)} gradients for "
                             f"{len(variables)} variables")
    keys = [_key(variables, i) for i in range(len(grads))]
    sparse, plain, cands = [], [], []
    for i, g in enumerate(grads):
        if g is None:
            continue
        if isinstance(g, tf.IndexedSlices):
            c.compute_dtype(g.values, keys[i][-1])
            if not sparse_as_dense:
                sparse.append((i, g))
                continue
            g = tf.convert_to_tensor(g)
        g = tf.convert_to_tensor(g)
        ct = c.compute_dtype(g, keys[i][-1])
        nm = _math.matrix_shape(g.shape)
        if nm is not None and c.should_compress(g.shape):
            cands.append((i, g, nm[0], nm[1], ct))
        else:
            plain.append((i, g))
    present = tuple(keys[i] for i, g in enumerate(grads) if g is not None)
    if not present:
        return [None] * len(grads)
    group = c._group(present)
    slots = [c._slot(keys[i], n, m, ct) for i, _, n, m, ct in cands]
    kw = {} if process_set is None else {"process_set": process_set}
    scales = {"prescale_factor": prescale_factor,
              "postscale_factor": postscale_factor}
    factor = float(prescale_factor) * float(postscale_factor)
    if op == "sum":
        factor *= _set_size(process_set)
    out = [None] * len(grads)
    # Sparse and uncompressed gradients: allreduced as they are, every step.
    uncompressed = sparse + plain
    if uncompressed:
        reduced = _ops.grouped_allreduce(
            [g for _, g in uncompressed], op, name=f"{name}.uncompressed",
            **scales, **kw)
        for (i, _), r in zip(uncompressed, reduced):
            out[i] = r
    if cands:
        step = group.step.read_value()

        def warm_up():
            return _ops.grouped_allreduce([g for _, g, _, _, _ in cands], op,
                                          name=f"{name}.warm_up", **scales,
                                          **kw)

        def compressed():
            return _compress(c, group, cands, slots, step, factor, name, kw)

        if c.start_iter == 0:
            reduced = compressed()
        elif tf.executing_eagerly():
            reduced = warm_up() if int(step) < c.start_iter else compressed()
        else:
            reduced = tf.cond(step < c.start_iter, warm_up, compressed)
        for (i, _, _, _, _), r in zip(cands, reduced):
            out[i] = r
    return _with_step_advanced(group, out)
