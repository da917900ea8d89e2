"""Prints, as JSON, the ring ops DistributedGradientTape builds in a
tf.function step: three dense layers of 1.44 MB weights under a small head.
Building the graph needs no other rank."""

import json

import tensorflow as tf

import tfring

ws = [tf.Variable(tf.ones([600, 600])) for _ in range(3)]
head = tf.Variable(tf.ones([600, 10]))


@tf.function
def step(x):
    with tf.GradientTape() as tape:
        h = x
        for w in ws:
            h = tf.nn.relu(h @ w)
        loss = tf.reduce_sum(h @ head)
    tape = tfring.DistributedGradientTape(tape)
    return tape.gradient(loss, ws + [head])


graph = step.get_concrete_function(tf.TensorSpec([4, 600])).graph
print(json.dumps([{"type": op.type, "shapes": [t.shape.as_list() for t in op.inputs]}
                  for op in graph.get_operations() if op.type.startswith("Ring")]))
