// Broadcast: the one entry point the executors call, choosing like
// allreduce() and allgather() from job-wide values only (the size, the
// topology, rank 0's TFRING_BROADCAST_ALGO and TFRING_SMALL_THRESHOLD):
//
//   ring     the pipelined ring (broadcast_ring.cc): N-1 hops for the first
//            chunk, then about one transfer time of the buffer; the choice
//            for large buffers.
//   tree     a binomial tree over point-to-point links (broadcast_tree.cc):
//            ceil(log2 N) hops (one more when the root is one of the ranks
//            the non-power-of-two fold pairs off); the choice for small
//            buffers at scale.
//   scatter_allgather  a binomial scatter of p blocks, then a
//            recursive-doubling allgather of them (broadcast_scatter.cc):
//            2 log2(p) hops (+1 or 2 for the fold, as the tree), about
//            twice the buffer per rank; for medium buffers at scale.
//
// auto, where the job is "at scale" (recursiveAtScale): tree up to the
// threshold, and up to kGatherRecursiveMaxBytes (allgather.h) when every
// host holds one rank; the ring otherwise. scatter_allgather runs only when
// forced: it measured no steady gain on one machine (docs/benchmarks.md).
#pragma once

#include <cstddef>
#include <cstdint>

#include "collectives/collective_stats.h"
#include "collectives/ring.h"

namespace tfring {
namespace collectives {

enum class BroadcastAlgo { kRing, kTree, kScatterAllgather };
constexpr int kNumBroadcastAlgos = 3;

const char* broadcastAlgoName(BroadcastAlgo a);
BroadcastAlgo chooseBroadcast(const RingComm& c, size_t bytes);

// Per algorithm over a communicator's calls: calls, hops and bytes sent.
uint64_t broadcastCalls(const CommStats& s, BroadcastAlgo a);
uint64_t broadcastHops(const CommStats& s, BroadcastAlgo a);
uint64_t broadcastBytesSent(const CommStats& s, BroadcastAlgo a);

// Same contract as ringBroadcast (ring.h): `data` on the root is sent, on
// every other rank overwritten.
void broadcast(RingComm& c, void* data, size_t bytes, int root_rank);

// The algorithm itself; callers go through broadcast().
// Where the root sits in the recursive layout of the point-to-point
// broadcasts (transport::RecursiveLayout): whether it is an extra rank
// folded into its partner (which then gets the buffer first), whether any
// other extra rank waits for the buffer at the end, and the virtual rank
// that holds the buffer inside the power-of-two group.
struct RootPlace {
  bool root_extra;
  bool other_extras;
  int vroot;
};
inline RootPlace rootPlace(int r, int root) {  // r: extra ranks (RecursiveLayout::r)
  return {root < 2 * r && root % 2 == 0, r > 1 || (r == 1 && root != 0),
          root < 2 * r ? root / 2 : root - r};
}

void treeBroadcast(RingComm& c, void* data, size_t bytes, int root_rank, CollectiveStats* st);
void scatterAllgatherBroadcast(RingComm& c, void* data, size_t bytes, int root_rank,
                               CollectiveStats* st);

}  // namespace collectives
}  // namespace tfring
