import keras
import numpy as np
import tensorflow as tf

import tfring

tfring.init()  # rank and size come from tfring-run, mpirun or srun; alone: 1 rank

# Each rank reads its own shard of the data.
x = np.random.default_rng(0).normal(size=(1024, 8)).astype("float32")
y = x.sum(axis=1, keepdims=True)
data = tf.data.Dataset.from_tensor_slices((x, y)).shard(tfring.size(), tfring.rank())
data = data.shuffle(512, seed=tfring.rank()).batch(32).repeat(3)

model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, "relu"),
                          keras.layers.Dense(1)])
opt = keras.optimizers.Adam(0.01 * tfring.size())  # scale the rate with the ranks
# Every rank starts from rank 0's weights.
tfring.broadcast_variables(model.variables, root_rank=0)


@tf.function
def train_step(xb, yb):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(model(xb) - yb))
    tape = tfring.DistributedGradientTape(tape)  # averages gradients over ranks
    grads = tape.gradient(loss, model.trainable_variables)
    opt.apply_gradients(zip(grads, model.trainable_variables))
    return loss


for step, (xb, yb) in enumerate(data):
    loss = train_step(xb, yb)
    if step % 20 == 0 and tfring.rank() == 0:
        print(f"step {step}: loss {loss.numpy():.4f} on {tfring.size()} ranks")
