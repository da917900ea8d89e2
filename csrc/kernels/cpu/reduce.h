// CPU reduce kernels: dst[i] = op(dst[i], src[i]) for every dtype and op, and
// scaling by a factor. Vectorized with AVX2 / AVX-512 where the CPU has them,
// chosen once at run time; float16 and bfloat16 are widened to float32 for
// the arithmetic and rounded back (round-to-nearest-even) per element.
// Average is not a kernel: the collectives sum, then scale by 1/size.
#pragma once

#include <cstddef>

#include "common/types.h"

namespace tfring {
namespace kernels {

// dst = op(dst, src), elementwise over `count` elements. op must be kSum,
// kMin, kMax or kProduct (kAverage is treated as kSum). Integers wrap; min
// and max return NaN when either side is NaN (like np.minimum/np.maximum);
// for kBool, sum/max are logical or and min/product logical and. Every
// kernel set gives bitwise identical results. No alignment needed.
void reduce(void* dst, const void* src, size_t count, DataType dtype, ReduceOp op);

// dst = op(a, b): the out-of-place variant (lets a ring step reduce a
// received chunk and the local input into the output in one pass). dst may
// be exactly a or b; other overlaps are not allowed.
void reduce3(void* dst, const void* a, const void* b, size_t count,
             DataType dtype, ReduceOp op);

// data *= factor. Floating types multiply in their own precision (float16
// and bfloat16 in float32). Integer types round toward zero after
// multiplying in double, saturating out-of-range results. No-op when
// factor == 1.
void scale(void* data, size_t count, DataType dtype, double factor);

// Which instruction set the dispatcher picked: "avx512", "avx2" or "scalar".
// It picks the best one the CPU has, at first use; TFRING_CPU_ISA=scalar|avx2
// forces a lower one.
const char* isaName();

// Whether this CPU and build can run the named kernel set.
bool isaSupported(const char* name);

// Switches the kernel set at run time (tests and benchmarks). Returns false,
// changing nothing, when the name is unknown or unsupported; an empty name
// goes back to the startup choice. Calls already running finish with the set
// they started with.
bool setIsa(const char* name);

// Element conversions used by kernels and tests.
float halfToFloat(uint16_t h);
uint16_t floatToHalf(float f);
float bf16ToFloat(uint16_t h);
uint16_t floatToBf16(float f);

}  // namespace kernels
}  // namespace tfring
