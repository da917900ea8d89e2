// What the last collective of this process cost, whatever its kind: the
// counters behind _core.last_collective_stats() and the timeline's
// *_STATS events. Each kind's entry point (allreduce_select.cc,
// allgather_select.cc, broadcast_select.cc) records one entry per call.
//
//   hops        sequential message steps on the collective's critical path,
//               the same on every rank; where a rank sends several messages
//               one after the other (a tree's root), each counts as a step
//   bytes_sent  bytes this rank put on its links (ring channels, the
//               cross-host ring, point-to-point links); writes into the
//               shared host segment are not counted
#pragma once

#include <cstdint>

namespace tfring {
namespace collectives {

struct CollectiveStats {
  const char* collective = "allreduce";  // allreduce, allgather or broadcast
  const char* algo = "ring";
  int size = 1;
  uint64_t bytes = 0;  // the buffer: the whole output of an allgather
  uint64_t hops = 0;
  uint64_t bytes_sent = 0;
};

void recordCollective(const CollectiveStats& st);
CollectiveStats lastCollectiveStats();

}  // namespace collectives
}  // namespace tfring
