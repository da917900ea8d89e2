"""A rank's reader batches as a tf.data.Dataset, at a low CPU cost a batch.

Python hands tf.data up to 16 batches (about 8 MiB) at a time, one group
of leaves shaped (k, batch, ...), which ``from_tensor_slices`` cuts into
its batches again: one Python call a batch would cost about 0.6 ms of CPU
for 256 rows of 256 floats.

What keeps the rest cheap is memory TensorFlow need not copy. It takes a
C-contiguous numpy array at a 64-byte aligned address as a tensor without
copying it (holding a reference to the array), and a slice of such a
tensor along its first axis shares its memory; any other array it copies
into a buffer of its own, freshly mapped, so every 4 KiB page costs a page
fault, which together cost more than the copy. The elements are therefore
written into aligned buffers from a small pool (``AlignedPool``), reused
once nothing holds them any more. Measured on 256 x 256 float32 batches:
about 0.2 ms of CPU a batch against 1.4 ms for ``unbatch`` of unaligned
arrays.
"""

import sys

import numpy as np

_ALIGN = 64  # TensorFlow's EIGEN_MAX_ALIGN_BYTES
_GROUP_BYTES = 8 << 20
_GROUP_MAX = 16


class AlignedPool:
    """64-byte aligned numpy buffers, each reused once no array other than
    the pool's own refers to it: the tensors TensorFlow made of an element
    hold the element's arrays, whose memory is the buffer's, until they are
    freed. At most ``keep`` buffers of one size are kept; past that a
    buffer is made for the one element."""

    def __init__(self, keep=8):
        self.keep = int(keep)
        self._raw = {}  # bytes -> [uint8 arrays]

    def take(self, shape, dtype):
        """An uninitialized aligned array of ``shape`` and ``dtype``."""
        dtype = np.dtype(dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        mine = self._raw.setdefault(nbytes, [])
        raw = None
        for candidate in mine:
            # References: this list, the loop variable, getrefcount's
            # argument. Any view of the buffer adds one.
            if sys.getrefcount(candidate) == 3:
                raw = candidate
                break
        if raw is None:
            raw = np.empty(nbytes + _ALIGN, np.uint8)
            if len(mine) < self.keep:
                mine.append(raw)
        start = -raw.ctypes.data % _ALIGN
        return raw[start:start + nbytes].view(dtype).reshape(shape)


def _group(batches, to_element, pool):
    """k reader batches as one element of aligned leaves shaped (k, batch,
    ...), each batch's leaves copied once, into buffers from ``pool``."""
    import tensorflow as tf

    k = len(batches)
    structure = to_element(batches[0])
    first = tf.nest.flatten(structure)
    leaves = [pool.take((k,) + a.shape, a.dtype) for a in first]
    for out, a in zip(leaves, first):
        out[0] = a
    for i in range(1, k):
        for out, a in zip(leaves, tf.nest.flatten(to_element(batches[i]))):
            out[i] = a
    return tf.nest.pack_sequence_as(structure, leaves)


class _Feed:
    """The elements of one ShardReader for a tf.data map: element(i) is the
    i-th group of the current epoch's batches; i == 0 starts the next
    epoch (Keras iterates the dataset afresh each epoch when its
    cardinality equals steps_per_epoch)."""

    def __init__(self, reader, steps, first_epoch, to_element, group, end_epoch, specs):
        self.reader, self.steps, self.to_element = reader, int(steps), to_element
        self.group, self.end_epoch, self.specs = group, end_epoch, specs
        self.next_epoch = int(first_epoch)
        self.pool = AlignedPool()
        self._groups = None

    def _epoch(self, epoch):
        pending = []
        for batch in self.reader.batches(epoch, self.steps):
            pending.append(batch)
            if len(pending) == self.group:
                element, pending = _group(pending, self.to_element, self.pool), []
                yield element
                del element  # so that the pool sees the buffers free
        if pending:
            yield _group(pending, self.to_element, self.pool)

    def element(self, i):
        import tensorflow as tf

        if int(i) == 0:
            epoch, self.next_epoch = self.next_epoch, self.next_epoch + 1
            done = self.end_epoch is not None and epoch >= self.end_epoch
            self._groups = None if done else self._epoch(epoch)
        if self._groups is None:  # past end_epoch: empty groups, no batch
            return [np.empty((0, *s.shape), s.dtype.as_numpy_dtype) for s in self.specs]
        return tf.nest.flatten(next(self._groups))


def tf_dataset(reader, steps, first_epoch, to_element, output_signature, end_epoch=None,
               prefetch=0):
    """A tf.data.Dataset of ``steps`` elements per iteration: the n-th time
    it is iterated (Keras iterates it afresh each epoch when its
    cardinality equals steps_per_epoch) it yields epoch first_epoch + n of
    ``reader`` (a ShardReader), each batch through ``to_element``, whose
    result matches ``output_signature`` (fixed shapes). Iterations from
    ``end_epoch`` on yield nothing. prefetch: batches to prefetch (0:
    tf.data.AUTOTUNE).

    The groups come from a stateful ``numpy_function`` mapped over their
    indices, not from ``Dataset.from_generator``: making that op sets
    glibc's M_TRIM_THRESHOLD, which turns off malloc's adaptive mmap
    threshold for the whole process, so that from then on every
    allocation of 128 KiB or more (TensorFlow's tensors among them, in
    training too) is a fresh mapping that faults in page by page."""
    import tensorflow as tf

    specs = tf.nest.flatten(output_signature)
    batch_bytes = sum(int(np.prod(s.shape, dtype=np.int64)) * s.dtype.size for s in specs)
    group = max(1, min(_GROUP_MAX, _GROUP_BYTES // max(batch_bytes, 1)))
    feed = _Feed(reader, steps, first_epoch, to_element, group, end_epoch, specs)

    def element(i):
        leaves = tf.numpy_function(feed.element, [i], [s.dtype for s in specs], stateful=True)
        for leaf, spec in zip(leaves, specs):
            leaf.set_shape((None, *spec.shape))
        return tf.data.Dataset.from_tensor_slices(
            tf.nest.pack_sequence_as(output_signature, leaves))

    ds = tf.data.Dataset.range(-(-int(steps) // group)).flat_map(element)
    ds = ds.apply(tf.data.experimental.assert_cardinality(int(steps)))
    return ds.prefetch(prefetch if prefetch and prefetch > 0 else tf.data.AUTOTUNE)
