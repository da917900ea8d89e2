// First appearances agreed in the round, without the coordinator.
//
// A tensor whose name has no cache id yet (a name never seen, an unnamed
// call's order-based name, a name built from a step counter) would cost a
// round trip to the coordinator on rank 0: a TCP message, the
// coordinator's thread, a response, the reader thread, and another round.
// Instead, the round's vote carries the first kFreshSlots such tensors of
// each rank as hashes: a 32-bit hash of the name and a 64-bit hash of the
// name with everything ranks must agree on (type, dtype, shape, op, root,
// scales, host or GPU). The vote's tally (vote_words.h: FreshSection) holds,
// alike on every rank, the full hashes on every rank's list in the order of rank 0's
// list and the name hashes on every rank's list, so every rank computes the
// same answer:
//   - a full hash on every rank's list: that tensor runs in this round, in
//     the order of rank 0's list, fused like cached tensors (fuseReady);
//   - a name hash on every rank's list whose full hash is not: the ranks
//     disagree about that tensor (a changed shape, unnamed calls in another
//     order): each rank sends it to the coordinator now, which reports the
//     mismatch by name on every rank;
//   - anything else waits like a cached tensor: a later round, or, once it
//     has waited past Agreement::agingLimit() or some rank needs the
//     coordinator, the coordinator (stall reports stay by name).
// Such tensors get no cache id: a name used once costs the vote no space
// afterwards. More than kFreshSlots new tensors at once (a training step's
// first pass) go to the coordinator, which grants them ids for the bitmap
// fast path. Allgather (rows differ per rank) always goes to the
// coordinator on first appearance.
#include <algorithm>
#include <cstring>

#include "common/wire.h"
#include "runtime/fresh_names.h"

namespace tfring {
namespace runtime {

namespace {

uint64_t fnv1a(const uint8_t* p, size_t n, uint64_t h = 1469598103934665603ull) {
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 1099511628211ull;
  }
  return h;
}

}  // namespace

bool FreshNames::eligible(Entry& e) const {
  if (!cfg_.cache_enabled) return false;
  const CollectiveType t = e.meta.type;
  if (t != CollectiveType::kAllreduce && t != CollectiveType::kBroadcast &&
      t != CollectiveType::kReducescatter)
    return false;
  wire::Writer w;
  e.meta.write(w);
  const auto& b = w.bytes();
  e.fresh_full = fnv1a(b.data(), b.size());
  const auto* np = reinterpret_cast<const uint8_t*>(e.meta.name.data());
  e.fresh_name = static_cast<uint32_t>(fnv1a(np, e.meta.name.size()) >> 16);
  return true;
}

int FreshNames::write(int32_t* out) {
  std::fill(out, out + kFreshWords, 0);
  const int n = static_cast<int>(std::min<size_t>(list_.size(), kFreshSlots));
  FreshSection::count(out) = n;
  for (int i = 0; i < n; ++i)
    FreshSection::setSlot(out, i, list_[i]->fresh_name, list_[i]->fresh_full);
  return n;
}

void FreshNames::settle(const int32_t* tally, int mine, Entries* run, Entries* conflict) {
  // Full hashes on every list, in rank 0's order; names on every list.
  const int n = std::max(0, std::min<int>(FreshSection::count(tally), kFreshSlots));
  const int m = std::max(0, std::min<int>(FreshSection::nameCount(tally), kFreshSlots));
  const int32_t* names = FreshSection::names(tally);
  auto everywhereName = [&](uint32_t h) {
    for (int i = 0; i < m; ++i)
      if (static_cast<uint32_t>(names[i]) == h) return true;
    return false;
  };
  // This rank's offered entries (the first slots of the list, as voted).
  std::vector<bool> taken(mine, false);
  // Execution order: rank 0's list, so every rank runs the same sequence.
  for (int i = 0; i < n; ++i) {
    const uint64_t h = FreshSection::fullHash(tally, i);
    for (int j = 0; j < mine; ++j)
      if (!taken[j] && list_[j]->fresh_full == h) {
        taken[j] = true;
        // Finished by the vote itself on every rank (rider.h).
        if (!list_[j]->rode) run->push_back(list_[j]);
        break;
      }
  }
  for (int j = 0; j < mine; ++j)
    if (!taken[j] && everywhereName(list_[j]->fresh_name)) {
      taken[j] = true;
      conflict->push_back(list_[j]);
    }
  if (std::find(taken.begin(), taken.end(), true) == taken.end()) return;
  Entries keep;
  for (int j = 0; j < static_cast<int>(list_.size()); ++j)
    if (j >= mine || !taken[j]) keep.push_back(std::move(list_[j]));
  list_.swap(keep);
}

}  // namespace runtime
}  // namespace tfring
