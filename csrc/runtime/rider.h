// Rider: one small allreduce carried by the round's vote (the protocol:
// rider.cc; its words: vote_words.h, RiderSection).
#pragma once

#include <cstdint>
#include <memory>

#include "common/env.h"
#include "runtime/entry.h"
#include "runtime/vote.h"
#include "runtime/vote_words.h"

namespace tfring {
namespace runtime {

class Rider {
 public:
  explicit Rider(const Config& cfg) : cfg_(cfg) {}
  // The rider section's words in this round's vote (0: no room agreed).
  size_t words() const { return RiderSection::words(room_); }
  // This rank's proposal for the next round's room (the header's
  // kRiderRoom), from the small allreduces waiting: `cached` by cache id,
  // `fresh` in the fresh list's order.
  int32_t propose(const Entries& cached, const Entries& fresh);
  // Picks this rank's rider and writes it (or none) into the rider section.
  void write(int32_t* section, const Entries& cached, const Entries& fresh);
  // How the vote merges rider sections (runtime/vote.h).
  VoteExtra extra() { return VoteExtra{words(), &Rider::merge, this}; }
  // After the vote, with the tally's rider section: the entry the vote
  // completed on every rank, or null. *cached_id is its cache id, or -1 for
  // a first appearance, which is marked as `rode`.
  std::shared_ptr<Entry> settle(const int32_t* merged, int32_t* cached_id);
  // Writes the reduced payload into e's outputs, the postscale applied, and
  // records the collective's stats: an allreduce of `size` ranks done in
  // the hops of `vote`.
  // `stats`: the communicator's, where the vote is recorded as the
  // allreduce's algorithm.
  void complete(Entry& e, const int32_t* merged, int size, const VoteStats& vote,
                collectives::CommStats* stats);
  // The room the tally agreed for the next round (its kRiderRoom word).
  void setRoom(int32_t agreed) { room_ = agreed > 0 ? agreed : 0; }

 private:
  bool eligible(const Entry& e) const;
  static void merge(void* ctx, const int32_t* lo, const int32_t* hi, int32_t* out);

  const Config& cfg_;
  std::shared_ptr<Entry> rider_;  // this rank's rider in the round's vote
  int32_t key_[RiderSection::kKeyWords] = {0, 0, 0};
  int64_t room_ = 0;    // this round's payload room, agreed in the last vote
  int64_t hint_ = 0;    // bytes of the last small allreduce seen
  uint64_t seen_ = 0;   // round it was seen in
  uint64_t rounds_ = 0;
};

}  // namespace runtime
}  // namespace tfring
