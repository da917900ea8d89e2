// The AVX-512 kernel set (F, BW, VL, DQ; plus AVX2, FMA, F16C), compiled
// with those -m flags and run only on CPUs that have them (reduce.cc
// decides).
//
// Register width is chosen per element type, by measurement (AMD EPYC Zen 4,
// 2 cores, reduce/reduce3 sums): memory-bound loops stream 5-10% faster with
// 256-bit registers than with 512-bit ones, from L3 and from DRAM alike, and
// float16 (F16C conversions) is ~10% faster at 256 bits even in L1/L2; only
// bfloat16, whose rounding is done in integer instructions and is the one
// compute-bound case, gains from 512 bits (~45 vs ~33 GB/s in cache). Intel
// server parts also lower their clock for 512-bit code. So most types run
// the 256-bit Vecs of reduce_vec256.h, here with AVX-512VL's native 64-bit
// integer multiply/min/max, and bfloat16 runs 512-bit with masked tails.
#ifdef TFRING_X86

// GCC 12's avx512fintrin.h trips -Wmaybe-uninitialized on its own
// _mm512_undefined_*() (GCC bug 105593, fixed in 13); the warning points
// into the header, so it is silenced for the header's lines only.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#else
#include <immintrin.h>
#endif

#include "kernels/cpu/reduce_kernels.h"
#include "kernels/cpu/reduce_vec256.h"

namespace tfring {
namespace kernels {
namespace {

using detail::BFloat16;
using detail::KernelTable;

// By default an element type runs its 256-bit Vec.
template <class S>
struct Avx512Vec : Vec256<S> {};

// int64: AVX-512VL/DQ have the multiply, min and max that AVX2 lacks.
template <>
struct Avx512Vec<int64_t> : Vec256<int64_t> {
  static Reg mul(Reg a, Reg b) { return _mm256_mullo_epi64(a, b); }
  static Reg min(Reg a, Reg b) { return _mm256_min_epi64(a, b); }
  static Reg max(Reg a, Reg b) { return _mm256_max_epi64(a, b); }
};

// bfloat16: 16 lanes of float32 arithmetic in a __m512.
template <>
struct Avx512Vec<BFloat16> {
  using Storage = BFloat16;
  using Reg = __m512;
  static constexpr size_t kLanes = 16;
  static constexpr bool kFloating = true;

  static __mmask16 firstLanes(size_t n) { return static_cast<__mmask16>((1u << n) - 1); }

  static Reg widen(__m256i h) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  // Round to nearest even: add 0x7FFF plus the lowest kept bit, then drop the
  // low half. A NaN instead keeps its top bits with the quiet bit set.
  static __m256i narrow(Reg v) {
    const __m512i bits = _mm512_castps_si512(v);
    const __m512i top = _mm512_srli_epi32(bits, 16);
    const __m512i bias = _mm512_add_epi32(_mm512_and_si512(top, _mm512_set1_epi32(1)),
                                          _mm512_set1_epi32(0x7FFF));
    const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(bits, bias), 16);
    const __m512i quiet = _mm512_or_si512(top, _mm512_set1_epi32(0x40));
    const __m512i r =
        _mm512_mask_mov_epi32(rounded, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), quiet);
    return _mm512_cvtepi32_epi16(r);
  }

  static Reg load(const BFloat16* p) {
    return widen(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static void store(BFloat16* p, Reg v) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), narrow(v));
  }
  static Reg loadPartial(const BFloat16* p, size_t n) {
    return widen(_mm256_maskz_loadu_epi16(firstLanes(n), p));
  }
  static void storePartial(BFloat16* p, Reg v, size_t n) {
    _mm256_mask_storeu_epi16(p, firstLanes(n), narrow(v));
  }

  static Reg splat(double f) { return _mm512_set1_ps(static_cast<float>(f)); }
  static Reg add(Reg a, Reg b) { return _mm512_add_ps(a, b); }
  static Reg mul(Reg a, Reg b) { return _mm512_mul_ps(a, b); }
  // MINPS/MAXPS return b when either side is NaN; put a back where a is NaN.
  static Reg min(Reg a, Reg b) {
    return _mm512_mask_mov_ps(_mm512_min_ps(a, b), _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q), a);
  }
  static Reg max(Reg a, Reg b) {
    return _mm512_mask_mov_ps(_mm512_max_ps(a, b), _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q), a);
  }
};

}  // namespace

namespace detail {
const KernelTable* avx512Kernels() {
  // The wire kernels keep to 256 bits: the AVX-512 bfloat16 Vec holds 16
  // lanes and the float32 one 8.
  static const KernelTable table = [] {
    KernelTable t = makeTable<Avx512Vec>("avx512");
    t.wire = avx2Kernels()->wire;
    return t;
  }();
  return &table;
}
}  // namespace detail

}  // namespace kernels
}  // namespace tfring

#endif  // TFRING_X86
