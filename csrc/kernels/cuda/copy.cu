// Batched copies: up to kMaxBatchCopies (dst, src, bytes) triples in one
// launch, so packing 300 small gradients into the fusion buffer costs a
// handful of launches instead of 300 cudaMemcpyAsync calls.
//
// The copies are cut into 64 KiB tiles, one block per tile; the descriptor
// table travels as a kernel parameter and each block finds its copy with a
// short scan of the cumulative tile counts. Tiles whose source and
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

struct BatchParams {
  CopyDesc c[kMaxBatchCopies];
  uint32_t tile_start[kMaxBatchCopies + 1];  // cumulative; tile_start[n] = total
  int n;
};

__global__ void __launch_bounds__(kThreads) batchedCopyKernel(const BatchParams p) {
  const uint32_t tile = blockIdx.x;
  int i = 0;
  while (i + 1 < p.n && p.tile_start[i + 1] <= tile) ++i;
  const CopyDesc& c = p.c[i];
  const size_t begin = static_cast<size_t>(tile - p.tile_start[i]) * kTile;
  const size_t end = begin + kTile < c.bytes ? begin + kTile : c.bytes;
  char* d = static_cast<char*>(c.dst);
  const char* s = static_cast<const char*>(c.src);
  const uintptr_t both = reinterpret_cast<uintptr_t>(d) | reinterpret_cast<uintptr_t>(s);
  if (both % 16 == 0) {
    const size_t vend = end & ~static_cast<size_t>(15);  // begin is a multiple of 16
    const uint4* sv = reinterpret_cast<const uint4*>(s + begin);
    uint4* dv = reinterpret_cast<uint4*>(d + begin);
    const size_t nv = (vend - begin) / 16;
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

}  // namespace
}  // namespace detail

void batchedCopy(const CopyDesc* copies, size_t n, Stream stream) {
  using detail::BatchParams;
  using detail::kTile;
  size_t i = 0;
  while (i < n) {
    BatchParams p{};
    p.n = 0;
    uint32_t tiles = 0;
    for (; i < n && p.n < kMaxBatchCopies; ++i) {
      if (copies[i].bytes == 0) continue;
      size_t t = (copies[i].bytes + kTile - 1) / kTile;
      if (static_cast<uint64_t>(tiles) + t > 0x7fffffffull) break;  // grid limit; next launch
      p.c[p.n] = copies[i];
      p.tile_start[p.n] = tiles;
      tiles += static_cast<uint32_t>(t);
      ++p.n;
    }
    if (p.n == 0) {
      if (i < n) fail(Code::kInvalidArgument, "batched copy of ", copies[i].bytes, " bytes is too large");
      continue;
    }
    p.tile_start[p.n] = tiles;
    detail::batchedCopyKernel<<<tiles, detail::kThreads, 0, stream>>>(p);
    detail::checkLaunch("batched copy");
  }
}

}  // namespace cuda
}  // namespace kernels
}  // namespace tfring
