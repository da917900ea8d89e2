#include "gpu/gpu_config.h"

#include <algorithm>
#include <cctype>

#include "common/tunables.h"

namespace tfring {
namespace gpu {

GpuConfig GpuConfig::fromEnv() {
  GpuConfig c;
  namespace t = tunables;
  c.backend = t::getString("TFRING_GPU_BACKEND");
  c.chunk_bytes = t::getInt("TFRING_GPU_CHUNK_SIZE");  // 0: by size
  if (c.chunk_bytes != 0 && c.chunk_bytes < 256) c.chunk_bytes = 256;
  c.ipc = t::getBool("TFRING_GPU_IPC");
  c.ipc_user_buffers = t::getBool("TFRING_GPU_IPC_USER_BUFFERS");
  c.autotune = t::getBool("TFRING_GPU_AUTOTUNE");
  c.nccl_lib = t::getString("TFRING_NCCL_LIB");
  c.allreduce_algo = t::getString("TFRING_GPU_ALLREDUCE_ALGO");
  c.oneshot_max = t::getInt("TFRING_GPU_ONESHOT_MAX");
  c.twoshot_max = t::getInt("TFRING_GPU_TWOSHOT_MAX");
  c.staged_max = t::getInt("TFRING_GPU_STAGED_MAX");
  return c;
}

}  // namespace gpu
}  // namespace tfring
