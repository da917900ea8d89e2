// Kernels between float32 buffers and 16-bit words on the wire (float16 or
// bfloat16): an allreduce with a 16-bit wire (collectives/ring.h) narrows
// what it sends and widens what it receives, and accumulates in float32.
// Rounding is to nearest even, bit-exact with the float16 / bfloat16 reduce
// kernels (reduce.h) and with every kernel set, NaN payloads included;
// float16 overflows to inf above 65504 (65520 and up rounds to inf).
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/types.h"

namespace tfring {
namespace kernels {

// Bytes of one word on a wire of type w (w != kNone).
constexpr size_t wireWordBytes(WireType) { return 2; }

// dst (count 16-bit words) = round(src * scale).
void narrow(void* dst, const float* src, size_t count, WireType w, double scale = 1.0);
// dst (count floats) = the words at src, exactly.
void widen(float* dst, const void* src, size_t count, WireType w);
// dst = op(a * a_scale, widen(b)): one ring step's fold of a received chunk
// into the local float32 data. dst may be exactly a. op as in reduce()
// (kAverage sums).
void widenReduce(float* dst, const float* a, const void* b, size_t count, WireType w,
                 ReduceOp op, double a_scale = 1.0);
// data = widen(narrow(data)): the value every other rank will receive.
void roundTrip(float* data, size_t count, WireType w);

}  // namespace kernels
}  // namespace tfring
