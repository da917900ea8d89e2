// LocalComm (one rank) and HostRingComm: device data staged through pinned
// host memory and reduced by the CPU ring collectives over the job's
// ordinary links (shared memory on a host, TCP across hosts). The simplest
// backend that works everywhere; NCCL or the CUDA-IPC ring are preferred
// where they work.
#include <cstring>

#include "collectives/allreduce.h"
#include "collectives/ring.h"
#include "common/status.h"
#include "gpu/cuda/comm.h"
#include "gpu/cuda/cuda_util.h"
#include "kernels/cuda/kernels.h"
#include "transport/ring_links.h"

namespace tfring {
namespace gpu {

std::vector<char> hostAllgather(const HostLink& h, const void* mine, size_t bytes) {
  const int n = h.topo->size, me = h.topo->rank;
  std::vector<char> all(bytes * n);
  if (bytes) std::memcpy(all.data() + bytes * me, mine, bytes);
  if (n > 1) collectives::ringAllgather(*h.comm, all.data(), std::vector<size_t>(n, bytes));
  return all;
}

void hostBroadcast(const HostLink& h, void* data, size_t bytes) {
  if (h.topo->size > 1) collectives::ringBroadcast(*h.comm, data, bytes, 0);
}

namespace {

class LocalComm : public GpuComm {
 public:
  explicit LocalComm(const CommContext& c) : c_(c) {}
  std::string name() const override { return "local"; }
  void allreduce(void* data, size_t count, DataType dt, ReduceOp, double post) override {
    if (post != 1.0) kernels::cuda::scale(data, data, count, dt, post, c_.stream);
  }
  void allgather(void*, const std::vector<size_t>&) override {}
  void broadcast(void*, size_t, int) override {}
  void reducescatter(void* work, const std::vector<size_t>& counts, DataType dt, ReduceOp,
                     double post) override {
    if (post != 1.0) kernels::cuda::scale(work, work, counts[0], dt, post, c_.stream);
  }

 private:
  CommContext c_;
};

class HostRingComm : public GpuComm {
 public:
  explicit HostRingComm(const CommContext& c) : c_(c) {}
  std::string name() const override { return "ring-host"; }

  void allreduce(void* data, size_t count, DataType dt, ReduceOp op, double post) override {
    size_t bytes = count * dtypeSize(dt);
    char* h = toHost(data, bytes);
    // By size, like host tensors: small ones take the latency-optimal schemes.
    collectives::allreduce(*c_.host.comm, h, h, count, dt, op, post);
    toDevice(data, h, bytes);
  }

  void allgather(void* out, const std::vector<size_t>& rank_bytes) override {
    const int me = c_.host.topo->rank;
    size_t total = 0, mine = 0;
    for (size_t r = 0; r < rank_bytes.size(); ++r) {
      if (static_cast<int>(r) < me) mine += rank_bytes[r];
      total += rank_bytes[r];
    }
    char* h = host_.reserve(total);
    copyOut(h + mine, static_cast<char*>(out) + mine, rank_bytes[me]);
    collectives::ringAllgather(*c_.host.comm, h, rank_bytes);
    toDevice(out, h, total);
  }

  void broadcast(void* data, size_t bytes, int root) override {
    char* h = host_.reserve(bytes);
    if (c_.host.topo->rank == root) copyOut(h, data, bytes);
    collectives::ringBroadcast(*c_.host.comm, h, bytes, root);
    if (c_.host.topo->rank != root) toDevice(data, h, bytes);
  }

  void reducescatter(void* work, const std::vector<size_t>& counts, DataType dt, ReduceOp op,
                     double post) override {
    const int me = c_.host.topo->rank;
    const size_t es = dtypeSize(dt);
    size_t total = 0, mine = 0;
    for (size_t r = 0; r < counts.size(); ++r) {
      if (static_cast<int>(r) < me) mine += counts[r];
      total += counts[r];
    }
    char* h = toHost(work, total * es);
    collectives::ringReducescatter(*c_.host.comm, h, counts, dt, op, post);
    toDevice(static_cast<char*>(work) + mine * es, h + mine * es, counts[me] * es);
  }

 private:
  char* toHost(const void* d, size_t bytes) {
    char* h = host_.reserve(bytes);
    copyOut(h, d, bytes);
    return h;
  }
  // Device -> host, waiting for it (and everything queued before it).
  void copyOut(void* h, const void* d, size_t bytes) {
    if (bytes)
      TFRING_CUDA_CHECK(cudaMemcpyAsync(h, d, bytes, cudaMemcpyDeviceToHost, c_.stream));
    waitStream(c_.stream, Deadline::in(c_.host.timeout_s), "staging to host memory",
               c_.host.comm->abort);
  }
  // Host -> device, queued: the next use of the staging buffer comes after
  // a later copyOut, which waits for the stream.
  void toDevice(void* d, const void* h, size_t bytes) {
    if (bytes)
      TFRING_CUDA_CHECK(cudaMemcpyAsync(d, h, bytes, cudaMemcpyHostToDevice, c_.stream));
  }

  CommContext c_;
  PinnedBuffer host_;
};

}  // namespace

std::unique_ptr<GpuComm> makeLocalComm(const CommContext& ctx) {
  return std::unique_ptr<GpuComm>(new LocalComm(ctx));
}

std::unique_ptr<GpuComm> makeHostRingComm(const CommContext& ctx) {
  return std::unique_ptr<GpuComm>(new HostRingComm(ctx));
}

}  // namespace gpu
}  // namespace tfring
