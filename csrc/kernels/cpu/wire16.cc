// Dispatch for the wire kernels: the loops are generated with the reduce
// kernels (reduce_kernels.h, makeWireTable) and follow their choice of
// instruction set (F16C/AVX2 where the CPU has it, portable otherwise).
#include "kernels/cpu/wire16.h"

#include "kernels/cpu/reduce_kernels.h"

namespace tfring {
namespace kernels {

namespace {
int index(WireType w) { return static_cast<int>(w) - 1; }
}  // namespace

void narrow(void* dst, const float* src, size_t count, WireType w, double scale) {
  if (count) detail::activeWire().narrow[index(w)](dst, src, count, static_cast<float>(scale));
}

void widen(float* dst, const void* src, size_t count, WireType w) {
  if (count) detail::activeWire().widen[index(w)](dst, src, count);
}

void widenReduce(float* dst, const float* a, const void* b, size_t count, WireType w,
                 ReduceOp op, double a_scale) {
  if (count)
    detail::activeWire().reduce[index(w)][static_cast<int>(op)](dst, a, b, count,
                                                                static_cast<float>(a_scale));
}

void roundTrip(float* data, size_t count, WireType w) {
  if (count) detail::activeWire().round[index(w)](data, count);
}

}  // namespace kernels
}  // namespace tfring
