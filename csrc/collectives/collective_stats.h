// What a communicator's collectives cost: the last one, whatever its kind,
// and totals per algorithm. The counters behind _core.last_collective_stats()
// and the timeline's *_STATS events. Each kind's entry point
// (allreduce_select.cc, allgather_select.cc, broadcast_select.cc) records
// one entry per call into its RingComm's CommStats; every communicator (the
// world, each process set) owns one, so a set's calls never show in the
// world's numbers, and a new world starts from zero.
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
#include <mutex>
#include <string>
#include <utility>

namespace tfring {
namespace collectives {

struct CollectiveStats {
  const char* collective = "allreduce";  // allreduce, allgather or broadcast
  const char* algo = "ring";
  int size = 1;
  uint64_t bytes = 0;  // the buffer: the whole output of an allgather
  uint64_t hops = 0;
  uint64_t bytes_sent = 0;
  const char* wire = "none";  // an allreduce's words on its links (types.h)
};

// One collective kind's totals per algorithm (N algorithms, indexed by the
// kind's enum): calls, hops and bytes sent, summed over a communicator's
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

// Room for every kind's algorithms (each *_select.cc checks its count).
constexpr int kMaxAlgos = 8;

// One communicator's statistics (shared by the copies of its RingComm).
class CommStats {
 public:
  // The last call of: any collective, an allreduce (with its algorithm's
  // enum value), the agreement round's vote (runtime/vote.h).
  enum Kind { kAny = 0, kAllreduce = 1, kVote = 2, kNumKinds = 3 };

  AlgoTotals<kMaxAlgos> allreduce, allgather, broadcast, vote;

  // GPU allreduces run by each algorithm of the CUDA-IPC backend (indexed
  // by gpu/cuda/peer_allreduce.h's PeerAlgo): behind
  // _core.gpu_allreduce_algorithms().
  void countGpuAllreduce(int algo) {
    gpu_allreduce_[algo].fetch_add(1, std::memory_order_relaxed);
  }
  uint64_t gpuAllreduces(int algo) const {
    return gpu_allreduce_[algo].load(std::memory_order_relaxed);
  }
  // The GPU backend its GPU collectives run on ("nccl", "ring-ipc",
  // "ring-host", "local"); "" before the first: behind _core.gpu_backend().
  void setGpuBackend(std::string name) {
    std::lock_guard<std::mutex> lk(mu_);
    gpu_backend_ = std::move(name);
  }
  std::string gpuBackend() const {
    std::lock_guard<std::mutex> lk(mu_);
    return gpu_backend_;
  }

  void setLast(Kind k, const CollectiveStats& st, int algo = 0) {
    std::lock_guard<std::mutex> lk(mu_);
    last_[k] = st;
    algo_[k] = algo;
  }
  CollectiveStats last(Kind k, int* algo = nullptr) const {
    std::lock_guard<std::mutex> lk(mu_);
    if (algo) *algo = algo_[k];
    return last_[k];
  }

 private:
  mutable std::mutex mu_;
  CollectiveStats last_[kNumKinds];
  int algo_[kNumKinds] = {};
  std::atomic<uint64_t> gpu_allreduce_[kMaxAlgos] = {};
  std::string gpu_backend_;
};

// Records `st` as the communicator's last collective (null: not recorded).
void recordCollective(CommStats* stats, const CollectiveStats& st);
CollectiveStats lastCollectiveStats(const CommStats& stats);

}  // namespace collectives
}  // namespace tfring
