// CUDA emulation: the float16 conversions csrc/kernels/cuda uses, with
// CUDA's rounding (to nearest even, once, also from double). GCC's _Float16
// converts with exactly that rounding in software on x86-64.
#pragma once

#include <cstring>

struct __half {
  unsigned short x;
};

inline __half __ushort_as_half(unsigned short u) { return __half{u}; }
inline unsigned short __half_as_ushort(__half h) { return h.x; }

inline __half __tfring_emu_to_half(_Float16 v) {
  __half h;
  std::memcpy(&h.x, &v, sizeof h.x);
  return h;
}
inline float __half2float(__half h) {
  _Float16 v;
  std::memcpy(&v, &h.x, sizeof v);
  return static_cast<float>(v);
}
inline __half __float2half_rn(float f) { return __tfring_emu_to_half(static_cast<_Float16>(f)); }
inline __half __double2half(double d) { return __tfring_emu_to_half(static_cast<_Float16>(d)); }
