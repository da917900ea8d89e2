// The GPU side of the engine, as runtime/executor_gpu.cc sees it. No CUDA
// types here: builds without CUDA link csrc/gpu/nocuda/ instead of
// csrc/gpu/cuda/, whose acceptTensor() refuses GPU tensors with a clear
// error.
//
// Stream contract (also the C++ entry for TensorFlow GPU kernels: fill a
// runtime::Request with device pointers, device >= 0 and `stream`):
//   - the input is read once all work queued on `stream` before enqueue()
//     has finished (an event is recorded on it inside enqueue); a null
//     stream means the input is ready now;
//   - `done` is called once the outputs are complete in device memory (the
//     engine has synchronized its own stream), so the caller may use them
//     on any stream;
//   - the input must stay valid, and the output untouched, until `done`.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/rank_labels.h"
#include "common/status.h"
#include "common/types.h"

namespace tfring {
namespace collectives {
struct RingComm;
class CommStats;
}
namespace transport {
struct Topology;
}

namespace gpu {

bool builtWithCuda();
// True in the CUDA emulation build (TFRING_WITH_CUDA=EMU, tests/cuda_emu):
// "GPU" work runs on host threads, for tests; no timing means anything.
bool cudaEmulated();

// The GPU this process's collectives use, once its first GPU tensor was
// accepted; -1 before.
int boundDevice();

// Called by Engine::enqueue on the submitting thread for a tensor on GPU
// `device`: checks that CUDA can serve it (clear error otherwise) and, when
// `stream` is set, records the event the engine will wait on.
Status acceptTensor(const std::string& name, int device, void* stream,
                    std::shared_ptr<void>* ready);

// What the GPU side may use of the host runtime (engine thread only).
struct HostLink {
  collectives::RingComm* comm = nullptr;  // the CPU ring: bootstrap and staging
  const transport::Topology* topo = nullptr;
  double timeout_s = 300;
  // How messages name the ranks of topo's places (common/rank_labels.h): a
  // process set's by their global ranks.
  RankLabels labels;
};

struct Buffer {
  const void* input = nullptr;
  void* output = nullptr;
  size_t count = 0;               // elements
  std::shared_ptr<void> ready;    // from acceptTensor
};

// Runs the collectives of GPU tensors; same contracts as runtime/executor.cc
// on host buffers. Every call returns once the outputs are complete.
class Executor {
 public:
  virtual ~Executor() = default;
  virtual int device() const = 0;
  virtual std::string backend() const = 0;
  // The stream the executor queues its kernels and copies on (a
  // cudaStream_t; null without CUDA).
  virtual void* stream() const { return nullptr; }
  // op may be kAverage (a sum, then divided by the size with the postscale).
  virtual void allreduce(const std::vector<Buffer>& bufs, DataType dtype, ReduceOp op,
                         double prescale, double postscale) = 0;
  // b.input is this rank's block; b.output (allocated) receives all blocks.
  virtual void allgather(const Buffer& b, const std::vector<size_t>& rank_bytes) = 0;
  virtual void broadcast(const Buffer& b, size_t bytes, int root) = 0;
  // rank_counts: elements per rank; b.output receives this rank's block.
  virtual void reducescatter(const Buffer& b, DataType dtype,
                             const std::vector<size_t>& rank_counts, ReduceOp op,
                             double prescale, double postscale) = 0;
};

// Collective: every rank calls it at the same point (its first GPU group).
// A non-OK status is an error every rank reaches identically (an unknown
// TFRING_GPU_BACKEND, NCCL required but missing): that group fails, the job
// goes on. A thrown Error is a local failure and fatal to the job.
Status createExecutor(int device, const HostLink& host, std::unique_ptr<Executor>* out);

// How many GPU allreduces the communicator whose statistics are `stats` ran
// with each algorithm of the CUDA-IPC backend: "ring", "oneshot",
// "twoshot", "staged" (gpu_config.h); 0 for others.
uint64_t allreduceAlgorithmCount(const collectives::CommStats& stats, const std::string& algo);

}  // namespace gpu
}  // namespace tfring
