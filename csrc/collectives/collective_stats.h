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

#include <atomic>
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

// One collective kind's totals per algorithm (N algorithms, indexed by the
// kind's enum): calls, hops and bytes sent, summed over this process's
// calls. Behind _core.allreduce_algorithm_stats() and
// collective_algorithm_stats().
template <int N>
class AlgoTotals {
 public:
  void add(int algo, uint64_t hops, uint64_t bytes_sent) {
    calls_[algo].fetch_add(1, std::memory_order_relaxed);
    hops_[algo].fetch_add(hops, std::memory_order_relaxed);
    sent_[algo].fetch_add(bytes_sent, std::memory_order_relaxed);
  }
  uint64_t calls(int algo) const { return calls_[algo].load(std::memory_order_relaxed); }
  uint64_t hops(int algo) const { return hops_[algo].load(std::memory_order_relaxed); }
  uint64_t bytesSent(int algo) const { return sent_[algo].load(std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> calls_[N] = {};
  std::atomic<uint64_t> hops_[N] = {};
  std::atomic<uint64_t> sent_[N] = {};
};
CollectiveStats lastCollectiveStats();

}  // namespace collectives
}  // namespace tfring
