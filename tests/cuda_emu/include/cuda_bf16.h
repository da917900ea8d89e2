// CUDA emulation: the bfloat16 conversions csrc/kernels/cuda uses, with
// CUDA's rounding: to nearest even, once, also from double.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

struct __nv_bfloat16 {
  unsigned short x;
};

inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 h) { return h.x; }

// double -> float rounding to odd (truncate, then set the last bit if
// anything was dropped), then float -> bfloat16 to nearest even: float keeps
// 16 more bits than bfloat16, so the two steps round like one.
inline __nv_bfloat16 __double2bfloat16(double d) {
  float f = static_cast<float>(d);
  uint32_t b;
  std::memcpy(&b, &f, sizeof b);
  if (std::isnan(d)) return __nv_bfloat16{static_cast<unsigned short>((b >> 16) | 0x40u)};
  if (static_cast<double>(f) != d) {
    if (std::fabs(static_cast<double>(f)) > std::fabs(d)) b -= 1;  // toward zero
    b |= 1u;
  }
  return __nv_bfloat16{static_cast<unsigned short>((b + 0x7fffu + ((b >> 16) & 1u)) >> 16)};
}
