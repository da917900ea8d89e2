// GPU tunables: every environment variable the GPU side reads, declared
// once with its default (README documents the same table).
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

  static GpuConfig fromEnv();
};

}  // namespace gpu
}  // namespace tfring
