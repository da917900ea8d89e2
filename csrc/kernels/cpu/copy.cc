#include "kernels/cpu/copy.h"

#include <cstdint>
#include <cstring>

#if defined(__x86_64__) || defined(_M_X64)
#include <emmintrin.h>
#define TFRING_STREAM_STORES 1
#endif

namespace tfring {
namespace kernels {

void streamFence() {
#ifdef TFRING_STREAM_STORES
  _mm_sfence();
#endif
}

void copyStreaming(void* dst, const void* src, size_t n, bool fence) {
#ifdef TFRING_STREAM_STORES
  // Below a few lines the fence costs more than the read for ownership.
  if (n < 1024) {
    std::memcpy(dst, src, n);
    return;
  }
  char* d = static_cast<char*>(dst);
  const char* s = static_cast<const char*>(src);
  // Head: up to the destination's next 16-byte boundary (stream stores
  // need an aligned destination; the source may be anywhere).
  const size_t head = (16 - (reinterpret_cast<uintptr_t>(d) & 15)) & 15;
  std::memcpy(d, s, head);
  d += head;
  s += head;
  n -= head;
  size_t i = 0;
  for (; i + 64 <= n; i += 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 32));
    const __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 48), e);
  }
  std::memcpy(d + i, s + i, n - i);
  if (fence) _mm_sfence();
#else
  std::memcpy(dst, src, n);
#endif
}

}  // namespace kernels
}  // namespace tfring
