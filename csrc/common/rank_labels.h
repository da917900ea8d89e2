// How a communicator's members are named in messages. A communicator's
// protocol (its ring, coordinator, engine, links) numbers its members by
// their place in it, 0..n-1; a user knows them by their rank in the job.
// Every message that names a member prints label(place): the world's
// places are the job's ranks, a process set's map to its members' global
// ranks. Only messages use it: suspects, indices and wire fields stay
// places.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace tfring {

class RankLabels {
 public:
  RankLabels() = default;  // the world: places are ranks
  explicit RankLabels(std::vector<int> global) : global_(std::move(global)) {}

  // The global rank of place `r`; `r` itself where there is no mapping
  // (the world, or a number that is no place, such as -1).
  int operator()(int r) const {
    return r >= 0 && r < static_cast<int>(global_.size()) ? global_[r] : r;
  }
  // "1, 2, 3": the labels of `places`, for "ranks [...]".
  std::string list(const std::vector<int>& places) const {
    std::string s;
    for (size_t i = 0; i < places.size(); ++i)
      s += (i ? ", " : "") + std::to_string((*this)(places[i]));
    return s;
  }
  bool identity() const { return global_.empty(); }

 private:
  std::vector<int> global_;
};

}  // namespace tfring
