// Internal to kernels/cpu: the 256-bit Vecs (see reduce_kernels.h), one per
// element type. They need AVX2, FMA and F16C, so only translation units
// compiled with those flags include this file: reduce_avx2.cc uses them as
// they are, and reduce_avx512.cc builds on them (on the machines measured,
// 256-bit loops stream memory faster than 512-bit ones; see there).
#pragma once

#ifdef TFRING_X86

#include <immintrin.h>

#include "kernels/cpu/reduce_kernels.h"

namespace tfring {
namespace kernels {
namespace {  // internal linkage: see reduce_kernels.h

using detail::BFloat16;
using detail::Bool;
using detail::BufferedTail;
using detail::Half;

template <class S>
struct Vec256;  // one specialization per element type

// --------------------------------------------------------------- float ----

// float32 arithmetic, shared by float32, float16 and bfloat16.
struct Float256 {
  using Reg = __m256;
  static constexpr size_t kLanes = 8;
  static constexpr bool kFloating = true;

  static Reg splat(double f) { return _mm256_set1_ps(static_cast<float>(f)); }
  static Reg add(Reg a, Reg b) { return _mm256_add_ps(a, b); }
  static Reg mul(Reg a, Reg b) { return _mm256_mul_ps(a, b); }
  // MINPS/MAXPS return b when either side is NaN; put a back where a is NaN.
  static Reg min(Reg a, Reg b) {
    return _mm256_blendv_ps(_mm256_min_ps(a, b), a, _mm256_cmp_ps(a, a, _CMP_UNORD_Q));
  }
  static Reg max(Reg a, Reg b) {
    return _mm256_blendv_ps(_mm256_max_ps(a, b), a, _mm256_cmp_ps(a, a, _CMP_UNORD_Q));
  }
};

template <>
struct Vec256<float> : Float256, BufferedTail<float, 8, Vec256<float>> {
  using Storage = float;
  static Reg load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, Reg v) { _mm256_storeu_ps(p, v); }
};

template <>
struct Vec256<Half> : Float256, BufferedTail<Half, 8, Vec256<Half>> {
  using Storage = Half;
  static Reg load(const Half* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static void store(Half* p, Reg v) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p),
                     _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
};

template <>
struct Vec256<BFloat16> : Float256, BufferedTail<BFloat16, 8, Vec256<BFloat16>> {
  using Storage = BFloat16;
  static Reg load(const BFloat16* p) {
    __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
  }
  // Round to nearest even: add 0x7FFF plus the lowest kept bit, then drop the
  // low half. A NaN instead keeps its top bits with the quiet bit set.
  static void store(BFloat16* p, Reg v) {
    const __m256i bits = _mm256_castps_si256(v);
    const __m256i top = _mm256_srli_epi32(bits, 16);
    const __m256i bias = _mm256_add_epi32(_mm256_and_si256(top, _mm256_set1_epi32(1)),
                                          _mm256_set1_epi32(0x7FFF));
    const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(bits, bias), 16);
    const __m256i quiet = _mm256_or_si256(top, _mm256_set1_epi32(0x40));
    const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    const __m256i r = _mm256_blendv_epi8(rounded, quiet, nan);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p),
                     _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1)));
  }
};

template <>
struct Vec256<double> : BufferedTail<double, 4, Vec256<double>> {
  using Storage = double;
  using Reg = __m256d;
  static constexpr size_t kLanes = 4;
  static constexpr bool kFloating = true;

  static Reg load(const double* p) { return _mm256_loadu_pd(p); }
  static void store(double* p, Reg v) { _mm256_storeu_pd(p, v); }
  static Reg splat(double f) { return _mm256_set1_pd(f); }
  static Reg add(Reg a, Reg b) { return _mm256_add_pd(a, b); }
  static Reg mul(Reg a, Reg b) { return _mm256_mul_pd(a, b); }
  static Reg min(Reg a, Reg b) {
    return _mm256_blendv_pd(_mm256_min_pd(a, b), a, _mm256_cmp_pd(a, a, _CMP_UNORD_Q));
  }
  static Reg max(Reg a, Reg b) {
    return _mm256_blendv_pd(_mm256_max_pd(a, b), a, _mm256_cmp_pd(a, a, _CMP_UNORD_Q));
  }
};

// ------------------------------------------------------------- integer ----

template <class S>
struct Int256 : BufferedTail<S, 32 / sizeof(S), Vec256<S>> {
  using Storage = S;
  using Reg = __m256i;
  static constexpr size_t kLanes = 32 / sizeof(S);
  static constexpr bool kFloating = false;

  static Reg load(const S* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
  static void store(S* p, Reg v) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), v); }
};

// There is no 8-bit multiply: multiply the even and the odd bytes as 16-bit
// lanes and keep the low byte of each product.
inline __m256i mulBytes256(__m256i a, __m256i b) {
  __m256i even = _mm256_mullo_epi16(a, b);
  __m256i odd = _mm256_mullo_epi16(_mm256_srli_epi16(a, 8), _mm256_srli_epi16(b, 8));
  return _mm256_or_si256(_mm256_slli_epi16(odd, 8),
                         _mm256_and_si256(even, _mm256_set1_epi16(0x00FF)));
}

template <>
struct Vec256<int32_t> : Int256<int32_t> {
  static Reg add(Reg a, Reg b) { return _mm256_add_epi32(a, b); }
  static Reg mul(Reg a, Reg b) { return _mm256_mullo_epi32(a, b); }
  static Reg min(Reg a, Reg b) { return _mm256_min_epi32(a, b); }
  static Reg max(Reg a, Reg b) { return _mm256_max_epi32(a, b); }
};

template <>
struct Vec256<int64_t> : Int256<int64_t> {
  static Reg add(Reg a, Reg b) { return _mm256_add_epi64(a, b); }
  // No 64-bit multiply before AVX-512DQ. Modulo 2^64,
  // a * b = lo(a) lo(b) + ((lo(a) hi(b) + hi(a) lo(b)) << 32).
  static Reg mul(Reg a, Reg b) {
    __m256i lo = _mm256_mul_epu32(a, b);
    __m256i cross = _mm256_add_epi64(_mm256_mul_epu32(a, _mm256_srli_epi64(b, 32)),
                                     _mm256_mul_epu32(_mm256_srli_epi64(a, 32), b));
    return _mm256_add_epi64(lo, _mm256_slli_epi64(cross, 32));
  }
  static Reg min(Reg a, Reg b) { return _mm256_blendv_epi8(a, b, _mm256_cmpgt_epi64(a, b)); }
  static Reg max(Reg a, Reg b) { return _mm256_blendv_epi8(a, b, _mm256_cmpgt_epi64(b, a)); }
};

template <>
struct Vec256<uint8_t> : Int256<uint8_t> {
  static Reg add(Reg a, Reg b) { return _mm256_add_epi8(a, b); }
  static Reg mul(Reg a, Reg b) { return mulBytes256(a, b); }
  static Reg min(Reg a, Reg b) { return _mm256_min_epu8(a, b); }
  static Reg max(Reg a, Reg b) { return _mm256_max_epu8(a, b); }
};

template <>
struct Vec256<int8_t> : Int256<int8_t> {
  static Reg add(Reg a, Reg b) { return _mm256_add_epi8(a, b); }
  static Reg mul(Reg a, Reg b) { return mulBytes256(a, b); }
  static Reg min(Reg a, Reg b) { return _mm256_min_epi8(a, b); }
  static Reg max(Reg a, Reg b) { return _mm256_max_epi8(a, b); }
};

template <>
struct Vec256<int16_t> : Int256<int16_t> {
  static Reg add(Reg a, Reg b) { return _mm256_add_epi16(a, b); }
  static Reg mul(Reg a, Reg b) { return _mm256_mullo_epi16(a, b); }
  static Reg min(Reg a, Reg b) { return _mm256_min_epi16(a, b); }
  static Reg max(Reg a, Reg b) { return _mm256_max_epi16(a, b); }
};

template <>
struct Vec256<uint16_t> : Int256<uint16_t> {
  static Reg add(Reg a, Reg b) { return _mm256_add_epi16(a, b); }
  static Reg mul(Reg a, Reg b) { return _mm256_mullo_epi16(a, b); }
  static Reg min(Reg a, Reg b) { return _mm256_min_epu16(a, b); }
  static Reg max(Reg a, Reg b) { return _mm256_max_epu16(a, b); }
};

// bool: logical or / and, results always 0 or 1 (min(x, 1) maps nonzero to 1).
template <>
struct Vec256<Bool> : Int256<Bool> {
  static Reg truth(Reg a) { return _mm256_min_epu8(a, _mm256_set1_epi8(1)); }
  static Reg add(Reg a, Reg b) { return truth(_mm256_or_si256(a, b)); }
  static Reg max(Reg a, Reg b) { return add(a, b); }
  static Reg mul(Reg a, Reg b) { return _mm256_and_si256(truth(a), truth(b)); }
  static Reg min(Reg a, Reg b) { return mul(a, b); }
};

}  // namespace
}  // namespace kernels
}  // namespace tfring

#endif  // TFRING_X86
