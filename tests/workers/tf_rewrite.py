"""Rank worker for tests/tf/test_rewrite.py: tfring.rewrite on tf.compat.v1
graphs and on TF2 tf.function steps.

Each check trains a small model data-parallel (every rank takes its rows of
each global batch), and rank 0 then trains the same model in one process on
the full batches without tfring; the check reports rank 0's largest
difference from that reference and every rank's digest of its final
variables. Ranks initialize with different seeds, so matching the reference
also shows that rank 0's initial values were broadcast. Results go back as
{check: {"ok": bool, "error": str, ...}}.
"""

import os
import sys

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf
from common import checker, digest, report

import tfring
import tfring.rewrite  # binds tfring.rewrite if tfring does not expose it lazily

tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(2)

v1 = tf.compat.v1
tfring.init()
RANK, SIZE = tfring.rank(), tfring.size()
STEPS = 4
GLOBAL_BATCH = 8 * SIZE
N_FEATURES, N_IDS, EMB = 5, 12, 3
results = {}


def data(step):
    """Global batch `step`: features, embedding ids, targets."""
    rng = np.random.default_rng(100 + step)
    x = rng.normal(size=(GLOBAL_BATCH, N_FEATURES)).astype(np.float32)
    ids = rng.integers(0, N_IDS, GLOBAL_BATCH).astype(np.int32)
    y = rng.normal(size=(GLOBAL_BATCH, 1)).astype(np.float32)
    return x, ids, y


def shard(arrays, rank, size):
    n = GLOBAL_BATCH // size
    return [a[rank * n:(rank + 1) * n] for a in arrays]


check = checker(results)


def max_diff(a, b):
    return max(float(np.max(np.abs(np.asarray(x) - np.asarray(y))))
               for x, y in zip(a, b))


# ------------------------------------------------------- tf.compat.v1 ----

def v1_model(seed, towers=1, optimizer="two"):
    """Builds a graph: embedding (sparse gradients) + 2-layer MLP. Returns
    (graph, placeholders, train_op, variables, extras)."""
    g = tf.Graph()
    with g.as_default():
        v1.set_random_seed(seed)
        init = v1.random_normal_initializer(0.0, 0.5, seed=seed)
        x = v1.placeholder(tf.float32, [None, N_FEATURES], name="x")
        ids = v1.placeholder(tf.int32, [None], name="ids")
        y = v1.placeholder(tf.float32, [None, 1], name="y")
        emb = v1.get_variable("emb", [N_IDS, EMB], initializer=init)
        w1 = v1.get_variable("dense1/kernel", [N_FEATURES + EMB, 8], initializer=init)
        b1 = v1.get_variable("dense1/bias", [8], initializer=init)
        w2 = v1.get_variable("dense2/kernel", [8, 1], initializer=init)
        b2 = v1.get_variable("dense2/bias", [1], initializer=init)
        dense_vars = [w1, b1, w2, b2]

        def loss_of(xs, idss, ys):
            h = tf.concat([xs, tf.gather(emb, idss)], axis=1)
            h = tf.nn.tanh(tf.matmul(h, w1) + b1)
            return tf.reduce_mean(tf.square(tf.matmul(h, w2) + b2 - ys))

        extras = {}
        gs = v1.train.get_or_create_global_step()
        if optimizer == "two":
            # Two optimizers, both through minimize: Momentum on the dense
            # layers, Adagrad on the embedding (a sparse kernel).
            loss = loss_of(x, ids, y)
            t1 = v1.train.MomentumOptimizer(0.1, 0.9).minimize(
                loss, var_list=dense_vars, global_step=gs)
            t2 = v1.train.AdagradOptimizer(0.3).minimize(loss, var_list=[emb])
            train = tf.group(t1, t2)
            # Not training: a gradient norm summary from its own gradients.
            extras["norm"] = tf.linalg.global_norm(tf.gradients(loss, dense_vars))
            v1.summary.scalar("grad_norm", extras["norm"])
            expected = 5
        elif optimizer == "adam_towers":
            # In-graph towers: compute_gradients per tower, AddN, average,
            # apply_gradients with Adam (sparse updates by scatter).
            opt = v1.train.AdamOptimizer(0.05)
            xs, idss, ys = (tf.split(t, towers) for t in (x, ids, y))
            per_tower = []
            for k in range(towers):
                with tf.name_scope(f"tower_{k}"):
                    loss = loss_of(xs[k], idss[k], ys[k])
                    per_tower.append(opt.compute_gradients(
                        loss, var_list=dense_vars + [emb]))
            grads_and_vars = []
            for pairs in zip(*per_tower):
                grads = [gv[0] for gv in pairs]
                var = pairs[0][1]
                if isinstance(grads[0], tf.IndexedSlices):
                    g_avg = tf.IndexedSlices(
                        tf.concat([gr.values for gr in grads], 0) / towers,
                        tf.concat([gr.indices for gr in grads], 0),
                        grads[0].dense_shape)
                else:
                    g_avg = tf.add_n(grads) / towers
                grads_and_vars.append((g_avg, var))
            train = opt.apply_gradients(grads_and_vars, global_step=gs)
            expected = 5
        else:
            # Plain GradientDescent on everything (sparse by scatter_add).
            loss = loss_of(x, ids, y)
            train = v1.train.GradientDescentOptimizer(0.2).minimize(loss, global_step=gs)
            expected = 5
        variables = [emb] + dense_vars
        init_op = v1.global_variables_initializer()
    return g, (x, ids, y), train, variables, extras, expected, init_op


def v1_train(seed, rank, size, towers, optimizer, rewrite):
    g, (x, ids, y), train, variables, extras, _, init_op = v1_model(
        seed, towers, optimizer)
    out = {}
    if rewrite:
        with g.as_default():
            rep = tfring.rewrite()
            again = tfring.rewrite()  # idempotent
        out["report"] = {"count": rep.count, "dense": rep.dense_count,
                         "sparse": rep.sparse_count,
                         "allreduce_ops": len(rep.allreduce_ops),
                         "allgather_ops": len(rep.allgather_ops),
                         "broadcast": len(rep.broadcast_variables),
                         "again_count": again.count,
                         "again_already": again.already_rewritten,
                         "text": str(rep)}
        out["structure"] = graph_structure(g, extras)
    with v1.Session(graph=g) as sess:
        sess.run(init_op)
        for step in range(STEPS):
            xb, ib, yb = shard(data(step), rank, size)
            sess.run(train, {x: xb, ids: ib, y: yb})
        out["values"] = sess.run(variables)
    return out


def graph_structure(g, extras):
    """Which gradient tensors feed the optimizers' updates, and through what."""
    sinks = [op for op in g.get_operations()
             if op.type.startswith(("ResourceApply", "ResourceSparseApply",
                                    "ApplyAdam", "ResourceScatter"))
             and "update_" in op.name]
    fed_by_ring, fed_locally = [], []

    def ring_upstream(t, depth=0):
        if t.op.type.startswith("Ring"):
            return True
        if depth > 6:
            return False
        return any(ring_upstream(i, depth + 1) for i in t.op.inputs)

    for op in sinks:
        for arg, t in zip(op.op_def.input_arg, op.inputs):
            if arg.name in ("grad", "delta", "indices", "updates"):
                (fed_by_ring if ring_upstream(t) else fed_locally).append(
                    f"{op.name}:{arg.name}")
    ring_ops = [op for op in g.get_operations()
                if op.type in ("RingAllreduce", "RingGroupedAllreduce")]
    ring_inputs = [t.name for op in ring_ops for t in op.inputs]
    norm_local = True
    if "norm" in extras:
        norm_local = not ring_upstream(extras["norm"], -20)
    return {"sinks": len(sinks), "fed_by_ring": fed_by_ring,
            "fed_locally": fed_locally, "ring_inputs": ring_inputs,
            "ring_op_types": sorted({op.type for op in g.get_operations()
                                     if op.type.startswith("Ring")}),
            "norm_local": norm_local}


def v1_check(optimizer, towers, tol):
    dist = v1_train(seed=1 + RANK, rank=RANK, size=SIZE, towers=towers,
                    optimizer=optimizer, rewrite=True)
    out = {"report": dist["report"], "structure": dist["structure"],
           "digest": digest(dist["values"]), "tol": tol}
    if RANK == 0:
        ref = v1_train(seed=1, rank=0, size=1, towers=towers,
                       optimizer=optimizer, rewrite=False)
        out["max_diff"] = max_diff(dist["values"], ref["values"])
        out["moved"] = max_diff(dist["values"], v1_initial(optimizer, towers))
    return out


def v1_initial(optimizer, towers):
    g, _, _, variables, _, _, init_op = v1_model(1, towers, optimizer)
    with v1.Session(graph=g) as sess:
        sess.run(init_op)
        return sess.run(variables)


@check("v1_two_optimizers")
def _():
    return v1_check("two", 1, 1e-5)


@check("v1_adam_towers")
def _():
    return v1_check("adam_towers", 2, 1e-4)


@check("v1_gradient_descent")
def _():
    return v1_check("gd", 1, 1e-5)


@check("v1_restore_broadcast_op")
def _():
    # After a "restore" (here: assigning rank-specific values), running the
    # report's broadcast_op makes every rank hold rank 0's values.
    g, _, _, variables, _, _, init_op = v1_model(1, 1, "gd")
    with g.as_default():
        rep = tfring.rewrite()
        assigns = tf.group(*[v.assign(tf.fill(tf.shape(v), float(RANK + 7)))
                             for v in variables])
    with v1.Session(graph=g) as sess:
        sess.run(init_op)
        sess.run(assigns)
        sess.run(rep.broadcast_op)
        vals = sess.run(variables)
    return {"all_sevens": all(np.all(v == 7.0) for v in vals),
            "digest": digest(vals)}


# ------------------------------------------------------------------ TF2 ----

def keras_model(seed):
    import keras
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((N_FEATURES,))
    h = keras.layers.Dense(8, activation="tanh")(inputs)
    return keras.Model(inputs, keras.layers.Dense(1)(h))


def tf2_train(seed, rank, size, distributed, decorate_first):
    import keras
    model = keras_model(seed)
    opt = keras.optimizers.SGD(0.1, momentum=0.9)

    def step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x, training=True) - y))
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    if distributed and decorate_first:
        step = tf.function(tfring.rewrite(step))   # rewrite, then tf.function
    elif distributed:
        step = tfring.rewrite(tf.function(step))   # rewrite a tf.function
    else:
        step = tf.function(step)
    for s in range(STEPS):
        xb, _, yb = shard(data(s), rank, size)
        step(tf.constant(xb), tf.constant(yb))
    return [v.numpy() for v in model.trainable_variables]


@check("tf2_function")
def _():
    dist = tf2_train(1 + RANK, RANK, SIZE, True, False)
    out = {"digest": digest(dist), "tol": 1e-5}
    if RANK == 0:
        ref = tf2_train(1, 0, 1, False, False)
        out["max_diff"] = max_diff(dist, ref)
        out["moved"] = max_diff(dist, [v.numpy() for v in keras_model(1).trainable_variables])
    return out


@check("tf2_tape_manual_updates")
def _():
    # on="tape": a step that updates plain tf.Variables by hand.
    def train(rank, size, distributed, seed):
        rng = np.random.default_rng(seed)
        w = tf.Variable(rng.normal(size=(N_FEATURES, 1)).astype(np.float32))
        b = tf.Variable(np.zeros(1, np.float32))

        def step(x, y):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(x @ w + b - y))
            gw, gb = tape.gradient(loss, [w, b])
            w.assign_sub(0.1 * gw)
            b.assign_sub(0.1 * gb)

        step = tf.function(step)
        if distributed:
            step = tfring.rewrite(step, on="tape")
        for s in range(STEPS):
            xb, _, yb = shard(data(s), rank, size)
            step(tf.constant(xb), tf.constant(yb))
        return [w.numpy(), b.numpy()]

    dist = train(RANK, SIZE, True, 1 + RANK)
    out = {"digest": digest(dist), "tol": 1e-5}
    if RANK == 0:
        # Manual updates never reach an optimizer, so only the tape mode
        # reduces them; ranks started apart, so the broadcast is needed too.
        out["max_diff"] = max_diff(dist, train(0, 1, False, 1))
    return out


@check("tf2_decorator")
def _():
    dist = tf2_train(1 + RANK, RANK, SIZE, True, True)
    out = {"digest": digest(dist), "tol": 1e-5}
    if RANK == 0:
        out["max_diff"] = max_diff(dist, tf2_train(1, 0, 1, False, False))
    return out


report(results)
sys.stdout.flush()
