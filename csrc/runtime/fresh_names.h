// FreshNames: first appearances agreed in the round's vote, without the
// coordinator (the protocol: fresh_names.cc).
#pragma once

#include <cstdint>
#include <vector>

#include "common/env.h"
#include "runtime/entry.h"
#include "runtime/vote_words.h"

namespace tfring {
namespace runtime {

class FreshNames {
 public:
  explicit FreshNames(const Config& cfg) : cfg_(cfg) {}
  // Whether e, a tensor whose name has no cache id, may be offered in the
  // vote; if so, sets its hashes.
  bool eligible(Entry& e) const;
  // The tensors waiting to be offered or agreed, in submission order.
  Entries& waiting() { return list_; }
  const Entries& waiting() const { return list_; }
  // Writes this rank's list (its first kFreshSlots tensors) into the vote's
  // fresh section; returns how many it offered.
  int write(int32_t* section);
  // After the vote: `tally` is the fresh section of the round's tally,
  // `mine` how many this rank offered. Takes off the list what runs now
  // (*run, in the order of rank 0's list, without what the vote itself
  // finished: rider.h) and what ranks disagree on (*conflict: the
  // coordinator compares the Metas and names the ranks).
  void settle(const int32_t* tally, int mine, Entries* run, Entries* conflict);

 private:
  const Config& cfg_;
  Entries list_;
};

}  // namespace runtime
}  // namespace tfring
