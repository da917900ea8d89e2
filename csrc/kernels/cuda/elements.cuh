// Internal to kernels/cuda: element types, the reduce ops and the launch
// helpers shared by reduce.cu, cast.cu and copy.cu.
//
// Every storage type S has an Elem<S> with
//   using Acc;                 what the arithmetic runs on
//   load(S) -> Acc, store(Acc) -> S
//   kFloating
// and the ops below work on Accs. float16/bfloat16 are stored as raw bits
// (Half/BF16) so that host code never needs cuda_fp16.h.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "common/status.h"
#include "common/types.h"

namespace tfring {
namespace kernels {
namespace cuda {
namespace detail {

struct Half {
  uint16_t bits;
};
struct BF16 {
  uint16_t bits;
};
struct Bool {
  uint8_t value;
};

template <class S>
struct Elem {  // float, double and the integers
  using Acc = S;
  static constexpr bool kFloating = std::is_floating_point<S>::value;
  __device__ static Acc load(S v) { return v; }
  __device__ static S store(Acc v) { return v; }
};
template <>
struct Elem<Half> {
  using Acc = float;
  static constexpr bool kFloating = true;
  __device__ static float load(Half v) { return __half2float(__ushort_as_half(v.bits)); }
  __device__ static Half store(float v) { return Half{__half_as_ushort(__float2half_rn(v))}; }
};
template <>
struct Elem<BF16> {
  using Acc = float;
  static constexpr bool kFloating = true;
  __device__ static float load(BF16 v) {
    return __uint_as_float(static_cast<uint32_t>(v.bits) << 16);
  }
  // Round to nearest even; a NaN keeps its sign and high payload, quieted.
  __device__ static BF16 store(float v) {
    uint32_t b = __float_as_uint(v);
    if ((b & 0x7fffffffu) > 0x7f800000u) return BF16{static_cast<uint16_t>((b >> 16) | 0x40u)};
    return BF16{static_cast<uint16_t>((b + 0x7fffu + ((b >> 16) & 1u)) >> 16)};
  }
};
template <>
struct Elem<Bool> {
  using Acc = uint8_t;
  static constexpr bool kFloating = false;
  __device__ static uint8_t load(Bool v) { return v.value != 0; }
  __device__ static Bool store(uint8_t v) { return Bool{static_cast<uint8_t>(v != 0)}; }
};

// Integer add/multiply in the unsigned type of the same width: wraps
// without undefined behaviour.
template <class T>
__device__ T wrapAdd(T a, T b) {
  using U = typename std::make_unsigned<T>::type;
  return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
}
template <class T>
__device__ T wrapMul(T a, T b) {
  using U = typename std::make_unsigned<T>::type;
  using W = typename std::conditional<(sizeof(T) < sizeof(unsigned)), unsigned, U>::type;
  return static_cast<T>(static_cast<U>(static_cast<W>(static_cast<U>(a)) *
                                       static_cast<W>(static_cast<U>(b))));
}

template <class S>
struct Ops {
  using E = Elem<S>;
  using A = typename E::Acc;
  static constexpr bool kBool = std::is_same<S, Bool>::value;
  static constexpr bool kFloat = E::kFloating;

  __device__ static A sum(A a, A b) {
    if constexpr (kBool) return a | b;
    else if constexpr (kFloat) return a + b;
    else return wrapAdd(a, b);
  }
  __device__ static A product(A a, A b) {
    if constexpr (kBool) return a & b;
    else if constexpr (kFloat) return a * b;
    else return wrapMul(a, b);
  }
  __device__ static A min(A a, A b) {
    if constexpr (kBool) return a & b;
    else if constexpr (kFloat) return (a != a) ? a : (a < b ? a : b);
    else return a < b ? a : b;
  }
  __device__ static A max(A a, A b) {
    if constexpr (kBool) return a | b;
    else if constexpr (kFloat) return (a != a) ? a : (a > b ? a : b);
    else return a > b ? a : b;
  }
};

struct OpSum {
  template <class S>
  __device__ static typename Elem<S>::Acc apply(typename Elem<S>::Acc a, typename Elem<S>::Acc b) {
    return Ops<S>::sum(a, b);
  }
};
struct OpProduct {
  template <class S>
  __device__ static typename Elem<S>::Acc apply(typename Elem<S>::Acc a, typename Elem<S>::Acc b) {
    return Ops<S>::product(a, b);
  }
};
struct OpMin {
  template <class S>
  __device__ static typename Elem<S>::Acc apply(typename Elem<S>::Acc a, typename Elem<S>::Acc b) {
    return Ops<S>::min(a, b);
  }
};
struct OpMax {
  template <class S>
  __device__ static typename Elem<S>::Acc apply(typename Elem<S>::Acc a, typename Elem<S>::Acc b) {
    return Ops<S>::max(a, b);
  }
};

// Integer scaling: in double, truncated toward zero, saturating, NaN -> 0.
// (std::numeric_limits is host-only code for nvcc.)
template <class T>
struct IntRange {
  static constexpr bool kSigned = static_cast<T>(-1) < static_cast<T>(0);
  static constexpr T kMax =
      kSigned ? static_cast<T>((static_cast<typename std::make_unsigned<T>::type>(~0ull) >> 1))
              : static_cast<T>(~0ull);
  static constexpr T kMin = kSigned ? static_cast<T>(-kMax - 1) : static_cast<T>(0);
};

template <class T>
__device__ T truncFromDouble(double v) {
  const double lo = static_cast<double>(IntRange<T>::kMin);
  const double hi = static_cast<double>(IntRange<T>::kMax);
  if (!(v == v)) return 0;
  if (v <= lo) return IntRange<T>::kMin;
  if (v >= hi) return IntRange<T>::kMax;
  return static_cast<T>(v);
}

// The factor as the kernels apply it: floats multiply in their own
// precision (float16/bfloat16 in float32), integers in double.
template <class S>
struct Factor {
  using type = typename std::conditional<Elem<S>::kFloating, typename Elem<S>::Acc, double>::type;
};

template <class S>
__device__ S scaleOne(S v, typename Factor<S>::type f) {
  using E = Elem<S>;
  if constexpr (std::is_same<S, Bool>::value) {
    return Bool{static_cast<uint8_t>(v.value != 0 && f != 0.0)};
  } else if constexpr (E::kFloating) {
    return E::store(E::load(v) * f);
  } else {
    return truncFromDouble<S>(static_cast<double>(v) * f);
  }
}

// Sixteen bytes of elements, for vectorized loads and stores.
template <class S>
struct Pack16 {
  static constexpr int kN = 16 / sizeof(S);
  union {
    uint4 raw;
    S e[kN];
  };
};

// Launch geometry: grid-stride loops, at most a few waves of blocks.
constexpr int kThreads = 256;
int maxBlocks();  // per current device, cached (launch.cc section of reduce.cu)

inline unsigned blocksFor(size_t work_items) {
  size_t b = (work_items + kThreads - 1) / kThreads;
  size_t cap = static_cast<size_t>(maxBlocks());
  if (b > cap) b = cap;
  if (b == 0) b = 1;
  return static_cast<unsigned>(b);
}

// kernel<<<grid, block, 0, stream>>>(args...) is written
// TFRING_LAUNCH(grid, block, stream, kernel)(args...): under nvcc it is that
// launch; the CUDA emulation build (tests/cuda_emu) queues the grid on the
// stream's host thread instead.
#ifdef TFRING_CUDA_EMULATION
#define TFRING_LAUNCH(grid, block, stream, ...) \
  ::tfring_emu::launcher(grid, block, stream, __VA_ARGS__)
#else
#define TFRING_LAUNCH(grid, block, stream, ...) __VA_ARGS__<<<grid, block, 0, stream>>>
#endif

inline void checkLaunch(const char* what) {
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess)
    fail(Code::kInternal, "CUDA kernel launch failed (", what, "): ", cudaGetErrorString(e));
}

// Elements before `p` reaches a 16-byte boundary, or SIZE_MAX when it never
// will (p not even element-aligned).
template <class S>
inline size_t headToAlign(const void* p) {
  uintptr_t a = reinterpret_cast<uintptr_t>(p);
  size_t mis = a % 16;
  if (mis % sizeof(S) != 0) return SIZE_MAX;
  return ((16 - mis) % 16) / sizeof(S);
}

inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace detail
}  // namespace cuda
}  // namespace kernels
}  // namespace tfring
