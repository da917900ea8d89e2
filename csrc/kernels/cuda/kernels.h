// CUDA kernel launchers: reduce, scale, float casts (fp16 compression) and
// batched copies (fusion-buffer pack/unpack). Each launcher takes plain
// device pointers, an element count and the stream to launch on, and
// returns as soon as the kernel is queued; errors in the launch itself throw
// tfring::Error. Nothing here synchronizes.
//
// The arithmetic is the CPU kernels' (kernels/cpu/reduce_kernels.h), so a
// GPU and a CPU rank would compute the same bits for the same inputs:
//   - integers wrap (two's complement);
//   - min/max: a NaN in `a` gives a, else (a < b ? a : b) / (a > b ? a : b),
//     so a NaN on either side propagates;
//   - float16/bfloat16 are widened to float32 and rounded back to nearest
//     even once per operation (a fused reduce+scale rounds in between, like
//     the CPU's reduce followed by scale);
//   - bool: sum/max are logical or, min/product logical and;
//   - scaling multiplies floats in their own precision (float16/bfloat16 in
//     float32) and integers in double, truncating toward zero with
//     saturation (NaN gives 0).
//
// Only built with CUDA (csrc/kernels/cuda/*.cu, see cmake/cuda.cmake); the
// header itself needs no CUDA headers.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/types.h"

struct CUstream_st;  // cudaStream_t is CUstream_st*

namespace tfring {
namespace kernels {
namespace cuda {

using Stream = ::CUstream_st*;

// dst = op(a, b) * factor over `count` elements (factor 1: no scaling).
// dst may be a or b exactly; otherwise the ranges must not overlap. kAverage
// is treated as kSum. Vectorized with 16-byte loads when the three pointers
// can be aligned together.
void reduce(void* dst, const void* a, const void* b, size_t count, DataType dtype,
            ReduceOp op, double factor, Stream stream);

// dst = src * factor (dst may be src). With factor 1 and dst != src this is
// a copy.
void scale(void* dst, const void* src, size_t count, DataType dtype, double factor,
           Stream stream);

// Converts between floating types (float16, bfloat16, float32, float64),
// rounding to nearest even; NaN and Inf are kept. Same dtype: a copy.
void cast(void* dst, DataType dst_dtype, const void* src, DataType src_dtype, size_t count,
          Stream stream);

// fp16 compression of gradients: float32 -> float16 and back.
inline void compressFp16(uint16_t* dst, const float* src, size_t count, Stream stream) {
  cast(dst, DataType::kFloat16, src, DataType::kFloat32, count, stream);
}
inline void decompressFp16(float* dst, const uint16_t* src, size_t count, Stream stream) {
  cast(dst, DataType::kFloat32, src, DataType::kFloat16, count, stream);
}

// Many copies in as few launches as possible (up to 1024 per launch):
// packs tensors into a fusion buffer or unpacks them. Copies must not
// overlap each other. 16-byte aligned copies run vectorized.
struct CopyDesc {
  void* dst;
  const void* src;
  size_t bytes;
};
void batchedCopy(const CopyDesc* copies, size_t n, Stream stream);

}  // namespace cuda
}  // namespace kernels
}  // namespace tfring
