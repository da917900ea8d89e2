// Recursive-doubling allgather over point-to-point links
// (transport/peer_links.h): log2(p) steps instead of the ring's N-1, the
// latency optimum for small outputs at scale.
//
// Ranks pair as in the recursive allreduces (transport::recursiveLayout; p
// the largest power of two <= N, r = N - p). The output holds the blocks
// in rank order, and virtual ranks keep that order: virtual rank v owns the
// blocks of real ranks [lo(v), lo(v+1)), with lo(v) = 2v for v < r (the
// pair 2v, 2v+1) and v + r above. So any range of virtual ranks is one
// contiguous byte range of the output, whatever each rank's block size.
//   0. Fold (r > 0): extra rank 2i sends its block to rank 2i+1.
//   1. For mask = 1, 2, ..., p/2: virtual rank v holds the blocks of the
//      mask-aligned range of virtual ranks around v; it sends that range to
//      v ^ mask and receives that rank's range beside it, in place.
//   2. Unfold (r > 0): rank 2i+1 sends rank 2i everything but rank 2i's
//      own block (the bytes before it, then the bytes after it).
// Only bytes move, so the output is the ring's, bitwise.
// Critical path: log2(p) exchanges, plus 2 hops for the fold.
#include "collectives/allgather.h"
#include "common/clock.h"
#include "transport/host_links.h"

namespace tfring {
namespace collectives {

void recdblAllgather(RingComm& c, void* out, const std::vector<size_t>& rank_bytes,
                     CollectiveStats* st) {
  transport::PeerLinks& P = c.host->peers();
  const int N = c.size;
  const int rank = c.ring[c.pos];
  const transport::RecursiveLayout L = transport::recursiveLayout(rank, N);
  std::vector<size_t> off(N + 1, 0);  // byte offset of each rank's block
  for (int q = 0; q < N; ++q) off[q + 1] = off[q] + rank_bytes[q];
  const size_t total = off[N];
  char* base = static_cast<char*>(out);
  const Deadline deadline = Deadline::in(c.timeout_s);
  const char* what = "allgather (recursive doubling)";
  st->hops = static_cast<uint64_t>(L.log2p) + (L.r > 0 ? 2 : 0);
  st->bytes_sent = 0;

  // The first rank of virtual rank v's blocks (v == p gives N).
  auto lo = [&](int v) { return v < L.r ? 2 * v : v + L.r; };
  if (L.vrank < 0) {  // extra rank: hand in my block, take back the rest
    transport::PeerLink& f = P.to(L.fold_peer);
    transport::exchange(f, base + off[rank], rank_bytes[rank], nullptr, 0, deadline, what);
    transport::exchange(f, nullptr, 0, base, off[rank], deadline, what);
    transport::exchange(f, nullptr, 0, base + off[rank + 1], total - off[rank + 1], deadline,
                        what);
    st->bytes_sent = rank_bytes[rank];
    return;
  }
  if (L.fold_peer >= 0) {
    const int x = L.fold_peer;
    transport::exchange(P.to(x), nullptr, 0, base + off[x], rank_bytes[x], deadline, what);
  }
  const int v = L.vrank;
  for (int mask = 1; mask < L.p; mask <<= 1) {
    const int q = L.partner(mask);
    const int mine = v & ~(mask - 1), theirs = (v ^ mask) & ~(mask - 1);
    const size_t s0 = off[lo(mine)], s1 = off[lo(mine + mask)];
    const size_t r0 = off[lo(theirs)], r1 = off[lo(theirs + mask)];
    transport::exchange(P.to(q), base + s0, s1 - s0, base + r0, r1 - r0, deadline, what);
    st->bytes_sent += s1 - s0;
  }
  if (L.fold_peer >= 0) {
    const int x = L.fold_peer;
    transport::PeerLink& f = P.to(x);
    transport::exchange(f, base, off[x], nullptr, 0, deadline, what);
    transport::exchange(f, base + off[x + 1], total - off[x + 1], nullptr, 0, deadline, what);
    st->bytes_sent += total - rank_bytes[x];
  }
}

}  // namespace collectives
}  // namespace tfring
