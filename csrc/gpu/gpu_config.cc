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
  c.allreduce_algo = env::getString("TFRING_GPU_ALLREDUCE_ALGO", c.allreduce_algo);
  std::transform(c.allreduce_algo.begin(), c.allreduce_algo.end(), c.allreduce_algo.begin(),
                 [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
  c.oneshot_max = env::parseBytes(env::getString("TFRING_GPU_ONESHOT_MAX", ""), c.oneshot_max);
  c.twoshot_max = env::parseBytes(env::getString("TFRING_GPU_TWOSHOT_MAX", ""), c.twoshot_max);
  c.staged_max = env::parseBytes(env::getString("TFRING_GPU_STAGED_MAX", ""), c.staged_max);
  if (c.staged_max < 0) c.staged_max = 0;
  if (c.oneshot_max < 0) c.oneshot_max = 0;
  if (c.twoshot_max < 0) c.twoshot_max = 0;
  return c;
}

}  // namespace gpu
}  // namespace tfring
