// Executing a scheduled group. Every rank runs the same groups in the same
// order (agreement.h decides which, and when); an Executor turns one group
// into calls on the collectives: HostExecutor on host buffers (executor.cc,
// alltoall_join.cc), GpuExecutor on device buffers through the
// gpu::Executor of csrc/gpu (executor_gpu.cc).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "collectives/ring.h"
#include "gpu/executor.h"
#include "runtime/entry.h"
#include "runtime/messages.h"
#include "transport/ring_links.h"

namespace tfring {
namespace runtime {

class Timeline;

class Executor {
 public:
  virtual ~Executor() = default;
  // Runs group g over its entries es (in the group's order; a join's
  // result and an allgather's or alltoall's rows come in g.dim0s). A non-OK
  // status is a failure every rank reaches alike: the group fails, the job
  // goes on. A thrown Error is a local failure, fatal to the job.
  virtual Status run(const Group& g, const Entries& es) = 0;
};

// Host buffers: fusion of allreduces, output allocation for allgather,
// reducescatter and alltoall, and the ring collectives.
class HostExecutor : public Executor {
 public:
  HostExecutor(collectives::RingComm& comm, int rank, Timeline& timeline,
               int64_t fusion_threshold)
      : comm_(comm), rank_(rank), timeline_(timeline), fusion_threshold_(fusion_threshold) {}
  Status run(const Group& g, const Entries& es) override;

 private:
  void allreduce(const Entries& es);
  void allgather(Entry& e, const std::vector<int64_t>& dim0s);
  void broadcast(Entry& e);
  void reducescatter(Entry& e);
  // alltoall_join.cc: `splits` is the size x size matrix, rank-major.
  void alltoall(Entry& e, const std::vector<int64_t>& splits);

  collectives::RingComm& comm_;
  const int rank_;
  Timeline& timeline_;
  const int64_t fusion_threshold_;
  std::vector<char> fusion_;   // packing for the non-ring allreduces
  std::vector<char> scratch_;  // reducescatter reduces here
};

// GPU tensors (Request.device >= 0): the same shapes and allocation rules,
// the data path in the gpu::Executor, which every rank creates together at
// its first GPU group (the backend choice is a collective decision). In a
// build without CUDA, accept() refuses GPU tensors at enqueue, so run() is
// never reached.
class GpuExecutor : public Executor {
 public:
  GpuExecutor(collectives::RingComm& comm, const transport::Topology& topo, double timeout_s,
              RankLabels labels)
      : comm_(comm), topo_(topo), timeout_s_(timeout_s), labels_(std::move(labels)) {}
  // On the submitting thread, at enqueue: whether CUDA can serve the
  // tensor; records the event its input is ready at.
  static Status accept(Entry& e);
  Status run(const Group& g, const Entries& es) override;
  // The GPU executor's stream (a cudaStream_t), once its first group made
  // it; null before.
  void* stream() const { return stream_.load(); }

 private:
  collectives::RingComm& comm_;
  const transport::Topology& topo_;
  const double timeout_s_;
  const RankLabels labels_;  // the communicator's (its messages name global ranks)
  std::unique_ptr<gpu::Executor> gpu_;  // created at the first GPU group
  std::atomic<void*> stream_{nullptr};  // gpu_'s stream
  // A job of one runs GPU tensors without a producer stream inline on the
  // caller's thread and the rest on the engine thread: one at a time.
  std::mutex mu_;
};

// Which executor runs a group: the GPU one for GPU tensors.
struct Executors {
  Executor* host = nullptr;
  Executor* gpu = nullptr;
  Executor& of(const Entries& es) const {
    return !es.empty() && es[0]->req.device >= 0 ? *gpu : *host;
  }
};

}  // namespace runtime
}  // namespace tfring
