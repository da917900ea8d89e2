// Choosing the allgather algorithm (see allgather.h), and its counters.
// Only job-wide values enter the choice: the output's size (every rank
// knows every block's size), the topology, and rank 0's settings.
#include <atomic>

#include "collectives/allgather.h"
#include "collectives/allreduce.h"

namespace tfring {
namespace collectives {

static_assert(kNumAllgatherAlgos <= kMaxAlgos, "CommStats has no room for every algorithm");

const char* allgatherAlgoName(AllgatherAlgo a) {
  return a == AllgatherAlgo::kRecDbl ? "recdbl" : "ring";
}

uint64_t allgatherCalls(const CommStats& s, AllgatherAlgo a) {
  return s.allgather.calls(static_cast<int>(a));
}
uint64_t allgatherHops(const CommStats& s, AllgatherAlgo a) {
  return s.allgather.hops(static_cast<int>(a));
}
uint64_t allgatherBytesSent(const CommStats& s, AllgatherAlgo a) {
  return s.allgather.bytesSent(static_cast<int>(a));
}

AllgatherAlgo chooseAllgather(const RingComm& c, size_t total_bytes) {
  const transport::HostLinks* H = c.host;
  if (!H || c.size == 1) return AllgatherAlgo::kRing;
  const bool p2p = H->want_peers;
  const std::string& a = H->policy.allgather_algo;
  if (a == "recdbl") return p2p ? AllgatherAlgo::kRecDbl : AllgatherAlgo::kRing;
  if (a == "ring") return AllgatherAlgo::kRing;
  if (!recursiveAtScale(c)) return AllgatherAlgo::kRing;
  if (total_bytes <= static_cast<uint64_t>(H->policy.small_threshold))
    return AllgatherAlgo::kRecDbl;
  const bool one_per_host = H->num_hosts == c.size;
  return one_per_host && total_bytes <= kGatherRecursiveMaxBytes ? AllgatherAlgo::kRecDbl
                                                                 : AllgatherAlgo::kRing;
}

void allgather(RingComm& c, void* out, const std::vector<size_t>& rank_bytes) {
  size_t total = 0;
  for (size_t b : rank_bytes) total += b;
  const AllgatherAlgo a = chooseAllgather(c, total);
  CollectiveStats st;
  st.collective = "allgather";
  st.algo = allgatherAlgoName(a);
  st.size = c.size;
  st.bytes = total;
  if (c.size > 1 && total > 0) {
    if (a == AllgatherAlgo::kRecDbl) {
      recdblAllgather(c, out, rank_bytes, &st);
    } else {
      ringAllgather(c, out, rank_bytes);
      // Position p sends every block but that of position p+1
      // (allgather_ring.cc), on N-1 sequential steps.
      st.hops = static_cast<uint64_t>(c.size - 1);
      st.bytes_sent = total - rank_bytes[c.ring[(c.pos + 1) % c.size]];
    }
  } else if (c.size > 1 && a == AllgatherAlgo::kRing) {
    ringAllgather(c, out, rank_bytes);  // nothing moves; keeps the ring in lockstep
  }
  if (c.stats) c.stats->allgather.add(static_cast<int>(a), st.hops, st.bytes_sent);
  recordCollective(c.stats.get(), st);
}

}  // namespace collectives
}  // namespace tfring
