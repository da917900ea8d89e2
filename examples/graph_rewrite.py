"""tf.compat.v1 graph-mode training made data-parallel by one call.

    tfring-run -np 2 python examples/graph_rewrite.py

A click-through-rate style model: an embedding of categorical ids (sparse
gradients) next to dense features, a small MLP, logistic loss, Adam through
minimize() and a global step, trained with a plain tf.compat.v1.Session.
The tfring lines: init, rank-dependent data, and

    report = tfring.rewrite()

after the graph is built: every gradient the optimizer applies now goes
through RingAllreduce (dense, fused) or RingAllgather (sparse), and the
variable initializer starts every rank from rank 0's weights.
"""

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf

import tfring

v1 = tf.compat.v1


def synthetic_batch(rng, batch, n_ids, n_dense, true_w, true_emb):
    ids = rng.integers(0, n_ids, batch).astype(np.int32)
    dense = rng.normal(size=(batch, n_dense)).astype(np.float32)
    logit = dense @ true_w + true_emb[ids]
    labels = (rng.random(batch) < 1 / (1 + np.exp(-logit))).astype(np.float32)
    return ids, dense, labels[:, None]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch-size", type=int, default=256, help="per rank")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--ids", type=int, default=1000)
    p.add_argument("--log-every", type=int, default=50)
    args = p.parse_args()

    tfring.init()
    rank, size = tfring.rank(), tfring.size()
    problem = np.random.default_rng(0)  # the same task on every rank
    n_dense = 16
    true_w = problem.normal(size=n_dense)
    true_emb = problem.normal(size=args.ids)
    data = np.random.default_rng(1 + rank)  # different examples per rank

    v1.disable_eager_execution()
    ids = v1.placeholder(tf.int32, [None], name="ids")
    dense = v1.placeholder(tf.float32, [None, n_dense], name="dense")
    labels = v1.placeholder(tf.float32, [None, 1], name="labels")
    init = v1.glorot_uniform_initializer(seed=rank)  # differs per rank
    emb = v1.get_variable("embedding", [args.ids, 8], initializer=init)
    w1 = v1.get_variable("hidden/kernel", [8 + n_dense, 64], initializer=init)
    b1 = v1.get_variable("hidden/bias", [64], initializer=v1.zeros_initializer())
    w2 = v1.get_variable("logit/kernel", [64, 1], initializer=init)
    b2 = v1.get_variable("logit/bias", [1], initializer=v1.zeros_initializer())
    h = tf.concat([tf.gather(emb, ids), dense], axis=1)
    h = tf.nn.relu(tf.matmul(h, w1) + b1)
    logits = tf.matmul(h, w2) + b2
    loss = tf.reduce_mean(
        tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))
    accuracy = tf.reduce_mean(
        tf.cast(tf.equal(tf.cast(logits > 0, tf.float32), labels), tf.float32))
    global_step = v1.train.get_or_create_global_step()
    train_op = v1.train.AdamOptimizer(args.lr * size).minimize(
        loss, global_step=global_step)

    report = tfring.rewrite()          # <- the one added line
    if rank == 0:
        print(report, flush=True)

    # Same check on every rank: the sum of all weights, averaged over ranks.
    weight_sum = tf.add_n([tf.reduce_sum(v) for v in v1.trainable_variables()])
    with v1.Session() as sess:
        sess.run(v1.global_variables_initializer())  # also broadcasts
        for step in range(1, args.steps + 1):
            feed = dict(zip((ids, dense, labels), synthetic_batch(
                data, args.batch_size, args.ids, n_dense, true_w, true_emb)))
            _, l, a = sess.run([train_op, loss, accuracy], feed)
            if rank == 0 and (step % args.log_every == 0 or step == 1):
                print(f"step {step:4d}  loss {l:.4f}  accuracy {a:.3f}", flush=True)
        mine = sess.run(weight_sum)
        gs = sess.run(global_step)
    from tfring import _core

    agreed = _core.allreduce(np.array([mine], np.float64), op="max",
                             name="check.weights")[0] == mine
    agreed = bool(_core.allreduce(np.array([int(agreed)], np.int32),
                                  op="min", name="check.all")[0])
    if rank == 0:
        print(f"done: {gs} steps on {size} ranks, {report.count} gradients "
              f"rewritten, weights identical on every rank: {agreed}")


if __name__ == "__main__":
    main()
