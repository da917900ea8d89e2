"""PowerSGD's arithmetic on one gradient matrix, as TensorFlow ops: which
matrices are worth compressing, Gram-Schmidt orthogonalization, and the
random starting Q every rank draws alike."""

import numpy as np
import tensorflow as tf


def matrix_shape(shape):
    """(n, m) of a gradient viewed as a matrix: its first dimension by the
    product of the others; None for rank < 2 or a shape not fully known."""
    if shape.rank is None or shape.rank < 2 or not shape.is_fully_defined():
        return None
    dims = shape.as_list()
    return int(dims[0]), int(np.prod(dims[1:], dtype=np.int64))


def should_compress(shape, rank, min_compression_rate):
    """A matrix is compressed when its n * m words exceed
    min_compression_rate times the (n + m) * r words of its P and Q."""
    nm = matrix_shape(tf.TensorShape(shape))
    if nm is None:
        return False
    n, m = nm
    r = min(n, m, rank)
    return (n + m) * r * min_compression_rate < n * m


def orthogonalize(matrix, epsilon):
    """Gram-Schmidt on the columns of an (n, r) matrix: column i is divided
    by (its norm + epsilon), then its projection is removed from the
    columns after it. With epsilon 0 this is the Q of a QR decomposition
    (up to the columns' signs, which P Q^T does not see)."""
    r = int(matrix.shape[1])
    cols = []
    rest = matrix
    for i in range(r):
        col = rest[:, :1]
        col = col / (tf.norm(col) + tf.cast(epsilon, matrix.dtype))
        cols.append(col)
        rest = rest[:, 1:]
        if i + 1 < r:
            rest = rest - tf.reduce_sum(col * rest, axis=0, keepdims=True) * col
    return tf.concat(cols, axis=1) if r > 1 else cols[0]


def random_q(m, r, seed, index, step, dtype):
    """The fresh Q (m, r) of the gradient at `index` at `step`: standard
    normal, from a stateless generator every rank seeds alike."""
    seed_pair = tf.stack([tf.constant(seed * 65536 + index, tf.int64),
                          tf.cast(step, tf.int64)])
    return tf.random.stateless_normal([m, r], seed=seed_pair, dtype=dtype)
