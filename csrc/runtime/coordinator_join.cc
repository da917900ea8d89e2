// The coordinator's rules for join() and alltoall (see coordinator.h).
#include <algorithm>

#include "runtime/coordinator.h"
#include "runtime/entry.h"

namespace tfring {
namespace runtime {

namespace {

std::string ranksOf(const std::vector<bool>& flags, const RankLabels& L) {
  std::vector<int> set;
  for (size_t r = 0; r < flags.size(); ++r)
    if (flags[r]) set.push_back(static_cast<int>(r));
  return L.list(set);
}

}  // namespace

bool Coordinator::complete(const Pending& p) const {
  for (int r = 0; r < size_; ++r)
    if (!p.have[r] && !joined_[r]) return false;
  return true;
}

void Coordinator::onJoined(int rank) {
  joined_[rank] = true;
  last_joined_ = rank;
  // Names that waited only for this rank run now, without it.
  std::vector<std::string> now;
  for (auto& kv : pending_)
    if (complete(kv.second)) now.push_back(kv.first);
  for (auto& name : now) {
    auto it = pending_.find(name);
    validate(name, it->second);
    pending_.erase(it);
  }
}

std::string Coordinator::checkJoined(Pending& p, bool* fill) {
  int first = -1;
  for (int r = 0; r < size_ && first < 0; ++r)
    if (p.have[r]) first = r;
  *fill = false;
  std::vector<bool> missing(size_, false);
  for (int r = 0; r < size_; ++r) {
    if (p.have[r]) continue;
    // A joined rank agrees with whatever the others submitted.
    p.metas[r] = p.metas[first];
    missing[r] = true;
    *fill = true;
  }
  if (!*fill) return "";
  const Meta& m = p.metas[first];
  if (m.type != CollectiveType::kAllreduce && m.type != CollectiveType::kBarrier)
    return strCat(collectiveName(m.type), " of tensor '", m.name,
                  "' is not supported while ranks [", ranksOf(missing, label_),
                  "] have joined: only allreduce and barrier are (as in Horovod)");
  if (m.device >= 0)
    return strCat("allreduce of GPU tensor '", m.name, "' while ranks [", ranksOf(missing, label_),
                  "] have joined: join() supports host tensors only");
  return "";
}

std::string Coordinator::checkAlltoall(const std::string& name, Pending& p,
                                       std::vector<int64_t>* matrix) {
  matrix->clear();
  for (int r = 0; r < size_; ++r) {
    std::vector<int64_t> rows;
    std::string why = alltoallSplits(p.metas[r], size_, &rows);
    if (!why.empty())
      return strCat("alltoall of tensor '", name, "' on rank ", label_(r), ": ", why, " (shape ",
                    p.metas[r].shapeString(), ")");
    matrix->insert(matrix->end(), rows.begin(), rows.end());
  }
  return "";
}

}  // namespace runtime
}  // namespace tfring
