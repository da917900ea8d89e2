// PeerAllreduce: the latency-optimal allreduces between the ranks of one
// host (several ranks may share a GPU; ranks on different GPUs need peer
// access), beside the pull ring of IpcRingComm, chosen by size
// (gpu/gpu_config.h: TFRING_GPU_ALLREDUCE_ALGO, TFRING_GPU_ONESHOT_MAX,
// TFRING_GPU_TWOSHOT_MAX).
//
// Registered once. At the first GPU collective each rank allocates one
// staging area, [flag word | data, parity 0 | data, parity 1], exports it
// through CUDA IPC, and maps every peer's: no per-call handle exchange,
// mapping or host wait.
//
// One-shot (collective c, parity p = c & 1):
//   copy the input (times the prescale) into my data[p]; barrier; every rank reduces data[p] of
//   ranks 0..N-1 in rank order into its output.
// Two-shot:
//   copy in; barrier; reduce segment `me` of every rank's data[p] into my
//   data[p] (reduce-scatter); barrier; gather segment r from rank r's
//   data[p] into my output (allgather).
//
// The barrier is the only cross-process ordering: a kernel stores
// flag = ++sequence in my flag word (after a system-scope fence) and polls
// every peer's flag until it reaches the same sequence (kernels/cuda/peer.h).
// The host never waits on a peer. Why data[p] is never overwritten while a
// peer still reads it: my copy-in of collective c + 2 comes, on my stream,
// after the first barrier of collective c + 1, which no rank passes before
// every peer has reached it, and each peer reaches it only after its
// stream has finished every read of collective c. Parity alternates per
// collective, identically on every rank (all run the same sequence).
//
// A dead peer: the barrier kernel polls an abort word in pinned host memory
// and gives up after a timeout; poll() (called while the executor waits for
// the GPU) checks the peers' pids, raises the abort word and throws
// PeerFailureError naming the dead rank.
#pragma once

#include <cuda_runtime_api.h>

#include <memory>
#include <string>
#include <vector>

#include "collectives/collective_stats.h"
#include "common/types.h"
#include "gpu/cuda/comm.h"

namespace tfring {
namespace gpu {

// kStaged: through pinned host memory (ranks time-sliced on one GPU; the
// IPC comm runs it, PeerAllreduce never does).
enum class PeerAlgo { kRing, kOneShot, kTwoShot, kStaged };
const char* peerAlgoName(PeerAlgo a);  // "ring", "oneshot", "twoshot", "staged"

class PeerAllreduce {
 public:
  // Collective over every rank of ctx (all on one host). Null, identically
  // on every rank, when the configuration asks for the ring only or some
  // pair of ranks cannot read each other's memory (*why says which). Also
  // null when ranks share a GPU without MPS and auto chooses: then
  // *staged_max is rank 0's TFRING_GPU_STAGED_MAX (else 0).
  static std::unique_ptr<PeerAllreduce> create(const CommContext& ctx, std::string* why,
                                               size_t* staged_max);
  ~PeerAllreduce();

  // The algorithm for an allreduce of `bytes` (identical on every rank).
  PeerAlgo choose(size_t bytes) const;
  // out = allreduce(in * pre) * post; in may be out.
  void allreduce(PeerAlgo algo, const void* in, void* out, size_t count, DataType dt, ReduceOp op,
                 double pre, double post);
  // Throws PeerFailureError if a peer died (and releases waiting kernels).
  void poll();
  // Releases waiting kernels (teardown after a failure).
  void abort();

 private:
  explicit PeerAllreduce(const CommContext& c) : c_(c) {}
  void barrier();
  void runOne(PeerAlgo algo, const char* in, char* out, size_t count, DataType dt, ReduceOp op,
              double pre, double post);

  CommContext c_;
  int n_ = 1, me_ = 0;
  PeerAlgo forced_ = PeerAlgo::kRing;  // kRing: by size
  bool by_size_ = true;
  size_t oneshot_max_ = 0, twoshot_max_ = 0;
  size_t cap_ = 0;              // bytes per parity
  char* area_ = nullptr;        // my staging area
  std::vector<char*> peers_;    // every rank's area, mapped here (mine for me)
  std::vector<int> pids_;
  int32_t* host_words_ = nullptr;  // pinned: [0] abort, [1] status
  uint64_t collective_ = 0;     // collectives run (parity)
  uint64_t sequence_ = 0;       // barriers run
  double next_pid_check_ = 0;
};

// Counts one allreduce run by `a` on the communicator whose statistics are
// `stats` (tests check that a forced algorithm really ran, on its set).
void countPeerAlgo(collectives::CommStats* stats, PeerAlgo a);

}  // namespace gpu
}  // namespace tfring
