#include "gpu/backend_select.h"

#include <map>

#include "common/status.h"

namespace tfring {
namespace gpu {

const char* backendName(Backend b) {
  switch (b) {
    case Backend::kLocal: return "local";
    case Backend::kNccl: return "nccl";
    case Backend::kIpcRing: return "ring-ipc";
    case Backend::kHostRing: return "ring-host";
  }
  return "?";
}

namespace {

// The first two ranks that share a GPU, if any.
bool findSharedGpu(const std::vector<RankGpu>& ranks, int* a, int* b) {
  std::map<std::pair<std::string, std::string>, int> seen;
  for (int r = 0; r < static_cast<int>(ranks.size()); ++r) {
    auto key = std::make_pair(ranks[r].host, ranks[r].gpu);
    auto it = seen.find(key);
    if (it != seen.end()) {
      *a = it->second;
      *b = r;
      return true;
    }
    seen[key] = r;
  }
  return false;
}

}  // namespace

Choice chooseBackend(const std::string& requested, const std::vector<RankGpu>& ranks,
                     bool autotune, const RankLabels& labels) {
  if (requested != "auto" && requested != "nccl" && requested != "ring")
    fail(Code::kInvalidArgument, "TFRING_GPU_BACKEND='", requested,
         "' is not one of auto, nccl, ring");
  const int n = static_cast<int>(ranks.size());
  Choice c;

  int sa = -1, sb = -1;
  const bool shared = findSharedGpu(ranks, &sa, &sb);
  int no_nccl = -1;
  for (int r = 0; r < n && no_nccl < 0; ++r)
    if (!ranks[r].nccl_ok) no_nccl = r;
  bool one_host = true, ipc = true;
  for (int r = 0; r < n; ++r) {
    one_host = one_host && ranks[r].host == ranks[0].host;
    ipc = ipc && ranks[r].ipc_ok;
  }
  std::string why_not_nccl;
  if (shared)
    why_not_nccl = strCat("ranks ", labels(sa), " and ", labels(sb), " share GPU ", ranks[sa].gpu, " on host ",
                          ranks[sa].host, ", and NCCL needs a GPU of its own for every rank");
  else if (no_nccl >= 0)
    why_not_nccl = strCat("NCCL could not be loaded on rank ", labels(no_nccl), ": ",
                          ranks[no_nccl].nccl_error);

  const Backend ring = one_host && ipc ? Backend::kIpcRing : Backend::kHostRing;
  const std::string ring_why =
      ring == Backend::kIpcRing
          ? std::string("every rank is on one host, so the ring moves data through CUDA IPC")
          : (one_host ? std::string("CUDA IPC is off or unsupported on some rank "
                                    "(TFRING_GPU_IPC), so the ring stages through host memory")
                      : std::string("ranks span several hosts, so the ring stages through "
                                    "pinned host memory and the CPU ring links"));

  if (requested == "nccl") {
    if (!why_not_nccl.empty())
      fail(Code::kUnavailable, "TFRING_GPU_BACKEND=nccl cannot be used: ", why_not_nccl,
           ". Use TFRING_GPU_BACKEND=ring (or auto)");
    c.backend = Backend::kNccl;
    c.reason = "TFRING_GPU_BACKEND=nccl";
    return c;
  }
  if (n == 1) {
    c.backend = Backend::kLocal;
    c.reason = "a job of one rank needs no communication";
    return c;
  }
  if (requested == "ring") {
    c.backend = ring;
    c.reason = "TFRING_GPU_BACKEND=ring; " + ring_why;
    return c;
  }
  // auto
  if (!why_not_nccl.empty()) {
    c.backend = ring;
    c.reason = why_not_nccl + "; " + ring_why;
    return c;
  }
  c.backend = Backend::kNccl;
  if (ring == Backend::kIpcRing && autotune) {
    c.calibrate = true;
    c.alternative = Backend::kIpcRing;
    c.reason = "both NCCL and the CUDA-IPC ring work here; the faster on a timed allreduce is kept";
  } else if (ring == Backend::kIpcRing) {
    c.reason = "every rank has its own GPU and NCCL loaded (TFRING_GPU_AUTOTUNE=0: no timing)";
  } else {
    c.reason = "every rank has its own GPU and NCCL loaded; " + ring_why +
               ", which NCCL beats";
  }
  return c;
}

}  // namespace gpu
}  // namespace tfring
