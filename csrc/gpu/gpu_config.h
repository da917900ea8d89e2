// GPU tunables resolved into one struct (common/tunables.h declares each
// variable, its default and range; the defaults below are the table's).
#pragma once

#include <cstdint>
#include <string>

namespace tfring {
namespace gpu {

struct GpuConfig {
  std::string backend = "auto";    // TFRING_GPU_BACKEND: auto | nccl | ring
  // TFRING_GPU_CHUNK_SIZE: CUDA-IPC ring pipeline unit. 0 (default): 4 MiB
  // between different GPUs, whole steps when every rank shares one GPU
  // (there is no second device to overlap with, and every chunk costs a
  // switch between the processes' contexts).
  int64_t chunk_bytes = 0;
  bool ipc = true;                 // TFRING_GPU_IPC=0: ring stages through host memory
  bool ipc_user_buffers = true;    // TFRING_GPU_IPC_USER_BUFFERS=0: always copy to our buffer
  bool autotune = true;            // TFRING_GPU_AUTOTUNE=0: auto prefers NCCL without timing
  std::string nccl_lib;            // TFRING_NCCL_LIB: libnccl.so.2 file or directory
  // The allreduce of the CUDA-IPC backend (ranks of one host), by size:
  // TFRING_GPU_ALLREDUCE_ALGO = auto | ring | oneshot | twoshot.
  //   oneshot  every rank reads every peer's staging buffer and reduces all
  //            of it: one launch and one cross-process wait; reads (N-1)x
  //            the data per rank, so it pays for small tensors only;
  //   twoshot  reduce-scatter then allgather by direct peer reads: two
  //            waits, each rank reads 2(N-1)/N of the data;
  //   ring     the pipelined pull ring (gpu/pull_ring.h): bandwidth-optimal
  //            for large tensors, 2(N-1) dependent steps.
  // auto: oneshot up to TFRING_GPU_ONESHOT_MAX bytes (default 1 MiB),
  // twoshot up to TFRING_GPU_TWOSHOT_MAX (default 4 MiB; never for two
  // ranks, where it is the ring's two steps plus a barrier), the ring above.
  // Defaults from gpu_bench.py under MPS on an H100 (ranks sharing it): at
  // 1 MiB one-shot 53 us against the ring's 59 (2 ranks), 67 against 147
  // (4 ranks); at 4 MiB two-shot 96 against 151 (4 ranks), the ring ahead
  // from 16 MiB.
  // Rank 0's values are used by every rank. oneshot/twoshot need every
  // rank on one host, at most 8 ranks, and peer access between all their
  // GPUs; otherwise the ring is used. The staging area they use is 2x
  // max(ONESHOT_MAX, TWOSHOT_MAX) per rank (larger forced collectives run
  // in pieces of that size).
  std::string allreduce_algo = "auto";
  int64_t oneshot_max = int64_t(1) << 20;
  int64_t twoshot_max = int64_t(4) << 20;
  // TFRING_GPU_STAGED_MAX: ranks sharing a GPU without MPS are time-sliced,
  // so every cross-process wait on the GPU costs a time slice. auto then
  // stages allreduces up to this size through pinned host memory and the
  // CPU collectives (no GPU-side wait on a peer at all), the IPC ring above.
  // Measured on an H100, 2 ranks: 71 us against 772 us at 64 KiB, 433
  // against 1028 us at 1 MiB, the ring ahead from 4 MiB. 0: never.
  int64_t staged_max = int64_t(2) << 20;

  static GpuConfig fromEnv();
};

}  // namespace gpu
}  // namespace tfring
