// The AVX2 kernel set (with FMA and F16C), compiled with -mavx2 -mfma -mf16c
// and run only on CPUs that have them (reduce.cc decides): the generic loops
// of reduce_kernels.h over the 256-bit Vecs of reduce_vec256.h. Tails go
// through a small stack buffer.
#ifdef TFRING_X86

#include "kernels/cpu/reduce_kernels.h"
#include "kernels/cpu/reduce_vec256.h"

namespace tfring {
namespace kernels {
namespace detail {

const KernelTable* avx2Kernels() {
  static const WireTable wire = makeWireTable<Vec256>();
  static const KernelTable table = [] {
    KernelTable t = makeTable<Vec256>("avx2");
    t.wire = &wire;
    return t;
  }();
  return &table;
}

}  // namespace detail
}  // namespace kernels
}  // namespace tfring

#endif  // TFRING_X86
