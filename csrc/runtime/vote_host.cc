// The host vote (TFRING_VOTE_ALGO=host; see vote.h).
//
// Round v on a host with a shared segment (transport/shm/host_segment.h):
//   1. every local rank writes its vote (tally form) into its vote slot and
//      publishes vote_arrive = v; the others publish vote_ready = v as well
//      (they do not hold up the tally), then wait for every vote_ready;
//   2. local rank 0 waits for every vote_arrive, merges the slots into its
//      own vote in local rank order, and runs recursive doubling with the
//      other hosts' local ranks 0 over the point-to-point links;
//   3. it writes the tally into the tally slot and publishes vote_ready = v;
//      the others copy it out.
// A rank that starts a round wakes the idle ranks of its host: each idle
// rank sleeps on its own doorbell in the segment, and local rank 0, which
// also watches its TCP links, in poll() on its wake-up socket
// (transport/shm/host_wake.h). An idle local rank 0 joins when bytes reach
// it from another host, and then wakes its host in step 1.
// A host with one rank has no segment: its rank takes part in step 2 only.
#include <cstring>

#include "common/clock.h"
#include "common/status.h"
#include "runtime/vote.h"
#include "transport/shm/host_wake.h"

namespace tfring {
namespace runtime {

namespace {

// Rings every local rank's idle doorbell that has not voted in `round`
// yet, and local rank 0's wake-up socket if it polls.
void wakeHost(transport::HostLinks& H, uint64_t round) {
  transport::HostSegment& seg = *H.segment;
  for (int q = 0; q < seg.localSize(); ++q) {
    if (q == H.local_rank) continue;
    transport::HostRankWords& w = seg.words(q);
    if (w.vote_arrive.load(std::memory_order_seq_cst) >= round) continue;
    if (w.idle.sleeping.load(std::memory_order_seq_cst)) w.idle.ring();
  }
  if (H.local_rank != 0 && H.wake && seg.leaderPolling().load(std::memory_order_seq_cst))
    H.wake->ring();
}

}  // namespace

bool hostVoteFits(size_t words) {
  // The slot every host's segment has: a host of one rank has no segment,
  // yet its rank leaves the host vote with all the others.
  return words * sizeof(int32_t) <= transport::kHostVoteSlotBytes;
}

VoteStats hostVote(collectives::RingComm& c, uint64_t round, int32_t* tally, size_t head,
                   std::vector<int32_t>* tmp, const VoteExtra* x) {
  transport::HostLinks& H = *c.host;
  transport::HostSegment* seg = H.segment.get();
  const size_t words = head + kFreshTallyWords + (x ? x->words : 0);
  const size_t bytes = words * sizeof(int32_t);
  const char* what = "the agreement round's vote (host)";
  const Deadline deadline = Deadline::in(c.timeout_s);
  VoteStats st;
  st.algo = VoteAlgo::kHost;
  st.size = c.size;
  st.bytes = bytes;
  const int hosts = static_cast<int>(H.leaders.size());
  const transport::RecursiveLayout cross = transport::recursiveLayout(0, hosts);
  st.hops = 2 + static_cast<uint64_t>(cross.log2p) + (cross.r > 0 ? 2 : 0);

  const int me = H.local_rank;
  if (seg && me != 0) {
    std::memcpy(seg->voteSlot(me), tally, bytes);
    seg->publish(seg->words(me).vote_arrive, round);
    seg->publish(seg->words(me).vote_ready, round);
    wakeHost(H, round);
    seg->waitAll(&transport::HostRankWords::vote_ready, round, deadline, what, H.local_ranks);
    std::memcpy(tally, seg->voteSlot(seg->localSize()), bytes);
    st.bytes_sent = bytes;
    recordVote(c, st);
    return st;
  }
  if (seg) {
    seg->publish(seg->words(0).vote_arrive, round);
    wakeHost(H, round);
    seg->waitAll(&transport::HostRankWords::vote_arrive, round, deadline, what, H.local_ranks);
    for (int q = 1; q < seg->localSize(); ++q) mergeTally(tally, seg->voteSlot(q), tally, head, x);
  }
  VoteStats cr;
  recdblAmong(c, hosts, H.leaders.data(), H.cross_rank, tally, head, tmp, x, what, &cr);
  st.bytes_sent = cr.bytes_sent;
  if (seg) {
    std::memcpy(seg->voteSlot(seg->localSize()), tally, bytes);
    seg->publish(seg->words(0).vote_ready, round);
    st.bytes_sent += bytes;
  }
  recordVote(c, st);
  return st;
}

}  // namespace runtime
}  // namespace tfring
