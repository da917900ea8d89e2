// Internal to kernels/cpu: the pieces shared by the scalar, AVX2 and AVX-512
// kernel sets. reduce.cc (dispatcher, scalar set), reduce_avx2.cc and
// reduce_avx512.cc each include this file; the two x86 sets share the
// 256-bit Vecs of reduce_vec256.h.
//
// How the kernels are generated. Every kernel set defines one "vector" type
// per element type (VecOf<Storage>) with a small fixed interface:
//
//   using Storage;            // element as stored in memory (Half, float, ...)
//   using Reg;                // what the arithmetic runs on (__m256, float, ...)
//   kLanes, kFloating;        // elements per Reg; floating-point or not
//   load / store              // kLanes elements, unaligned
//   loadPartial / storePartial// the first n < kLanes elements (tails)
//   add / mul / min / max     // elementwise on Regs
//   splat(double)             // floating types only: the factor of scale()
//
// and the loops below (binaryLoop, scaleLoop), written once, are
// instantiated for every dtype x op through makeTable(). A kernel set is
// then nothing but a KernelTable of function pointers, and the dispatcher in
// reduce.cc picks one table at first use.
//
// Semantics every Vec must implement identically, so that all kernel sets
// give bitwise identical results:
//   - integers wrap (two's complement);
//   - min/max: if a is NaN the result is a, else (a < b ? a : b) for min and
//     (a > b ? a : b) for max. So a NaN on either side gives NaN (numpy's
//     np.minimum/np.maximum), and a tie (-0 vs +0) gives b, which is what
//     the x86 MINPS/MAXPS instructions do;
//   - float16/bfloat16 are widened to float32 for the arithmetic and rounded
//     back once, to nearest even; a NaN stays a NaN (quiet bit set);
//   - bool: sum and max are logical or, min and product logical and; the
//     result is always 0 or 1.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "common/types.h"

namespace tfring {
namespace kernels {
namespace detail {

// Storage types for the elements that C++ has no distinct type for.
struct Half {
  uint16_t bits;
};
struct BFloat16 {
  uint16_t bits;
};
struct Bool {
  uint8_t value;
};

// dst = op(a, b) over count elements. dst may be a or b (exactly), but must
// not overlap them otherwise.
using BinaryFn = void (*)(void* dst, const void* a, const void* b, size_t count);
// data *= factor over count elements.
using ScaleFn = void (*)(void* data, size_t count, double factor);

// Between float32 buffers and 16-bit wire words (kernels/cpu/wire16.h); the
// first index is the wire format, WireType - 1 (float16, bfloat16).
//   narrow  dst16 = round(src * scale)
//   widen   dst = src16
//   reduce  dst = op(a * scale, b16)   (dst may be exactly a)
//   round   data = widen(narrow(data))
using NarrowFn = void (*)(void* dst, const float* src, size_t count, float scale);
using WidenFn = void (*)(float* dst, const void* src, size_t count);
using WidenReduceFn = void (*)(float* dst, const float* a, const void* b, size_t count,
                               float scale);
using RoundTripFn = void (*)(float* data, size_t count);
struct WireTable {
  NarrowFn narrow[2];
  WidenFn widen[2];
  WidenReduceFn reduce[2][kNumReduceOps];  // kAverage holds the sum
  RoundTripFn round[2];
};

struct KernelTable {
  const char* name;
  BinaryFn binary[kNumDataTypes][kNumReduceOps];  // kAverage holds the sum
  ScaleFn scale[kNumDataTypes];
  const WireTable* wire;  // the same lanes for float32 and 16-bit words
};

// The kernel sets; avx2/avx512 exist only in x86-64 builds.
const KernelTable* scalarKernels();
const KernelTable* avx2Kernels();
const KernelTable* avx512Kernels();
// The wire kernels of the kernel set in use (reduce.cc).
const WireTable& activeWire();

// Everything below has internal linkage on purpose: each kernel set's
// translation unit is compiled with its own -m flags, and an inline function
// or template instance with external linkage could be merged by the linker
// with the copy from another unit, e.g. letting the AVX-512 build of a helper
// run on the scalar path of a CPU without AVX-512.
namespace {

struct OpSum {
  template <class V>
  static typename V::Reg apply(typename V::Reg a, typename V::Reg b) {
    return V::add(a, b);
  }
};
struct OpProduct {
  template <class V>
  static typename V::Reg apply(typename V::Reg a, typename V::Reg b) {
    return V::mul(a, b);
  }
};
struct OpMin {
  template <class V>
  static typename V::Reg apply(typename V::Reg a, typename V::Reg b) {
    return V::min(a, b);
  }
};
struct OpMax {
  template <class V>
  static typename V::Reg apply(typename V::Reg a, typename V::Reg b) {
    return V::max(a, b);
  }
};

// Tails through a small buffer, for Vecs without masked loads and stores.
// The unused lanes are zero, which no op minds.
template <class Storage, size_t kLanes, class Self>
struct BufferedTail {
  static auto loadPartial(const Storage* p, size_t n) {
    Storage tmp[kLanes];
    std::memset(static_cast<void*>(tmp), 0, sizeof(tmp));
    std::memcpy(static_cast<void*>(tmp), p, n * sizeof(Storage));
    return Self::load(tmp);
  }
  template <class Reg>
  static void storePartial(Storage* p, Reg v, size_t n) {
    Storage tmp[kLanes];
    Self::store(tmp, v);
    std::memcpy(static_cast<void*>(p), tmp, n * sizeof(Storage));
  }
};

// dst = op(a, b). Two Regs per iteration: all loads before the stores, so
// dst == a or dst == b is fine.
template <class V, class Op>
void binaryLoop(void* dst, const void* a, const void* b, size_t n) {
  using S = typename V::Storage;
  constexpr size_t L = V::kLanes;
  S* d = static_cast<S*>(dst);
  const S* x = static_cast<const S*>(a);
  const S* y = static_cast<const S*>(b);
  size_t i = 0;
  for (; i + 2 * L <= n; i += 2 * L) {
    auto x0 = V::load(x + i), x1 = V::load(x + i + L);
    auto y0 = V::load(y + i), y1 = V::load(y + i + L);
    V::store(d + i, Op::template apply<V>(x0, y0));
    V::store(d + i + L, Op::template apply<V>(x1, y1));
  }
  for (; i + L <= n; i += L)
    V::store(d + i, Op::template apply<V>(V::load(x + i), V::load(y + i)));
  if (i < n) {
    size_t rest = n - i;
    V::storePartial(d + i, Op::template apply<V>(V::loadPartial(x + i, rest),
                                                 V::loadPartial(y + i, rest)),
                    rest);
  }
}

// Integer scaling: multiply in double, truncate toward zero. Out-of-range
// results saturate and NaN gives 0 (a plain cast would be undefined).
// Branch-free below 64 bits, where the limits are exact doubles, so that the
// loop vectorizes.
template <class T>
T truncFromDouble(double v) {
  constexpr double lo = static_cast<double>(std::numeric_limits<T>::min());
  constexpr double hi = static_cast<double>(std::numeric_limits<T>::max());
  if constexpr (sizeof(T) < 8) {
    v = v == v ? v : 0.0;
    v = v < lo ? lo : v;
    v = v > hi ? hi : v;
    return static_cast<T>(v);
  } else {
    if (!(v == v)) return 0;
    if (v <= lo) return std::numeric_limits<T>::min();
    if (v >= hi) return std::numeric_limits<T>::max();  // hi is 2^63 here
    return static_cast<T>(v);
  }
}

template <class V>
void scaleLoop(void* data, size_t n, double factor) {
  using S = typename V::Storage;
  S* p = static_cast<S*>(data);
  if constexpr (std::is_same_v<S, Bool>) {
    // Logical: x * factor is true when both are nonzero.
    for (size_t i = 0; i < n; ++i)
      p[i].value = (p[i].value != 0 && factor != 0.0) ? 1 : 0;
  } else if constexpr (!V::kFloating) {
    for (size_t i = 0; i < n; ++i)
      p[i] = truncFromDouble<S>(static_cast<double>(p[i]) * factor);
  } else {
    // Floating types multiply in their own precision (float16/bfloat16 in
    // float32), so splat() rounds the factor to that precision first.
    constexpr size_t L = V::kLanes;
    const auto f = V::splat(factor);
    size_t i = 0;
    for (; i + 2 * L <= n; i += 2 * L) {
      auto x0 = V::load(p + i), x1 = V::load(p + i + L);
      V::store(p + i, V::mul(x0, f));
      V::store(p + i + L, V::mul(x1, f));
    }
    for (; i + L <= n; i += L) V::store(p + i, V::mul(V::load(p + i), f));
    if (i < n) V::storePartial(p + i, V::mul(V::loadPartial(p + i, n - i), f), n - i);
  }
}

template <template <class> class VecOf, class S>
void fillRow(KernelTable* t, DataType dtype) {
  using V = VecOf<S>;
  BinaryFn* row = t->binary[static_cast<int>(dtype)];
  row[static_cast<int>(ReduceOp::kSum)] = &binaryLoop<V, OpSum>;
  row[static_cast<int>(ReduceOp::kAverage)] = &binaryLoop<V, OpSum>;
  row[static_cast<int>(ReduceOp::kMin)] = &binaryLoop<V, OpMin>;
  row[static_cast<int>(ReduceOp::kMax)] = &binaryLoop<V, OpMax>;
  row[static_cast<int>(ReduceOp::kProduct)] = &binaryLoop<V, OpProduct>;
  t->scale[static_cast<int>(dtype)] = &scaleLoop<V>;
}

// One kernel set: every dtype x op instantiated from VecOf.
template <template <class> class VecOf>
KernelTable makeTable(const char* name) {
  KernelTable t{};
  t.name = name;
  fillRow<VecOf, Half>(&t, DataType::kFloat16);
  fillRow<VecOf, BFloat16>(&t, DataType::kBFloat16);
  fillRow<VecOf, float>(&t, DataType::kFloat32);
  fillRow<VecOf, double>(&t, DataType::kFloat64);
  fillRow<VecOf, int32_t>(&t, DataType::kInt32);
  fillRow<VecOf, int64_t>(&t, DataType::kInt64);
  fillRow<VecOf, uint8_t>(&t, DataType::kUInt8);
  fillRow<VecOf, int8_t>(&t, DataType::kInt8);
  fillRow<VecOf, Bool>(&t, DataType::kBool);
  fillRow<VecOf, int16_t>(&t, DataType::kInt16);
  fillRow<VecOf, uint16_t>(&t, DataType::kUInt16);
  return t;
}

// ---------------------------------------------------------- wire words ----
// F is the float32 Vec and H the 16-bit one; both hold the same lanes in the
// same Reg, so a 16-bit load is a widening and a 16-bit store a rounding to
// nearest even, exactly as reduce() does for float16 / bfloat16 buffers.

template <class F, class H>
void narrowLoop(void* dst, const float* src, size_t n, float scale) {
  static_assert(F::kLanes == H::kLanes, "float32 and 16-bit Vecs must share lanes");
  constexpr size_t L = F::kLanes;
  auto* d = static_cast<typename H::Storage*>(dst);
  const auto f = F::splat(scale);
  const bool mul = scale != 1.0f;
  size_t i = 0;
  for (; i + L <= n; i += L) {
    auto v = F::load(src + i);
    H::store(d + i, mul ? F::mul(v, f) : v);
  }
  if (i < n) {
    auto v = F::loadPartial(src + i, n - i);
    H::storePartial(d + i, mul ? F::mul(v, f) : v, n - i);
  }
}

template <class F, class H>
void widenLoop(float* dst, const void* src, size_t n) {
  constexpr size_t L = F::kLanes;
  const auto* s = static_cast<const typename H::Storage*>(src);
  size_t i = 0;
  for (; i + L <= n; i += L) F::store(dst + i, H::load(s + i));
  if (i < n) F::storePartial(dst + i, H::loadPartial(s + i, n - i), n - i);
}

template <class F, class H, class Op>
void widenReduceLoop(float* dst, const float* a, const void* b, size_t n, float scale) {
  constexpr size_t L = F::kLanes;
  const auto* w = static_cast<const typename H::Storage*>(b);
  const auto f = F::splat(scale);
  const bool mul = scale != 1.0f;
  size_t i = 0;
  for (; i + L <= n; i += L) {
    auto x = F::load(a + i);
    F::store(dst + i, Op::template apply<F>(mul ? F::mul(x, f) : x, H::load(w + i)));
  }
  if (i < n) {
    auto x = F::loadPartial(a + i, n - i);
    F::storePartial(dst + i,
                    Op::template apply<F>(mul ? F::mul(x, f) : x, H::loadPartial(w + i, n - i)),
                    n - i);
  }
}

template <class F, class H>
void roundTripLoop(float* data, size_t n) {
  constexpr size_t L = F::kLanes;
  typename H::Storage tmp[L];
  size_t i = 0;
  for (; i + L <= n; i += L) {
    H::store(tmp, F::load(data + i));
    F::store(data + i, H::load(tmp));
  }
  if (i < n) {
    H::storePartial(tmp, F::loadPartial(data + i, n - i), n - i);
    F::storePartial(data + i, H::loadPartial(tmp, n - i), n - i);
  }
}

template <template <class> class VecOf, class S>
void fillWire(WireTable* t, int w) {
  using F = VecOf<float>;
  using H = VecOf<S>;
  t->narrow[w] = &narrowLoop<F, H>;
  t->widen[w] = &widenLoop<F, H>;
  WidenReduceFn* row = t->reduce[w];
  row[static_cast<int>(ReduceOp::kSum)] = &widenReduceLoop<F, H, OpSum>;
  row[static_cast<int>(ReduceOp::kAverage)] = &widenReduceLoop<F, H, OpSum>;
  row[static_cast<int>(ReduceOp::kMin)] = &widenReduceLoop<F, H, OpMin>;
  row[static_cast<int>(ReduceOp::kMax)] = &widenReduceLoop<F, H, OpMax>;
  row[static_cast<int>(ReduceOp::kProduct)] = &widenReduceLoop<F, H, OpProduct>;
  t->round[w] = &roundTripLoop<F, H>;
}

template <template <class> class VecOf>
WireTable makeWireTable() {
  WireTable t{};
  fillWire<VecOf, Half>(&t, 0);
  fillWire<VecOf, BFloat16>(&t, 1);
  return t;
}

}  // namespace
}  // namespace detail
}  // namespace kernels
}  // namespace tfring
