// The agreement round's vote as a collective (what a vote holds: see
// vote_words.h; its fresh-name part: fresh_names.h).
//
// Every rank contributes a vote and every rank ends with the same tally:
//   [0, head)            the element-wise minimum of every rank's header and
//                        cache-id bits (head = kVoteHeader + cache ids);
//   [head, +kFreshTallyWords) the fresh names every rank offered:
//       [0]              n, then n slots {name hash, full hash lo, hi}: the
//                        full hashes found on every rank's list, in the
//                        order of rank 0's list;
//       [kFreshWords]    m, then m name hashes found on every rank's list.
// mergeTally(lower ranks' tally, higher ranks' tally) is associative, and
// the fresh part keeps the lower side's order, so any grouping of the
// ranks into contiguous blocks merged lower-first gives the same tally.
//
// Three algorithms (TFRING_VOTE_ALGO, rank 0's value; auto picks):
//   ring    every vote goes round the data ring (an allgather, N-1 hops;
//           each step carries bytes, so an idle rank joins when bytes
//           reach it from its left neighbour), then each rank merges the N
//           votes in rank order.
//   recdbl  recursive doubling over the point-to-point links
//           (transport/peer_links.h), with the fold of the recursive
//           allreduces for N not a power of two: log2(p) hops, plus 2 when
//           N is not a power of two. An idle rank joins when bytes reach it
//           on any of its links. An extra rank cannot know that a round
//           started elsewhere, so its partner opens every round on the fold
//           link with a 4-byte wake token before it waits for the extra
//           rank's vote (off the critical path when both start together).
//   host    (vote_host.cc) through the host's shared segment to local rank
//           0, recursive doubling among the hosts' local ranks 0, and back
//           through the segment: log2(hosts) + 2 hops (+2 when the host
//           count is not a power of two), and only one rank per host on
//           TCP. Local rank 0 merges its host's votes in local rank order
//           (hosts are ordered by their first rank, so rank 0's list still
//           leads). A vote larger than the segment's slot (more cache ids
//           than kHostVoteSlotBytes holds) turns the job to recdbl for good,
//           on every rank at the same round.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "collectives/ring.h"
#include "runtime/vote_words.h"
#include "transport/host_links.h"

namespace tfring {
namespace runtime {

// kVoteHeader, kFreshSlots, kFreshWords, kFreshTallyWords: vote_words.h.

enum class VoteAlgo { kRing = 0, kRecDbl = 1, kHost = 2 };
constexpr int kNumVoteAlgos = 3;
const char* voteAlgoName(VoteAlgo a);

struct VoteStats {
  VoteAlgo algo = VoteAlgo::kRing;
  int size = 0;             // ranks
  uint64_t bytes = 0;       // the vote's size: what one rank contributes
  uint64_t hops = 0;        // sequential message steps on the critical path
  uint64_t bytes_sent = 0;  // what this rank sent
};
// A communicator's last round's stats, and its running totals per
// algorithm (kept in its CommStats).
VoteStats lastVoteStats(const collectives::CommStats& s);
uint64_t voteRounds(const collectives::CommStats& s, VoteAlgo a);
uint64_t voteHops(const collectives::CommStats& s, VoteAlgo a);
uint64_t voteBytesSent(const collectives::CommStats& s, VoteAlgo a);

// Words carried after the fresh tally, merged by the caller's function:
// the engine rides one small allreduce's data on the vote this way
// (rider.h). merge(lo, hi, out) must be elementwise (out may be lo
// or hi) and give the same bits on every rank for the same operands.
struct VoteExtra {
  size_t words = 0;
  void (*merge)(void* ctx, const int32_t* lo, const int32_t* hi, int32_t* out) = nullptr;
  void* ctx = nullptr;
};

// Turns the fresh list a rank wrote (kFreshWords at `fresh`) into its tally
// form, in place (`fresh` has room for kFreshTallyWords).
void freshListToTally(int32_t* fresh);

// out = merge(lo, hi) for tallies of `head + kFreshTallyWords` words (plus
// x->words extra words after them); `out` may be `lo` or `hi`.
void mergeTally(const int32_t* lo, const int32_t* hi, int32_t* out, size_t head,
                const VoteExtra* x = nullptr);

// The ring vote. `tally` holds this rank's vote (head + kFreshWords words,
// the list not yet in tally form; room for head + kFreshTallyWords, then
// x->words extra words) and ends with the tally. `all` is scratch. Both
// return (and record) the round's stats.
VoteStats ringVote(collectives::RingComm& c, int32_t* tally, size_t head,
                   std::vector<int32_t>* all, const VoteExtra* x = nullptr);

// The recursive-doubling vote over c.host->peers. `tally` holds this rank's
// vote in tally form (then x->words extra words) and ends with the merged
// tally. `tmp` is scratch.
VoteStats recdblVote(collectives::RingComm& c, int32_t* tally, size_t head,
                     std::vector<int32_t>* tmp, const VoteExtra* x = nullptr);

// The host vote (vote_host.cc). `round` counts host-vote rounds, the same
// on every rank; `tally` as for recdblVote. hostVoteFits says whether a
// vote of `words` int32 fits the segments' slots (kHostVoteSlotBytes on
// every host, so the answer is the same on a host without a segment).
VoteStats hostVote(collectives::RingComm& c, uint64_t round, int32_t* tally, size_t head,
                   std::vector<int32_t>* tmp, const VoteExtra* x = nullptr);
bool hostVoteFits(size_t words);

// Recursive doubling of tallies among N ranks: members[0..N) (global ranks
// in merge order, linked in c.host->peers), or ranks 0..N-1 when members
// is null; this rank is the one at `index`. Fills st.hops and adds what it
// sent to st.bytes_sent.
void recdblAmong(collectives::RingComm& c, int N, const int* members, int index,
                 int32_t* tally, size_t head, std::vector<int32_t>* tmp, const VoteExtra* x,
                 const char* what, VoteStats* st);
// Records a round's stats into c's CommStats (lastVoteStats, the
// per-algorithm totals).
void recordVote(collectives::RingComm& c, const VoteStats& st);

}  // namespace runtime
}  // namespace tfring
