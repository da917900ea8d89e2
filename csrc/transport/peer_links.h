// PeerLinks: direct TCP connections between ranks that are not ring
// neighbours, for the latency-optimal algorithms (recursive doubling and
// Rabenseifner, collectives/allreduce_recdbl.cc and
// allreduce_rabenseifner.cc, the recursive-doubling allgather, the tree
// broadcasts) and the agreement round's recursive-doubling vote.
//
// Those algorithms pair ranks by the bits of a "virtual rank" (see
// recursiveLayout below), so each rank talks to at most log2(N) + 1 peers:
// one per bit of the largest power of two p <= N, plus the partner it folds
// with when N is not a power of two. Every rank listens on one more port,
// published in its peer record with its ring port (RingLinks::connect).
//
// A link is opened when first used, as NCCL connects its peers: to(q)
// connects if this is the lower rank of the pair, and accepts otherwise
// (taking in, on the way, any other peer's connection that arrives first).
// Both ranks of a pair reach the step that uses their link, so neither waits
// for a rank that is waiting on it; an idle rank, though, is woken by the
// vote only through bytes on an open link or a partner connecting, so when
// the host vote gives way to recdbl its links open at once, on every rank
// (runtime/vote_channel.h). Init opens none: at 128 ranks on 32
// hosts only the hosts' local ranks 0 ever link (the host vote), and the
// other ranks' start-up skips about 8 handshakes each. Every connection is
// authenticated with the job secret (wire::kPurposePeer) and carries both
// directions.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/rank_labels.h"
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
  // listen_fd is this rank's (owned from now on). `peers`: the ranks this
  // one may link with (recursivePeers and the relations every rank states
  // symmetrically: q lists this rank when this rank lists q). Connecting
  // waits at most timeout_s, and ends once `abort` (the communicator's
  // failure state, outliving this object) is set. Messages name ranks by
  // `labels`.
  PeerLinks(int rank, std::vector<int> peers, std::vector<std::string> addrs,
            std::vector<int> ports, int listen_fd, std::string secret, double timeout_s,
            AbortState* abort, RankLabels labels = RankLabels());
  ~PeerLinks();
  PeerLinks(const PeerLinks&) = delete;
  PeerLinks& operator=(const PeerLinks&) = delete;

  // The link to `peer`, opened first if needed; throws kInternal if `peer`
  // is not one of this rank's peers, and names it when it cannot connect.
  PeerLink& to(int peer);
  // The links open so far, in the order they opened (indices stay valid).
  int count() const { return static_cast<int>(links_.size()); }
  // The ranks this one may link with.
  int peerCount() const { return static_cast<int>(peers_.size()); }
  PeerLink& at(int i) { return *links_[i]; }
  // How messages name rank `r` (its global rank in a process set).
  int label(int r) const { return label_(r); }
  // Readable when a peer is connecting; acceptPending() takes such
  // connections in without waiting for more. Both for an idle engine, so a
  // partner opening a link is not left waiting for this rank's next call.
  int listenFd() const { return listen_fd_; }
  void acceptPending();

 private:
  PeerLink* find(int peer);
  PeerLink& add(int peer, int fd);
  // Accepts and authenticates one connection if one comes before `until`.
  void acceptOne(const Deadline& until);

  int rank_;
  std::vector<int> peers_;  // sorted
  std::vector<std::string> addrs_;
  std::vector<int> ports_;
  int listen_fd_;
  std::string secret_;
  double timeout_s_;
  AbortState* abort_;
  RankLabels label_;
  std::string rejected_;  // the last connection refused, for timeouts
  std::vector<std::unique_ptr<PeerLink>> links_;
};

// Sends `sbytes` from `send` to the link's peer while receiving `rbytes`
// into `recv` (either may be 0), both at once so neither side can block
// the other; returns when both are done. Deadline, abort and peer health
// are enforced by the link's waiter.
//
// In a two-way exchange only the first kExchangeLead bytes go out before
// the peer's first bytes arrive: those show that the peer has received all
// of its previous step, from another rank, over its host's incoming link.
// Sent earlier, the rest would share that link with the previous step's
// last bytes and hold them back, so the rank that is late would be made
// later at every step (recursive halving and doubling pair ranks anew each
// step, so a rank that is early sends to one still receiving).
// The peer sends its own lead unconditionally, so neither side waits for
// the other forever.
constexpr size_t kExchangeLead = 64 << 10;
void exchange(PeerLink& L, const void* send, size_t sbytes, void* recv, size_t rbytes,
              const Deadline& deadline, const char* what);

}  // namespace transport
}  // namespace tfring
