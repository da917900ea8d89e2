// GpuComm: the collectives on device buffers, one implementation per
// backend, with the contracts of collectives/ring.h (in place; ranks in rank
// order; allreduce's op is never kAverage and postscale already includes
// 1/size). Work is queued on the executor's stream; a call may return before
// the GPU is done (the executor waits once per group).
//
//   LocalComm     one rank: only the scaling
//   HostRingComm  pinned host staging + the CPU ring collectives (any
//                 topology; the fallback)
//   NcclComm      NCCL, loaded at run time (gpu/nccl_loader.h)
//   IpcRingComm   the pull ring over CUDA IPC (gpu/pull_ring.h)
#pragma once

#include <cuda_runtime_api.h>

#include <memory>
#include <string>
#include <vector>

#include "common/types.h"
#include "gpu/executor.h"
#include "gpu/gpu_config.h"

namespace tfring {
namespace gpu {

struct CommContext {
  HostLink host;
  int device = 0;
  cudaStream_t stream = nullptr;
  GpuConfig cfg;
  bool one_gpu = false;  // every rank of the job uses the same GPU
};

class GpuComm {
 public:
  virtual ~GpuComm() = default;
  virtual std::string name() const = 0;
  virtual void allreduce(void* data, size_t count, DataType dtype, ReduceOp op,
                         double postscale) = 0;
  // out = allreduce(in * prescale) when the backend can read `in` directly
  // (saving the copy into place); false, with nothing queued, otherwise.
  virtual bool allreduceFrom(const void* /*in*/, void* /*out*/, size_t /*count*/,
                             DataType /*dtype*/, ReduceOp /*op*/, double /*prescale*/,
                             double /*postscale*/) {
    return false;
  }
  // This rank's block must already be in place in `out`.
  virtual void allgather(void* out, const std::vector<size_t>& rank_bytes) = 0;
  virtual void broadcast(void* data, size_t bytes, int root_rank) = 0;
  // Afterwards this rank's block of `work` holds the result.
  virtual void reducescatter(void* work, const std::vector<size_t>& rank_counts, DataType dtype,
                             ReduceOp op, double postscale) = 0;
  // Called while the executor waits for the GPU; throws on an asynchronous
  // backend failure.
  virtual void poll() {}
  // A collective failed: release GPU work that waits on peers, so the
  // stream drains.
  virtual void abort() {}
};

std::unique_ptr<GpuComm> makeLocalComm(const CommContext& ctx);
std::unique_ptr<GpuComm> makeHostRingComm(const CommContext& ctx);
// Collective (every rank at once). Throws on failure.
std::unique_ptr<GpuComm> makeNcclComm(const CommContext& ctx);
// Collective. Returns null, identically on every rank, when CUDA IPC turns
// out not to work between some neighbours (the caller falls back to the
// host ring); *why says where and why.
std::unique_ptr<GpuComm> makeIpcRingComm(const CommContext& ctx, std::string* why);

// Host-ring helpers for bootstrap: every rank contributes `bytes` and gets
// all ranks' contributions in rank order; rank 0's `data` reaches everyone.
std::vector<char> hostAllgather(const HostLink& h, const void* mine, size_t bytes);
void hostBroadcast(const HostLink& h, void* data, size_t bytes);

}  // namespace gpu
}  // namespace tfring
