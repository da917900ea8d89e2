// Batched copies: up to 1024 (dst, src, bytes) triples in one launch (64
// before CUDA 12.1), so packing 300 small gradients into the fusion buffer
// costs one launch instead of 300 cudaMemcpyAsync calls.
//
// The copies are cut into 64 KiB tiles, one block per tile; the descriptor
// table travels as a kernel parameter and each block finds its copy by a
// binary search of the cumulative tile counts. Tiles whose source and
// destination are 16-byte aligned move uint4s; others fall back to words or
// bytes.
#include <vector>

#include "kernels/cuda/elements.cuh"
#include "kernels/cuda/kernels.h"

namespace tfring {
namespace kernels {
namespace cuda {
namespace detail {
namespace {

constexpr size_t kTile = 64 << 10;

// Up to N copies per launch, as a kernel parameter. CUDA 12.1+ allows 32 KB
// of parameters (Volta and newer), so many small tensors go in one launch;
// small batches use the small table so the launch stays cheap.
template <int N>
struct BatchParams {
  CopyDesc c[N];
  uint32_t tile_start[N + 1];  // cumulative; tile_start[n] = total
  int n;
};
constexpr int kSmallBatch = 64;
// Keeps the table in parameter space instead of copying it per thread.
#if CUDART_VERSION >= 11070
#define TFRING_GRID_CONSTANT __grid_constant__
#else
#define TFRING_GRID_CONSTANT
#endif
#if CUDART_VERSION >= 12010
constexpr int kLargeBatch = 1024;
#else
constexpr int kLargeBatch = 64;
#endif

template <int N>
__global__ void __launch_bounds__(kThreads) batchedCopyKernel(const TFRING_GRID_CONSTANT BatchParams<N> p) {
  const uint32_t tile = blockIdx.x;
  // Binary search: the last copy whose first tile is <= this one.
  int lo = 0, hi = p.n - 1;
  while (lo < hi) {
    int mid = (lo + hi + 1) / 2;
    if (p.tile_start[mid] <= tile) lo = mid;
    else hi = mid - 1;
  }
  const CopyDesc& c = p.c[lo];
  const size_t begin = static_cast<size_t>(tile - p.tile_start[lo]) * kTile;
  const size_t end = begin + kTile < c.bytes ? begin + kTile : c.bytes;
  char* d = static_cast<char*>(c.dst);
  const char* s = static_cast<const char*>(c.src);
  const uintptr_t both = reinterpret_cast<uintptr_t>(d) | reinterpret_cast<uintptr_t>(s);
  if (both % 16 == 0) {
    const size_t vend = end & ~static_cast<size_t>(15);  // begin is a multiple of 16
    const uint4* sv = reinterpret_cast<const uint4*>(s + begin);
    uint4* dv = reinterpret_cast<uint4*>(d + begin);
    const size_t nv = (vend - begin) / 16;
#pragma unroll 4
    for (size_t k = threadIdx.x; k < nv; k += blockDim.x) dv[k] = sv[k];
    for (size_t k = vend + threadIdx.x; k < end; k += blockDim.x) d[k] = s[k];
  } else if (both % 4 == 0) {
    const size_t wend = end & ~static_cast<size_t>(3);
    const uint32_t* sw = reinterpret_cast<const uint32_t*>(s + begin);
    uint32_t* dw = reinterpret_cast<uint32_t*>(d + begin);
    const size_t nw = (wend - begin) / 4;
    for (size_t k = threadIdx.x; k < nw; k += blockDim.x) dw[k] = sw[k];
    for (size_t k = wend + threadIdx.x; k < end; k += blockDim.x) d[k] = s[k];
  } else {
    for (size_t k = begin + threadIdx.x; k < end; k += blockDim.x) d[k] = s[k];
  }
}

// Launches copies[i..) in one kernel with a table of N; returns where it
// stopped.
template <int N>
size_t launchBatch(const CopyDesc* copies, size_t i, size_t n, Stream stream) {
  BatchParams<N> p;
  p.n = 0;
  uint32_t tiles = 0;
  for (; i < n && p.n < N; ++i) {
    if (copies[i].bytes == 0) continue;
    size_t t = (copies[i].bytes + kTile - 1) / kTile;
    if (static_cast<uint64_t>(tiles) + t > 0x7fffffffull) {  // grid limit: next launch
      if (p.n == 0)
        fail(Code::kInvalidArgument, "batched copy of ", copies[i].bytes, " bytes is too large");
      break;
    }
    p.c[p.n] = copies[i];
    p.tile_start[p.n] = tiles;
    tiles += static_cast<uint32_t>(t);
    ++p.n;
  }
  if (p.n == 0) return i;
  p.tile_start[p.n] = tiles;
  TFRING_LAUNCH(tiles, kThreads, stream, batchedCopyKernel<N>)(p);
  checkLaunch("batched copy");
  return i;
}

}  // namespace
}  // namespace detail

void batchedCopy(const CopyDesc* copies, size_t n, Stream stream) {
  size_t i = 0;
  while (i < n) {
    size_t left = 0;
    for (size_t j = i; j < n && left <= static_cast<size_t>(detail::kSmallBatch); ++j)
      left += copies[j].bytes != 0;
    i = left <= static_cast<size_t>(detail::kSmallBatch)
            ? detail::launchBatch<detail::kSmallBatch>(copies, i, n, stream)
            : detail::launchBatch<detail::kLargeBatch>(copies, i, n, stream);
  }
}

}  // namespace cuda
}  // namespace kernels
}  // namespace tfring
