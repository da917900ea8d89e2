// Choosing the broadcast algorithm (see broadcast.h), and its counters.
#include <atomic>

#include "collectives/allgather.h"
#include "collectives/allreduce.h"
#include "collectives/broadcast.h"

namespace tfring {
namespace collectives {

static_assert(kNumBroadcastAlgos <= kMaxAlgos, "CommStats has no room for every algorithm");

const char* broadcastAlgoName(BroadcastAlgo a) {
  switch (a) {
    case BroadcastAlgo::kRing: return "ring";
    case BroadcastAlgo::kTree: return "tree";
    case BroadcastAlgo::kScatterAllgather: return "scatter_allgather";
  }
  return "?";
}

uint64_t broadcastCalls(const CommStats& s, BroadcastAlgo a) {
  return s.broadcast.calls(static_cast<int>(a));
}
uint64_t broadcastHops(const CommStats& s, BroadcastAlgo a) {
  return s.broadcast.hops(static_cast<int>(a));
}
uint64_t broadcastBytesSent(const CommStats& s, BroadcastAlgo a) {
  return s.broadcast.bytesSent(static_cast<int>(a));
}

BroadcastAlgo chooseBroadcast(const RingComm& c, size_t bytes) {
  const transport::HostLinks* H = c.host;
  if (!H || c.size == 1) return BroadcastAlgo::kRing;
  const bool p2p = H->want_peers;
  if (H->policy.broadcast_algo == "tree") return p2p ? BroadcastAlgo::kTree : BroadcastAlgo::kRing;
  if (H->policy.broadcast_algo == "scatter_allgather")
    return p2p ? BroadcastAlgo::kScatterAllgather : BroadcastAlgo::kRing;
  if (H->policy.broadcast_algo == "ring") return BroadcastAlgo::kRing;
  if (!recursiveAtScale(c)) return BroadcastAlgo::kRing;
  if (bytes <= static_cast<uint64_t>(H->policy.small_threshold)) return BroadcastAlgo::kTree;
  const bool one_per_host = H->num_hosts == c.size;
  return one_per_host && bytes <= kGatherRecursiveMaxBytes ? BroadcastAlgo::kTree
                                                           : BroadcastAlgo::kRing;
}

void broadcast(RingComm& c, void* data, size_t bytes, int root_rank) {
  const BroadcastAlgo a = chooseBroadcast(c, bytes);
  CollectiveStats st;
  st.collective = "broadcast";
  st.algo = broadcastAlgoName(a);
  st.size = c.size;
  st.bytes = bytes;
  if (a == BroadcastAlgo::kTree) {
    if (bytes > 0) treeBroadcast(c, data, bytes, root_rank, &st);
  } else if (a == BroadcastAlgo::kScatterAllgather) {
    if (bytes > 0) scatterAllgatherBroadcast(c, data, bytes, root_rank, &st);
  } else {
    ringBroadcast(c, data, bytes, root_rank);
    if (c.size > 1 && bytes > 0) {
      // The chain from the root round the ring: every position but the
      // root's left neighbour forwards the whole buffer.
      int root_pos = 0;
      for (int i = 0; i < c.size; ++i)
        if (c.ring[i] == root_rank) root_pos = i;
      const int N = c.size, dist = ((c.pos - root_pos) % N + N) % N;
      st.hops = static_cast<uint64_t>(N - 1);
      st.bytes_sent = dist < N - 1 ? bytes : 0;
    }
  }
  if (c.stats) c.stats->broadcast.add(static_cast<int>(a), st.hops, st.bytes_sent);
  recordCollective(c.stats.get(), st);
}

}  // namespace collectives
}  // namespace tfring
