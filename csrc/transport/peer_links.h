// PeerLinks: direct TCP connections between ranks that are not ring
// neighbours, for the latency-optimal allreduce algorithms (recursive
// doubling and Rabenseifner, collectives/allreduce_recdbl.cc and
// allreduce_rabenseifner.cc).
//
// Those algorithms pair ranks by the bits of a "virtual rank" (see
// recursiveLayout below), so each rank talks to at most log2(N) + 1 peers:
// one per bit of the largest power of two p <= N, plus the partner it folds
// with when N is not a power of two. Setup (RingLinks::connect, at init):
// every rank listens on one more port, published in its peer record with
// its ring port; for each pair the lower rank connects and the higher one
// accepts, and every connection is authenticated with the job secret
// (wire::kPurposePeer). Each connection carries both directions.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common/clock.h"
#include "rendezvous/store.h"
#include "transport/channel.h"
#include "transport/waiter.h"

namespace tfring {
namespace transport {

// The pairing every recursive algorithm over `size` ranks uses (the fold of
// MPICH's recursive doubling): p is the largest power of two <= size and
// r = size - p. Ranks below 2r pair up (2i, 2i+1): the even one is "extra"
// and folds its data into the odd one, which takes virtual rank i; ranks at
// or above 2r take virtual rank rank - r. The p virtual ranks then pair by
// bits: at mask m, virtual rank v exchanges with v ^ m.
struct RecursiveLayout {
  int size = 1, p = 1, r = 0;
  int vrank = -1;        // my virtual rank, -1 for an extra rank
  int fold_peer = -1;    // the rank I fold with (either direction), or -1
  int log2p = 0;
  // The real rank of virtual rank v.
  int real(int v) const { return v < r ? 2 * v + 1 : v + r; }
  // The partner at mask m (only for vrank >= 0).
  int partner(int mask) const { return real(vrank ^ mask); }
};
RecursiveLayout recursiveLayout(int rank, int size);

// Every rank this rank exchanges with in a recursive algorithm, ascending.
std::vector<int> recursivePeers(int rank, int size);

struct PeerLink {
  int rank = -1;
  std::unique_ptr<SendChannel> send;
  std::unique_ptr<RecvChannel> recv;
  std::unique_ptr<Waiter> waiter;  // polls this link's socket
};

class PeerLinks {
 public:
  // addrs[q], ports[q]: where rank q's point-to-point listener is;
  // listen_fd is this rank's (the caller closes it). Every rank of the job
  // calls this at the same point of init; the store only tells whether the
  // job is still alive while it waits. Links go to this rank's
  // recursivePeers and to `extra` (a relation every rank states
  // symmetrically: q lists this rank when this rank lists q).
  static std::unique_ptr<PeerLinks> connect(rendezvous::Store& store, int rank, int size,
                                            const std::vector<std::string>& addrs,
                                            const std::vector<int>& ports, int listen_fd,
                                            const std::string& secret, const Deadline& deadline,
                                            const std::vector<int>& extra = {});
  // The link to `peer`; throws kInternal if there is none.
  PeerLink& to(int peer);
  int count() const { return static_cast<int>(links_.size()); }
  PeerLink& at(int i) { return *links_[i]; }

 private:
  std::vector<std::unique_ptr<PeerLink>> links_;
};

// Sends `sbytes` from `send` to the link's peer while receiving `rbytes`
// into `recv` (either may be 0), both at once so neither side can block
// the other; returns when both are done. Deadline, abort and peer health
// are enforced by the link's waiter.
void exchange(PeerLink& L, const void* send, size_t sbytes, void* recv, size_t rbytes,
              const Deadline& deadline, const char* what);

}  // namespace transport
}  // namespace tfring
