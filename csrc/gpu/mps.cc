#include "gpu/mps.h"

#include <sys/stat.h>

#include <cstdlib>
#include <map>

#include "common/status.h"
#include "common/tunables.h"

namespace tfring {
namespace gpu {

std::string mpsPipeDirectory() {
  const std::string dir = tunables::foreignEnv("CUDA_MPS_PIPE_DIRECTORY");
  return dir.empty() ? std::string("/tmp/nvidia-mps") : dir;
}

bool mpsControlPresent(const std::string& pipe_dir) {
  struct stat st;
  if (stat((pipe_dir + "/control").c_str(), &st) != 0) return false;
  return S_ISFIFO(st.st_mode) || S_ISSOCK(st.st_mode);
}

std::string sharedGpuMpsWarning(const std::vector<RankGpu>& ranks, int rank, bool mps_present,
                                const std::string& pipe_dir, const RankLabels& labels) {
  if (mps_present || rank < 0 || rank >= static_cast<int>(ranks.size())) return "";
  const std::string& host = ranks[rank].host;
  // Only the lowest rank of this host speaks for it.
  for (int r = 0; r < rank; ++r)
    if (ranks[r].host == host) return "";
  // This host's ranks, grouped by GPU; the largest group is named.
  std::map<std::string, std::vector<int>> by_gpu;
  for (int r = 0; r < static_cast<int>(ranks.size()); ++r)
    if (ranks[r].host == host) by_gpu[ranks[r].gpu].push_back(r);
  const std::vector<int>* most = nullptr;
  for (const auto& g : by_gpu)
    if (!most || g.second.size() > most->size()) most = &g.second;
  if (!most || most->size() < 2) return "";
  std::string who;
  for (size_t i = 0; i < most->size() && i < 8; ++i) who += strCat(i ? ", " : "", labels((*most)[i]));
  if (most->size() > 8) who += ", ...";
  return strCat(most->size(), " ranks on host ", host, " (", who, ") share GPU ",
                ranks[(*most)[0]].gpu,
                " and the CUDA Multi-Process Service is not running (no control pipe in ",
                pipe_dir, "), so the GPU switches contexts between them at every "
                "cross-rank wait. Start it before the job: "
                "export CUDA_MPS_PIPE_DIRECTORY=<a writable directory> "
                "CUDA_MPS_LOG_DIRECTORY=<another>; nvidia-cuda-mps-control -d "
                "(stop it with: echo quit | nvidia-cuda-mps-control)");
}

}  // namespace gpu
}  // namespace tfring
