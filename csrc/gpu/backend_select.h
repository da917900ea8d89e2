// Which GPU backend a job uses, decided once, identically on every rank,
// from facts every rank has gathered about every other (host, GPU, whether
// NCCL loaded, whether CUDA IPC may be used). No CUDA here, so the dispatch
// logic is tested on machines without a GPU.
//
//   TFRING_GPU_BACKEND=nccl   NCCL; an error naming the reason when it cannot
//                             work (a GPU shared by several ranks, NCCL not
//                             found on some rank).
//   TFRING_GPU_BACKEND=ring   tfring's own ring: CUDA IPC between the GPUs of
//                             one host (several ranks may share a GPU),
//                             pinned host staging through the CPU ring links
//                             when ranks span hosts or IPC is off.
//   TFRING_GPU_BACKEND=auto   NCCL when every rank has its own GPU and NCCL
//                             loads everywhere, else the ring. When both
//                             NCCL and the IPC ring would work, both are
//                             timed once on a 32 MiB allreduce and the
//                             faster is kept (TFRING_GPU_AUTOTUNE=0: NCCL).
// A job of one rank needs no communication ("local"), unless NCCL is asked
// for explicitly (a sanity check of the NCCL path).
#pragma once

#include <string>
#include <vector>

#include "common/rank_labels.h"

namespace tfring {
namespace gpu {

enum class Backend { kLocal, kNccl, kIpcRing, kHostRing };
const char* backendName(Backend b);  // "local", "nccl", "ring-ipc", "ring-host"

struct RankGpu {
  std::string host;    // host identity (as the ring links group ranks)
  std::string gpu;     // GPU identity (UUID), unique per physical GPU
  bool nccl_ok = false;
  std::string nccl_error;  // why NCCL did not load, when it did not
  bool ipc_ok = false;     // CUDA IPC allowed (TFRING_GPU_IPC) and supported
};

struct Choice {
  Backend backend = Backend::kLocal;
  // auto with both NCCL and the IPC ring usable: time both, keep the faster
  // (backend is the one kept when timing is off).
  bool calibrate = false;
  Backend alternative = Backend::kIpcRing;
  std::string reason;  // one sentence: why this backend
};

// Throws tfring::Error (kInvalidArgument for an unknown name, kUnavailable
// when the requested backend cannot work) with a message naming the ranks
// involved. `ranks` is indexed by place in the communicator; messages name
// each as `labels` does (a process set's: by global rank).
Choice chooseBackend(const std::string& requested, const std::vector<RankGpu>& ranks,
                     bool autotune, const RankLabels& labels = RankLabels());

}  // namespace gpu
}  // namespace tfring
