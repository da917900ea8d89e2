"""Gradient compression applied around a collective: `compress` before the
tensor goes on the wire, `decompress` after. Horovod-compatible:
`Compression.none` and `Compression.fp16`; `Compression.bf16` too. fp16 and
bf16 put 16-bit words on the wire and sum in float32 inside the ring
(tfring/compression/wire.py); `Compression.fp16_cast` is Horovod's cast
around the collective, which sums in float16."""

from tfring.compression.base import Compressor, FP16Compressor, NoneCompressor
from tfring.compression.wire import BF16WireCompressor, FP16WireCompressor

__all__ = ["BF16WireCompressor", "Compression", "Compressor", "FP16Compressor",
           "FP16WireCompressor", "NoneCompressor"]


class Compression:
    """The compressors a collective accepts as `compression=`."""

    none = NoneCompressor
    fp16 = FP16WireCompressor
    bf16 = BF16WireCompressor
    fp16_cast = FP16Compressor

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
