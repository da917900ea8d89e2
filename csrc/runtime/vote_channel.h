// VoteChannel: how a round's vote travels, and how an idle rank learns
// that a peer started a round.
//
// Three ways (runtime/vote.h): round the data ring, by recursive doubling
// over the point-to-point links ("recdbl"), or through the host's shared
// segment and recursive doubling among the hosts' local ranks 0 ("host").
// Every step of each carries bytes, so an idle rank joins a round when
// bytes reach it: on the ring, from its left neighbour; under recdbl, on
// any of its vote partners' links; under the host vote, as an arrival in
// the segment (local rank 0 also on its links to the other hosts).
//
// The host vote is left for recdbl, for good and on every rank at the same
// round, once the vote outgrows the segment's slots (leaveHostIfFull); the
// recdbl links open there, on every rank, so that the first recdbl round
// reaches an idle rank as its bytes do in every later round.
#pragma once

#include <poll.h>

#include <cstdint>
#include <vector>

#include "collectives/ring.h"
#include "runtime/inbox.h"
#include "runtime/vote.h"
#include "runtime/vote_words.h"
#include "transport/ring_links.h"

namespace tfring {
namespace runtime {

class VoteChannel {
 public:
  VoteChannel(transport::RingLinks& links, Inbox& in);
  bool recdbl() const { return recdbl_; }
  bool host() const { return host_; }
  // Whether a peer has started a round that this rank has not joined.
  bool peerStartedRound();
  // Runs the vote: v holds this rank's vote (its fresh section in list
  // form) and ends with the tally, the same on every rank.
  VoteStats exchange(collectives::RingComm& comm, VoteWords& v, const VoteExtra* x);
  // After a round: if the next round's vote of `words` words outgrows the
  // host segment's slots, every rank goes to recdbl here.
  void leaveHostIfFull(size_t words);
  // The idle wait under recdbl: the open vote links' sockets, and the
  // listening socket while a partner's link may still open.
  void addPollFds(std::vector<struct pollfd>* fds) const;

 private:
  void setWatch();       // which links an idle rank watches, by vote mode
  void openRecdblLinks();  // on leaving the host vote, on every rank alike
  bool peerStartedVote();  // on the recdbl links
  bool hostStartedVote();  // in the host segment: a local rank voted past us

  transport::RingLinks& links_;
  Inbox& in_;
  bool recdbl_ = false;
  // While on, idle ranks watch the host segment, and local rank 0 the
  // links to the other hosts' too.
  bool host_ = false;
  uint64_t host_round_ = 0;     // host-vote rounds so far, the same on every rank
  int watch_count_ = 0;         // the peer links open when links_ was set
  bool watch_complete_ = true;  // every link the vote uses is watched
  std::vector<int> watched_;    // indices of the watched links in the peer links
  std::vector<int> fds_;        // the links' sockets, for the idle wait
  // When each of those links was found closed while idle (0: open); see
  // peerStartedVote().
  std::vector<double> closed_at_;
};

}  // namespace runtime
}  // namespace tfring
