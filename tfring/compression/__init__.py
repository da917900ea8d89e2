"""Gradient compression applied around a collective: `compress` before the
tensor goes on the wire, `decompress` after. Horovod-compatible:
`Compression.none` and `Compression.fp16`; `Compression.bf16` too. fp16 and
bf16 put 16-bit words on the wire and sum in float32 inside the ring
(tfring/compression/wire.py); `Compression.fp16_cast` is Horovod's cast
around the collective, which sums in float16."""

import tensorflow as tf


class Compressor:
    """Interface: compress(tensor) -> (tensor, ctx); decompress(tensor, ctx)."""

    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor


class NoneCompressor(Compressor):
    """Sends tensors as they are."""


class FP16Compressor(Compressor):
    """Sends floating-point tensors as float16, halving the bytes moved;
    others pass unchanged. The result is cast back to the input's dtype."""

    @staticmethod
    def compress(tensor):
        if tensor.dtype.is_floating and tensor.dtype != tf.float16:
            return tf.cast(tensor, tf.float16), tensor.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor if ctx is None else tf.cast(tensor, ctx)


class Compression:
    """The compressors a collective accepts as `compression=`."""

    none = NoneCompressor
    fp16_cast = FP16Compressor  # fp16 and bf16: set below from wire.py

    @staticmethod
    def powersgd(rank=4, start_iter=10, min_compression_rate=2,
                 warm_start=True, use_error_feedback=True, seed=0,
                 orthogonalization_epsilon=0.0, name="powersgd"):
        """Low-rank gradient compression with error feedback for the
        training-step reducers (tfring/compression/powersgd.py). Holds
        state across steps: create it once."""
        from tfring.compression.powersgd import PowerSGD

        return PowerSGD(rank, start_iter, min_compression_rate, warm_start,
                        use_error_feedback, seed, orthogonalization_epsilon,
                        name)


from tfring.compression.wire import (  # noqa: E402  (wire.py imports the above)
    BF16WireCompressor as _BF16Wire,
    FP16WireCompressor as _FP16Wire,
)

Compression.fp16 = _FP16Wire
Compression.bf16 = _BF16Wire
