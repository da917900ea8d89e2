// The dispatcher, the portable (scalar) kernel set and the float16/bfloat16
// conversions. The vectorized sets live in reduce_avx2.cc and
// reduce_avx512.cc; reduce_kernels.h explains how all of them are generated.
#include "kernels/cpu/reduce.h"

#include <atomic>
#include <cstring>
#include <string>
#include <type_traits>

#include "common/tunables.h"
#include "common/logging.h"
#include "kernels/cpu/reduce_kernels.h"

namespace tfring {
namespace kernels {
namespace {

using detail::BFloat16;
using detail::Bool;
using detail::Half;
using detail::KernelTable;

uint32_t floatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

float bitsFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// Conversions, bit-exact with the F16C instructions (VCVTPH2PS, and
// VCVTPS2PH rounding to nearest even) so that every kernel set agrees,
// NaN payloads included: a NaN keeps the top of its payload and gets its
// quiet bit set.
float halfBitsToFloat(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1Fu;
  uint32_t mant = h & 0x3FFu;
  if (exp == 0x1F)  // inf or NaN
    return bitsFloat(sign | 0x7F800000u | (mant << 13) | (mant ? 0x00400000u : 0));
  if (exp == 0) {  // zero or subnormal: mant * 2^-24, exact in float
    float v = static_cast<float>(mant) * 5.9604644775390625e-8f;
    return bitsFloat(sign | floatBits(v));
  }
  return bitsFloat(sign | ((exp + 112) << 23) | (mant << 13));
}

uint16_t floatToHalfBits(float f) {
  uint32_t bits = floatBits(f);
  uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  uint32_t abs = bits & 0x7FFFFFFFu;
  if (abs > 0x7F800000u)  // NaN
    return sign | 0x7E00u | static_cast<uint16_t>((abs & 0x7FFFFFu) >> 13);
  if (abs >= 0x477FF000u)  // >= 65520 rounds to inf (and inf itself)
    return sign | 0x7C00u;
  if (abs < 0x38800000u) {  // below 2^-14: a half subnormal or zero
    uint32_t e = abs >> 23;
    if (e < 102) return sign;  // below 2^-25: rounds to zero
    uint32_t m = (abs & 0x7FFFFFu) | 0x800000u;
    uint32_t shift = 126 - e;  // units of 2^-24
    uint32_t r = m >> shift;
    uint32_t rem = m & ((1u << shift) - 1);
    uint32_t halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (r & 1))) ++r;
    return sign | static_cast<uint16_t>(r);
  }
  uint32_t r = abs - (112u << 23);  // rebias the exponent, 127 -> 15
  r = (r + 0xFFFu + ((r >> 13) & 1)) >> 13;
  return sign | static_cast<uint16_t>(r);
}

float bf16BitsToFloat(uint16_t h) { return bitsFloat(static_cast<uint32_t>(h) << 16); }

uint16_t floatToBf16Bits(float f) {
  uint32_t bits = floatBits(f);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u)  // NaN: keep it one
    return static_cast<uint16_t>((bits >> 16) | 0x40u);
  return static_cast<uint16_t>((bits + 0x7FFFu + ((bits >> 16) & 1)) >> 16);
}

// ------------------------------------------------------ scalar kernels ----

// Plain C++ types: float, double and the integers.
template <class T>
struct ScalarVec : detail::BufferedTail<T, 1, ScalarVec<T>> {
  using Storage = T;
  using Reg = T;
  static constexpr size_t kLanes = 1;
  static constexpr bool kFloating = std::is_floating_point_v<T>;

  static Reg load(const T* p) { return *p; }
  static void store(T* p, Reg v) { *p = v; }
  static Reg splat(double f) { return static_cast<T>(f); }

  static Reg add(Reg a, Reg b) {
    if constexpr (kFloating) {
      return a + b;
    } else {  // wrap without signed overflow
      using U = std::make_unsigned_t<T>;
      return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
    }
  }
  static Reg mul(Reg a, Reg b) {
    if constexpr (kFloating) {
      return a * b;
    } else {
      using U = std::make_unsigned_t<T>;
      // Multiply in unsigned int at least: 8- and 16-bit operands would
      // otherwise promote to (signed) int, and 65535 * 65535 overflows it.
      using W = std::conditional_t<(sizeof(T) < sizeof(unsigned)), unsigned, U>;
      return static_cast<T>(static_cast<U>(static_cast<W>(static_cast<U>(a)) *
                                           static_cast<W>(static_cast<U>(b))));
    }
  }
  static Reg min(Reg a, Reg b) {
    if constexpr (kFloating)
      if (a != a) return a;
    return a < b ? a : b;
  }
  static Reg max(Reg a, Reg b) {
    if constexpr (kFloating)
      if (a != a) return a;
    return a > b ? a : b;
  }
};

// float16 / bfloat16: float32 arithmetic, one rounding on the way back.
template <class S, float (*kToFloat)(uint16_t), uint16_t (*kFromFloat)(float)>
struct ScalarNarrowVec : ScalarVec<float> {
  using Storage = S;
  using Reg = float;
  static constexpr size_t kLanes = 1;

  static Reg load(const S* p) { return kToFloat(p->bits); }
  static void store(S* p, Reg v) { p->bits = kFromFloat(v); }
  static Reg loadPartial(const S* p, size_t) { return load(p); }
  static void storePartial(S* p, Reg v, size_t) { store(p, v); }
};

struct ScalarBoolVec : detail::BufferedTail<Bool, 1, ScalarBoolVec> {
  using Storage = Bool;
  using Reg = uint8_t;  // 0 or 1
  static constexpr size_t kLanes = 1;
  static constexpr bool kFloating = false;

  static Reg load(const Bool* p) { return p->value != 0; }
  static void store(Bool* p, Reg v) { p->value = v; }
  static Reg add(Reg a, Reg b) { return a | b; }
  static Reg max(Reg a, Reg b) { return a | b; }
  static Reg mul(Reg a, Reg b) { return a & b; }
  static Reg min(Reg a, Reg b) { return a & b; }
};

template <class S>
struct ScalarVecOf {
  using type = ScalarVec<S>;
};
template <>
struct ScalarVecOf<Half> {
  using type = ScalarNarrowVec<Half, halfBitsToFloat, floatToHalfBits>;
};
template <>
struct ScalarVecOf<BFloat16> {
  using type = ScalarNarrowVec<BFloat16, bf16BitsToFloat, floatToBf16Bits>;
};
template <>
struct ScalarVecOf<Bool> {
  using type = ScalarBoolVec;
};
template <class S>
using ScalarVecFor = typename ScalarVecOf<S>::type;

// ---------------------------------------------------------- dispatcher ----

// Kernel sets from slowest to fastest.
constexpr const char* kIsaNames[] = {"scalar", "avx2", "avx512"};
constexpr int kNumIsas = 3;

int isaIndex(const char* name) {
  for (int i = 0; i < kNumIsas; ++i)
    if (name && std::strcmp(name, kIsaNames[i]) == 0) return i;
  return -1;
}

bool cpuSupports(int isa) {
  if (isa == 0) return true;
#ifdef TFRING_X86
  __builtin_cpu_init();
  if (isa == 1)
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
           __builtin_cpu_supports("f16c");
  if (isa == 2)
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
#endif
  return false;
}

const KernelTable* tableFor(int isa) {
#ifdef TFRING_X86
  if (isa == 2) return detail::avx512Kernels();
  if (isa == 1) return detail::avx2Kernels();
#endif
  return detail::scalarKernels();
}

// The best set this CPU runs, or a lower one forced by TFRING_CPU_ISA (for
// testing the portable paths on a machine that has the fast ones).
const KernelTable* pickAtStartup() {
  int best = 0;
  for (int i = kNumIsas - 1; i > 0; --i)
    if (cpuSupports(i)) {
      best = i;
      break;
    }
  // The kernels may be picked before init (which rejects a bad value), so
  // a bad value here is a warning.
  std::string forced;
  try {
    forced = tunables::getString("TFRING_CPU_ISA");
  } catch (const Error& e) {
    TFRING_LOG(kWarning, e.status().message(), "; using ", kIsaNames[best]);
  }
  if (!forced.empty()) {
    int want = isaIndex(forced.c_str());
    if (want > best) {
      TFRING_LOG(kWarning, "TFRING_CPU_ISA=", forced, " is not supported by this ",
                 "CPU or build; using ", kIsaNames[best]);
    } else {
      best = want;
    }
  }
  return tableFor(best);
}

std::atomic<const KernelTable*> g_override{nullptr};

const KernelTable& active() {
  static const KernelTable* const startup = pickAtStartup();
  const KernelTable* t = g_override.load(std::memory_order_acquire);
  return t ? *t : *startup;
}

}  // namespace

namespace detail {
const KernelTable* scalarKernels() {
  static const WireTable wire = makeWireTable<ScalarVecFor>();
  static const KernelTable table = [] {
    KernelTable t = makeTable<ScalarVecFor>("scalar");
    t.wire = &wire;
    return t;
  }();
  return &table;
}

const WireTable& activeWire() { return *active().wire; }
}  // namespace detail

void reduce(void* dst, const void* src, size_t count, DataType dtype, ReduceOp op) {
  if (count == 0) return;
  active().binary[static_cast<int>(dtype)][static_cast<int>(op)](dst, dst, src, count);
}

void reduce3(void* dst, const void* a, const void* b, size_t count, DataType dtype,
             ReduceOp op) {
  if (count == 0) return;
  active().binary[static_cast<int>(dtype)][static_cast<int>(op)](dst, a, b, count);
}

void scale(void* data, size_t count, DataType dtype, double factor) {
  if (count == 0 || factor == 1.0) return;
  active().scale[static_cast<int>(dtype)](data, count, factor);
}

const char* isaName() { return active().name; }

bool isaSupported(const char* name) {
  int i = isaIndex(name);
  return i >= 0 && cpuSupports(i);
}

bool setIsa(const char* name) {
  if (name == nullptr || *name == '\0') {
    g_override.store(nullptr, std::memory_order_release);
    return true;
  }
  if (!isaSupported(name)) return false;
  g_override.store(tableFor(isaIndex(name)), std::memory_order_release);
  return true;
}

float halfToFloat(uint16_t h) { return halfBitsToFloat(h); }
uint16_t floatToHalf(float f) { return floatToHalfBits(f); }
float bf16ToFloat(uint16_t h) { return bf16BitsToFloat(h); }
uint16_t floatToBf16(float f) { return floatToBf16Bits(f); }

}  // namespace kernels
}  // namespace tfring
