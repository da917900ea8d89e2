// HostLinks: what the host-aware allreduce algorithms use besides the ring
// (collectives/allreduce.h): the host's shared segment and a TCP ring among
// the ranks that have the same local rank on every host ("cross ring").
// Set up by RingLinks::connect; every field that steers the choice of
// algorithm holds the same value on every rank.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/env.h"
#include "transport/channel.h"
#include "transport/peer_links.h"
#include "transport/shm/host_segment.h"
#include "transport/shm/host_wake.h"
#include "transport/waiter.h"

namespace tfring {
namespace transport {

// TFRING_VOTE_ALGO=auto votes by recursive doubling from this many ranks
// on, where the ring crosses TCP (runtime/vote.h; measured in
// docs/architecture.md#agreement-at-scale).
constexpr int kVoteRecdblMinRanks = 16;
// The host vote's slot per local rank in the host segment: a vote of up to
// about 16,000 cache ids (runtime/vote.h; larger votes go by recdbl).
constexpr uint64_t kHostVoteSlotBytes = 64 << 10;

struct HostLinks {
  // The job's policy (common/env.h), rank 0's values, agreed through the
  // store when the ring connected: which links are opened below depends
  // on it, and the collectives choose their algorithms by it.
  JobPolicy policy;
  // The agreement round votes by recursive doubling over `peers`
  // (runtime/vote.h) rather than round the ring; the same on every rank.
  bool vote_recdbl = false;
  // ... or through the host segment and among the hosts' local ranks 0
  // (the host vote, runtime/vote_host.cc); vote_recdbl is then set too,
  // for the votes too large for the segment's slots.
  bool vote_host = false;
  // Ranks below are places in the communicator (a process set's members
  // 0..n-1); messages print them through the links' rank labels.
  std::vector<int> leaders;           // rank of each host's local rank 0, in host order
  // Topology: hosts in order of their first rank; uniform when every host
  // has the same number of ranks (the host-aware algorithms need that).
  int num_hosts = 1;
  bool uniform = true;
  int local_rank = 0, local_size = 1;
  int cross_rank = 0;                 // my host's index
  std::vector<int> local_ranks;       // rank of each local rank here
  std::vector<int> cross_ranks;       // rank of my local rank per host

  // Null on a host with one rank.
  std::unique_ptr<HostSegment> segment;
  // With the host vote and a segment: local rank 0's wake-up socket (bound
  // there, connected to on the other local ranks).
  std::unique_ptr<HostWake> wake;
  uint64_t step = 0;                  // segment steps taken so far

  // Null unless num_hosts > 1 and uniform, and until openCross() opened
  // them (the hierarchical allreduce's first run; every rank runs it).
  std::unique_ptr<SendChannel> cross_send;
  std::unique_ptr<RecvChannel> cross_recv;
  std::unique_ptr<Waiter> cross_waiter;
  std::function<void()> open_cross;  // set where the cross ring is wanted
  void openCross() {
    if (cross_send || !open_cross) return;
    open_cross();
    open_cross = nullptr;
  }
  std::vector<char> scratch;          // the small cross-host exchange

  // Links to this rank's recursive-doubling partners, each opened when
  // first used (transport/peer_links.h): wanted (the same on every rank)
  // unless in a job of one or where no recursive algorithm can run
  // (transport/ring_links.cc); null where not wanted.
  bool want_peers = false;
  std::unique_ptr<PeerLinks> peer_links;
  PeerLinks& peers() const { return *peer_links; }
  std::vector<char> peer_scratch;     // the recursive allreduces' receive buffer
};

}  // namespace transport
}  // namespace tfring
