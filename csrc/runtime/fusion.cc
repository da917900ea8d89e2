#include "runtime/fusion.h"

namespace tfring {
namespace runtime {

size_t tensorBytes(const Meta& m) {
  return static_cast<size_t>(m.numElements()) * dtypeSize(m.dtype);
}

namespace {

bool fusable(const Meta& a, const Meta& b) {
  return b.type == CollectiveType::kAllreduce && b.dtype == a.dtype && b.op == a.op &&
         b.prescale == a.prescale && b.postscale == a.postscale && b.device == a.device &&
         b.wire == a.wire;
}

}  // namespace

std::vector<std::vector<size_t>> fuseReady(const std::vector<const Meta*>& ready,
                                           int64_t threshold) {
  std::vector<std::vector<size_t>> groups;
  std::vector<bool> used(ready.size(), false);
  for (size_t i = 0; i < ready.size(); ++i) {
    if (used[i]) continue;
    used[i] = true;
    groups.emplace_back(1, i);
    const Meta& a = *ready[i];
    if (a.type != CollectiveType::kAllreduce) continue;
    int64_t bytes = static_cast<int64_t>(tensorBytes(a));
    for (size_t j = i + 1; j < ready.size(); ++j) {
      if (used[j] || !fusable(a, *ready[j])) continue;
      int64_t bb = static_cast<int64_t>(tensorBytes(*ready[j]));
      if (bytes + bb > threshold) continue;
      bytes += bb;
      used[j] = true;
      groups.back().push_back(j);
    }
  }
  return groups;
}

}  // namespace runtime
}  // namespace tfring
