// Kernels of the peer-read allreduces (gpu/cuda/peer_allreduce.cc): every
// rank of one host has mapped every other rank's staging buffer (CUDA IPC)
// and reads it directly, on one GPU or across GPUs with peer access.
//
//   peerBarrier  every rank publishes `value` in its own flag word, then
//                waits until every peer's flag has reached it: one thread
//                per rank, each first storing this rank's flag (so the
//                threads may run in any order, as they do under the CUDA
//                emulation), then polling its peer's flag with volatile
//                loads, fenced at system scope on both sides so the data
//                written before the flag is visible once it is seen. Bounded:
//                gives up when *abort becomes nonzero (the host saw a dead
//                peer) or after timeout_ns, writing 1 + the peer's rank into
//                *status, so a dead peer is an error, never a hung GPU.
//   peerReduce   dst[i] = op over ranks 0..n-1 in rank order of srcs[r][i],
//                then * factor (every rank adds in the same order, so every
//                rank gets the same bits; float16/bfloat16 round after
//                each op, like the CPU kernels).
//
// Only built with CUDA; the header needs no CUDA headers.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/types.h"
#include "kernels/cuda/kernels.h"

namespace tfring {
namespace kernels {
namespace cuda {

constexpr int kMaxPeers = 8;

struct PeerFlags {
  uint64_t* flag[kMaxPeers];  // rank r's flag word, mapped here
  int n = 0;
  int me = 0;
};

void peerBarrier(const PeerFlags& flags, uint64_t value, const int32_t* abort, int32_t* status,
                 uint64_t timeout_ns, Stream stream);

struct PeerSrcs {
  const void* src[kMaxPeers];  // rank r's buffer, mapped here
  int n = 0;
};

// Elements [begin, begin + count) of every source, reduced into dst[begin..).
// dst may be one of the sources (each element is read before it is written).
void peerReduce(void* dst, const PeerSrcs& srcs, size_t begin, size_t count, DataType dtype,
                ReduceOp op, double factor, Stream stream);

}  // namespace cuda
}  // namespace kernels
}  // namespace tfring
