// Binomial-tree broadcast over point-to-point links
// (transport/peer_links.h): ceil(log2 N) hops instead of the ring's N-1,
// the latency optimum for small buffers at scale.
//
// It runs on the links the recursive algorithms already have
// (transport::recursiveLayout; p the largest power of two <= N, r = N - p,
// extra ranks 2i < 2r each paired with rank 2i+1, which holds virtual rank
// i). Let vr be the virtual rank of the root's pair (the root's own, or its
// partner's when the root is an extra rank) and u = v ^ vr.
//   0. An extra root sends the buffer to its partner (one hop more).
//   1. A binomial tree on the hypercube of virtual ranks, largest subtree
//      first: for mask = p/2, ..., 1, every v with u a multiple of 2*mask
//      that holds the buffer sends it to v ^ mask. So v receives once, from
//      v ^ lowbit(u), and then sends to v ^ m for m = lowbit(u)/2, ..., 1
//      (the root's pair: for every m). Every v is done after log2(p)
//      rounds of one message per rank.
//   2. Every rank 2i+1 sends the buffer to its extra rank 2i, unless 2i is
//      the root: one round more when any such rank exists.
// Critical path: log2(p) + [root is extra] + [an extra rank other than the
// root exists] rounds, ceil(log2 N) unless the root is an extra rank.
#include "collectives/broadcast.h"
#include "common/clock.h"
#include "transport/host_links.h"

namespace tfring {
namespace collectives {

void treeBroadcast(RingComm& c, void* data, size_t bytes, int root_rank, CollectiveStats* st) {
  transport::PeerLinks& P = c.host->peers();
  const int N = c.size;
  const int rank = c.ring[c.pos];
  const transport::RecursiveLayout L = transport::recursiveLayout(rank, N);
  const int R = root_rank;
  const RootPlace place = rootPlace(L.r, R);
  const bool root_extra = place.root_extra, other_extras = place.other_extras;
  const int vr = place.vroot;
  char* buf = static_cast<char*>(data);
  const Deadline deadline = Deadline::in(c.timeout_s);
  const char* what = "broadcast (binomial tree)";
  st->hops = static_cast<uint64_t>(L.log2p) + (root_extra ? 1 : 0) + (other_extras ? 1 : 0);
  st->bytes_sent = 0;
  auto send = [&](int q) {
    transport::exchange(P.to(q), buf, bytes, nullptr, 0, deadline, what);
    st->bytes_sent += bytes;
  };
  auto recv = [&](int q) { transport::exchange(P.to(q), nullptr, 0, buf, bytes, deadline, what); };

  if (L.vrank < 0) {  // extra rank: the root hands the buffer in, others get it last
    if (rank == R)
      send(L.fold_peer);
    else
      recv(L.fold_peer);
    return;
  }
  const int v = L.vrank, u = v ^ vr;
  if (root_extra && v == vr) recv(L.fold_peer);
  int top = L.p;  // masks below this one are mine to send
  if (u != 0) {
    top = u & -u;
    recv(L.real(v ^ top));
  }
  for (int m = top >> 1; m >= 1; m >>= 1) send(L.real(v ^ m));
  if (L.fold_peer >= 0 && L.fold_peer != R) send(L.fold_peer);
}

}  // namespace collectives
}  // namespace tfring
