// VoteChannel (vote_channel.h): the vote's algorithm, and the links an idle
// rank watches for a round a peer started.
#include "runtime/vote_channel.h"

#include <algorithm>

#include "common/clock.h"
#include "transport/peer_links.h"

namespace tfring {
namespace runtime {

namespace {
constexpr double kLeftGrace = 2.0;  // a closed vote link waits for the coordinator's word
}  // namespace

VoteChannel::VoteChannel(transport::RingLinks& links, Inbox& in) : links_(links), in_(in) {
  const transport::HostLinks* H = links_.host();
  recdbl_ = links_.topology().size > 1 && H && H->vote_recdbl && H->want_peers;
  host_ = recdbl_ && H->vote_host;
  setWatch();
}

VoteStats VoteChannel::exchange(collectives::RingComm& comm, VoteWords& v, const VoteExtra* x) {
  // Every rank ends with the same tally (runtime/vote.h).
  if (host_) {
    freshListToTally(v.fresh());
    return hostVote(comm, ++host_round_, v.data(), v.head(), v.scratch(), x);
  }
  if (recdbl_) {
    freshListToTally(v.fresh());
    return recdblVote(comm, v.data(), v.head(), v.scratch(), x);
  }
  return ringVote(comm, v.data(), v.head(), v.scratch(), x);
}

void VoteChannel::leaveHostIfFull(size_t words) {
  // Every rank sees the same ids and room after a round, so all decide
  // alike at the same round.
  if (host_ && !hostVoteFits(words)) {
    host_ = false;
    openRecdblLinks();
    setWatch();
  }
}

void VoteChannel::openRecdblLinks() {
  // An idle rank hears of a recdbl round only through bytes on its open
  // vote links, or a partner connecting to its listener. The lower rank of
  // a pair connects (peer_links.h): a higher rank that started a round
  // over a link not yet open would wait to accept it, sending nothing,
  // while the lower rank, idle with nothing of its own to vote on, never
  // learns of the round. So every link the flat vote uses opens here,
  // where every rank is, at the end of the same round. In ascending order
  // each rank first accepts its lower partners (taking them in whatever
  // order they come), then connects to its higher ones, which are then
  // accepting or on their way to it: no rank waits for one waiting on it.
  const transport::Topology& T = links_.topology();
  transport::PeerLinks& P = links_.host()->peers();
  for (int q : transport::recursivePeers(T.rank, T.size)) P.to(q);
}

void VoteChannel::addPollFds(std::vector<struct pollfd>* fds) const {
  for (size_t i = 0; i < fds_.size(); ++i)
    if (closed_at_[i] == 0) fds->push_back({fds_[i], POLLIN, 0});
  // A partner opening a link (its first vote with this rank).
  if (!watch_complete_) fds->push_back({links_.host()->peers().listenFd(), POLLIN, 0});
}

bool VoteChannel::peerStartedRound() {
  if (!links_.left()) return false;  // a job of one
  const void* p = nullptr;
  try {
    if (host_) return hostStartedVote();
    if (recdbl_) return peerStartedVote();
    return links_.left()->peek(&p, 1) > 0;
  } catch (const Error&) {
    // The left link failed: start a round, which reports it properly
    // (unless this rank is on its way out anyway).
    return !in_.isStopping();
  }
}

bool VoteChannel::peerStartedVote() {
  // A round's first bytes may come from any of the vote's partners. A
  // partner that closes its link while this rank is idle has usually shut
  // down (its goodbye reaches this rank through the coordinator as
  // kMsgLeft, after which rounds fail naming it without voting): the link
  // is left alone for kLeftGrace, and only then, or when this rank has
  // work of its own, does a round report it (its exchange fails naming the
  // partner). A killed partner is named sooner by the coordinator.
  transport::PeerLinks& P = links_.host()->peers();
  // A partner opening its link to this idle rank: take it in, and watch it.
  // (Checked on every look for a round, so only while a link is missing.)
  if (!watch_complete_) {
    P.acceptPending();
    if (P.count() != watch_count_) setWatch();
  }
  const void* p = nullptr;
  for (size_t k = 0; k < watched_.size(); ++k) {
    const int i = watched_[k];
    if (closed_at_[k] > 0) {
      if (in_.left_rank.load() < 0 && nowSeconds() - closed_at_[k] > kLeftGrace) return true;
      continue;
    }
    try {
      if (P.at(i).recv->peek(&p, 1) > 0) return true;
    } catch (const Error&) {
      if (in_.isStopping()) return false;
      closed_at_[k] = nowSeconds();
    }
  }
  return false;
}

bool VoteChannel::hostStartedVote() {
  const transport::HostLinks* H = links_.host();
  if (const transport::HostSegment* seg = H->segment.get())
    for (int q = 0; q < seg->localSize(); ++q)
      if (seg->words(q).vote_arrive.load(std::memory_order_acquire) > host_round_) return true;
  return H->local_rank == 0 && peerStartedVote();
}

void VoteChannel::setWatch() {
  // Flat recursive doubling: every link may bring a round's first bytes.
  // The host vote: only local rank 0's links to the other hosts' local
  // ranks 0 (the others hear of a round through the segment).
  watched_.clear();
  fds_.clear();
  closed_at_.clear();
  const transport::HostLinks* H = links_.host();
  // The links open when first used: the watch covers those open so far,
  // and is set again when more have opened (peerStartedVote) until every
  // link the vote uses is watched.
  watch_count_ = recdbl_ ? H->peers().count() : 0;
  watch_complete_ = true;
  if (recdbl_) {
    transport::PeerLinks& P = H->peers();
    std::vector<int> watch;
    if (host_ && H->local_rank == 0)
      for (int h : transport::recursivePeers(H->cross_rank, H->num_hosts))
        watch.push_back(H->leaders[h]);
    for (int i = 0; i < P.count(); ++i) {
      if (host_ && std::find(watch.begin(), watch.end(), P.at(i).rank) == watch.end())
        continue;
      watched_.push_back(i);
      fds_.push_back(P.at(i).recv->pollFd());
    }
    // Flat: every partner votes; the host vote: local rank 0's partners.
    const size_t wanted = host_ ? watch.size() : static_cast<size_t>(P.peerCount());
    watch_complete_ = watched_.size() == wanted;
  }
  closed_at_.assign(fds_.size(), 0);
}

}  // namespace runtime
}  // namespace tfring
