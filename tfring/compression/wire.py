"""16-bit words on the wire: `Compression.fp16` and `Compression.bf16`.

A float32 allreduce with one of these compressors sends float16 (or
bfloat16) words between ranks and adds them in float32 on every rank, inside
the core's ring (docs/compression.md): every hop's partial sum is rounded to
16 bits once, never summed in 16 bits, and the final float32 sum is rounded
once more and handed to every rank, so all ranks end with the same bits.
The collectives find the format in `wire_dtype`; float64 tensors are
reduced as float32 on the same wire, 16-bit and integer tensors as they
are.

`compress` and `decompress` still cast, as Horovod's FP16Compressor does,
for code that calls them around a collective of its own; that path sums in
16 bits. `Compression.fp16_cast` keeps it as a compressor, for comparison.
"""

import tensorflow as tf

from tfring.compression.base import Compressor, FP16Compressor


class WireCompressor(Compressor):
    """A compressor the collectives apply on the wire: `wire_dtype` names
    the 16-bit format ("float16" or "bfloat16")."""

    wire_dtype = None
    _cast_dtype = None

    @classmethod
    def compress(cls, tensor):
        if tensor.dtype.is_floating and tensor.dtype != cls._cast_dtype:
            return tf.cast(tensor, cls._cast_dtype), tensor.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor if ctx is None else tf.cast(tensor, ctx)


class FP16WireCompressor(WireCompressor, FP16Compressor):
    """float16 words on the wire, float32 sums (range +-65504: see
    docs/compression.md for what overflows)."""

    wire_dtype = "float16"
    _cast_dtype = tf.float16


class BF16WireCompressor(WireCompressor):
    """bfloat16 words on the wire, float32 sums: float32's range, 8 bits
    of precision."""

    wire_dtype = "bfloat16"
    _cast_dtype = tf.bfloat16


def wire_dtype_of(compression):
    """The 16-bit wire a compressor asks for, or None."""
    return getattr(compression, "wire_dtype", None)


def to_wire_input(tensor, wire):
    """What goes into the op for `tensor` on `wire`, and the dtype to cast
    the result back to (None: none). float64 travels as float32; every
    other dtype as it is (the core narrows float32 only)."""
    if wire and tensor.dtype == tf.float64:
        return tf.cast(tensor, tf.float32), tf.float64
    return tensor, None


def from_wire_output(tensor, back):
    return tensor if back is None else tf.cast(tensor, back)
