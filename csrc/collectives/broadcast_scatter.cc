// Scatter-allgather broadcast (van de Geijn's) over point-to-point links
// (transport/peer_links.h): a binomial scatter of the buffer's p blocks,
// then a recursive-doubling allgather of them. Each rank moves about twice
// the buffer in 2 log2(p) steps, where the tree moves the whole buffer in
// each of log2(p) steps and the ring's first chunk takes N-1 hops: the
// choice for medium buffers at scale.
//
// The pairing is the tree's (broadcast_tree.cc): p the largest power of two
// <= N, r = N - p, extra ranks 2i < 2r each paired with rank 2i+1 (virtual
// rank i); vr the virtual rank of the root's pair and u = v ^ vr. The
// buffer is cut into p blocks (evenSplit), block b belonging to u = b.
//   0. An extra root sends the whole buffer to its partner.
//   1. Scatter, largest subtree first: v receives blocks [u, u + lowbit(u))
//      from v ^ lowbit(u), then for m = lowbit(u)/2, ..., 1 sends blocks
//      [u + m, u + 2m) to v ^ m (the root's pair: for every m < p).
//   2. Allgather, mask = 1, ..., p/2: v sends its mask-aligned range of
//      blocks (in u) to v ^ mask and receives that rank's range beside it.
//   3. Every rank 2i+1 sends the whole buffer to its extra rank 2i, unless
//      2i is the root.
// Only bytes move, so every rank ends with the root's buffer, bitwise.
// Critical path: 2 log2(p) + [root is extra] + [an extra rank other than
// the root exists] steps.
#include "collectives/broadcast.h"
#include "common/clock.h"
#include "transport/host_links.h"

namespace tfring {
namespace collectives {

void scatterAllgatherBroadcast(RingComm& c, void* data, size_t bytes, int root_rank,
                               CollectiveStats* st) {
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
  const char* what = "broadcast (scatter-allgather)";
  st->hops = 2 * static_cast<uint64_t>(L.log2p) + (root_extra ? 1 : 0) + (other_extras ? 1 : 0);
  st->bytes_sent = 0;
  const std::vector<size_t> off = evenSplit(bytes, L.p);  // byte offset of block b
  // Blocks [b0, b1) to rank q, or from it.
  auto send = [&](int q, int b0, int b1) {
    transport::exchange(P.to(q), buf + off[b0], off[b1] - off[b0], nullptr, 0, deadline, what);
    st->bytes_sent += off[b1] - off[b0];
  };
  auto recv = [&](int q, int b0, int b1) {
    transport::exchange(P.to(q), nullptr, 0, buf + off[b0], off[b1] - off[b0], deadline, what);
  };

  if (L.vrank < 0) {  // extra rank: the whole buffer, in or out
    if (rank == R)
      send(L.fold_peer, 0, L.p);
    else
      recv(L.fold_peer, 0, L.p);
    return;
  }
  const int v = L.vrank, u = v ^ vr;
  if (root_extra && v == vr) recv(L.fold_peer, 0, L.p);
  int top = L.p;
  if (u != 0) {
    top = u & -u;
    recv(L.real(v ^ top), u, u + top);
  }
  for (int m = top >> 1; m >= 1; m >>= 1) send(L.real(v ^ m), u + m, u + 2 * m);
  for (int mask = 1; mask < L.p; mask <<= 1) {
    const int q = L.real(v ^ mask);
    const int mine = u & ~(mask - 1), theirs = (u ^ mask) & ~(mask - 1);
    transport::exchange(P.to(q), buf + off[mine], off[mine + mask] - off[mine],
                        buf + off[theirs], off[theirs + mask] - off[theirs], deadline, what);
    st->bytes_sent += off[mine + mask] - off[mine];
  }
  if (L.fold_peer >= 0 && L.fold_peer != R) send(L.fold_peer, 0, L.p);
}

}  // namespace collectives
}  // namespace tfring
