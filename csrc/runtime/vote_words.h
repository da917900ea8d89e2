// The words of one round's vote, by section (the protocol: agreement.h).
//
// A vote is a vector of int32 words that every rank fills alike in layout
// and that the vote's collective (vote.h) turns into the same tally on
// every rank:
//
//   header   [0, kVoteHeader)             reduced with Min:
//              kHeldResponse  the last coordinator response this rank has
//                             received: the minimum is one every rank
//                             holds and can execute now;
//              kNoCoordinator 1, or 0 when this rank needs the coordinator:
//                             the minimum is 0 when any rank does;
//              kRiderRoom     the bytes of small allreduce this rank
//                             proposes the next round's votes carry: the
//                             minimum is the room every next vote has;
//   ids      [kVoteHeader, head)          reduced with Min: word i is 1 when
//                             cache id i is ready here with the Meta it
//                             last ran with; 1 in the tally: ready everywhere;
//   fresh    [head, +kFreshTallyWords)    this rank's first new names as
//                             hashes (fresh_names.h), merged into those
//                             on every rank's list (FreshSection below);
//   rider    [head + kFreshTallyWords, +riderWords) one small allreduce's
//                             key and data (rider.h), reduced when every
//                             rank carries the same key (RiderSection).
//
// head = kVoteHeader + the number of cache ids, the same on every rank;
// the rider section's length is agreed one round ahead (kRiderRoom), so
// every rank's vote has the same length.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace tfring {
namespace runtime {

constexpr int kVoteHeader = 3;
constexpr int kFreshSlots = 8;                                     // names per rank
constexpr int kFreshWords = 1 + 3 * kFreshSlots;                   // one rank's list
constexpr int kFreshTallyWords = kFreshWords + 1 + kFreshSlots;    // the merged form

// The header's words.
enum VoteHeaderWord : int { kHeldResponse = 0, kNoCoordinator = 1, kRiderRoom = 2 };

// The fresh section. A rank writes its list:
//   [0]                n, the names offered (at most kFreshSlots);
//   [1 + 3i ..]        slot i: {name hash, full hash low word, high word}.
// The tally keeps the list form for the full hashes found on every rank's
// list (in the order of rank 0's list), then
//   [kFreshWords]      m, and m name hashes found on every rank's list.
struct FreshSection {
  static constexpr int kSlotWords = 3;
  static int32_t& count(int32_t* f) { return f[0]; }
  static int32_t count(const int32_t* f) { return f[0]; }
  static int32_t* slot(int32_t* f, int i) { return f + 1 + kSlotWords * i; }
  static const int32_t* slot(const int32_t* f, int i) { return f + 1 + kSlotWords * i; }
  static void setSlot(int32_t* f, int i, uint32_t name, uint64_t full) {
    int32_t* s = slot(f, i);
    s[0] = static_cast<int32_t>(name);
    s[1] = static_cast<int32_t>(static_cast<uint32_t>(full));
    s[2] = static_cast<int32_t>(static_cast<uint32_t>(full >> 32));
  }
  static uint64_t fullHash(const int32_t* f, int i) {
    const int32_t* s = slot(f, i);
    return static_cast<uint64_t>(static_cast<uint32_t>(s[1])) |
           (static_cast<uint64_t>(static_cast<uint32_t>(s[2])) << 32);
  }
  // Tally form: the name hashes on every rank's list.
  static int32_t& nameCount(int32_t* f) { return f[kFreshWords]; }
  static int32_t nameCount(const int32_t* f) { return f[kFreshWords]; }
  static int32_t* names(int32_t* f) { return f + kFreshWords + 1; }
  static const int32_t* names(const int32_t* f) { return f + kFreshWords + 1; }
};

// The rider section: a key of kKeyWords, then the payload.
//   key {kCached, cache id, 0}     a cached tensor;
//   key {kFresh, full hash lo, hi} a first appearance (fresh_names.h);
//   key {kNone, 0, 0}              no rider (or ranks chose differently).
struct RiderSection {
  static constexpr size_t kKeyWords = 3;
  enum Kind : int32_t { kNone = 0, kCached = 1, kFresh = 2 };
  static int32_t* data(int32_t* r) { return r + kKeyWords; }
  static const int32_t* data(const int32_t* r) { return r + kKeyWords; }
  static size_t words(int64_t payload_bytes) {
    return payload_bytes > 0 ? kKeyWords + static_cast<size_t>((payload_bytes + 3) / 4) : 0;
  }
};

// One round's vote buffer, and after the vote its tally.
class VoteWords {
 public:
  // Lays out a vote for `ids` cache ids and `rider_words` rider words,
  // every word 1 (a Min-reduced word that says nothing).
  void reset(size_t ids, size_t rider_words) {
    ids_ = ids;
    rider_words_ = rider_words;
    w_.assign(head() + kFreshTallyWords + rider_words, 1);
  }
  int32_t& header(VoteHeaderWord h) { return w_[h]; }
  int32_t& id(size_t i) { return w_[kVoteHeader + i]; }
  int32_t* fresh() { return w_.data() + head(); }
  int32_t* rider() { return w_.data() + head() + kFreshTallyWords; }
  size_t riderWords() const { return rider_words_; }
  // The words before the fresh section (the Min-reduced ones).
  size_t head() const { return kVoteHeader + ids_; }
  int32_t* data() { return w_.data(); }
  // Scratch for the vote's collective.
  std::vector<int32_t>* scratch() { return &scratch_; }
  // The words a vote of `ids` cache ids and `rider_words` takes.
  static size_t size(size_t ids, size_t rider_words) {
    return kVoteHeader + ids + kFreshTallyWords + rider_words;
  }

 private:
  size_t ids_ = 0, rider_words_ = 0;
  std::vector<int32_t> w_, scratch_;
};

}  // namespace runtime
}  // namespace tfring
