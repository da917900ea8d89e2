// Rabenseifner's allreduce over point-to-point links
// (transport/peer_links.h): a recursive-halving reduce-scatter followed by a
// recursive-doubling allgather. It moves 2(p-1)/p of the buffer per rank,
// like the ring, in 2 log2(p) steps instead of 2(N-1): the choice for
// medium buffers across many ranks.
//
// Ranks pair as in recursive doubling (transport::recursiveLayout; p the
// largest power of two <= N, r = N - p), and the buffer is cut into p
// blocks (evenSplit), block b belonging to virtual rank b.
//   0. Fold (r > 0): extra rank 2i sends its buffer to rank 2i+1, which
//      combines op(buffer of 2i, its own).
//   1. Reduce-scatter, mask = p/2, ..., 1: my blocks are the 2*mask-aligned
//      range holding block v (my virtual rank). I keep the half of it that
//      holds v, send the other half to v ^ mask and receive its copy of my
//      half, combining op(lower rank's, higher rank's). Afterwards I alone
//      hold block v fully reduced; I apply the postscale to it.
//   2. Allgather, mask = 1, ..., p/2: I send my mask-aligned range of blocks
//      to v ^ mask and receive its range next to mine, in place.
//   3. Unfold (r > 0): rank 2i+1 sends the whole result to rank 2i.
// Every block is reduced along one tree by the ranks that keep it and then
// only copied, so the result is bitwise identical on every rank.
// Critical path: 2 log2(p) exchanges, plus 2 hops for the fold.
#include <cstring>

#include "collectives/allreduce.h"
#include "collectives/recursive_fold.h"
#include "kernels/cpu/reduce.h"

namespace tfring {
namespace collectives {

void rabenseifnerAllreduce(RingComm& c, const void* in, void* out, size_t count, DataType dtype,
                           ReduceOp op, double postscale, AllreduceStats* st) {
  transport::HostLinks& H = *c.host;
  transport::PeerLinks& P = H.peers();
  const int N = c.size;
  const int rank = c.ring[c.pos];
  const transport::RecursiveLayout L = transport::recursiveLayout(rank, N);
  const size_t es = dtypeSize(dtype), bytes = count * es;
  char* buf = static_cast<char*>(out);
  if (out != in && bytes) std::memcpy(buf, in, bytes);
  const Deadline deadline = Deadline::in(c.timeout_s);
  const char* what = "allreduce (Rabenseifner)";
  st->hops = 2 * static_cast<uint64_t>(L.log2p) + (L.r > 0 ? 2 : 0);
  st->bytes_sent = 0;

  // Extra ranks need no scratch: they only send and receive whole buffers.
  char* tmp = nullptr;
  if (L.vrank >= 0) {
    if (H.peer_scratch.size() < bytes) H.peer_scratch.resize(bytes);
    tmp = H.peer_scratch.data();
  }
  if (!recursiveFoldIn(P, L, buf, tmp, count, dtype, op, deadline, what, st)) return;
  const std::vector<size_t> blk = evenSplit(count, L.p);  // element offsets
  const int v = L.vrank;
  // Blocks [lo, hi) as a byte range of the buffer.
  auto at = [&](int b) { return blk[b] * es; };

  int lo = 0, hi = L.p;
  for (int mask = L.p / 2; mask >= 1; mask >>= 1) {  // reduce-scatter
    const int q = L.partner(mask);
    const int mid = lo + mask;
    const bool upper = (v & mask) != 0;
    const int keep_lo = upper ? mid : lo, keep_hi = upper ? hi : mid;
    const int give_lo = upper ? lo : mid, give_hi = upper ? mid : hi;
    const size_t keep_bytes = at(keep_hi) - at(keep_lo);
    const size_t give_bytes = at(give_hi) - at(give_lo);
    transport::exchange(P.to(q), buf + at(give_lo), give_bytes, tmp, keep_bytes, deadline, what);
    st->bytes_sent += give_bytes;
    combineOrdered(buf + at(keep_lo), tmp, keep_bytes / es, dtype, op, rank < q);
    lo = keep_lo;
    hi = keep_hi;
  }
  if (postscale != 1.0) kernels::scale(buf + at(v), blk[v + 1] - blk[v], dtype, postscale);
  for (int mask = 1; mask < L.p; mask <<= 1) {  // allgather
    const int q = L.partner(mask);
    const int mine_lo = v & ~(mask - 1), theirs_lo = (v ^ mask) & ~(mask - 1);
    const size_t send_bytes = at(mine_lo + mask) - at(mine_lo);
    const size_t recv_bytes = at(theirs_lo + mask) - at(theirs_lo);
    transport::exchange(P.to(q), buf + at(mine_lo), send_bytes, buf + at(theirs_lo), recv_bytes,
                        deadline, what);
    st->bytes_sent += send_bytes;
  }
  recursiveFoldOut(P, L, buf, bytes, deadline, what, st);
}

}  // namespace collectives
}  // namespace tfring
