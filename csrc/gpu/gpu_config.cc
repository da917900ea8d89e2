#include "gpu/gpu_config.h"

#include <algorithm>
#include <cctype>

#include "common/env.h"

namespace tfring {
namespace gpu {

GpuConfig GpuConfig::fromEnv() {
  GpuConfig c;
  c.backend = env::getString("TFRING_GPU_BACKEND", c.backend);
  std::transform(c.backend.begin(), c.backend.end(), c.backend.begin(),
                 [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
  c.chunk_bytes = env::parseBytes(env::getString("TFRING_GPU_CHUNK_SIZE", ""), c.chunk_bytes);
  if (c.chunk_bytes != 0 && c.chunk_bytes < 256) c.chunk_bytes = 256;
  c.ipc = env::getInt("TFRING_GPU_IPC", 1) != 0;
  c.ipc_user_buffers = env::getInt("TFRING_GPU_IPC_USER_BUFFERS", 1) != 0;
  c.autotune = env::getInt("TFRING_GPU_AUTOTUNE", 1) != 0;
  c.nccl_lib = env::getString("TFRING_NCCL_LIB", "");
  return c;
}

}  // namespace gpu
}  // namespace tfring
