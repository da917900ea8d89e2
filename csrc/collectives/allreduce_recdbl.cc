// Recursive-doubling allreduce over point-to-point links
// (transport/peer_links.h): the latency optimum for small buffers when the
// ranks do not share one host segment.
//
// Ranks pair by the bits of their virtual rank (transport::recursiveLayout):
// p is the largest power of two <= N and r = N - p.
//   0. Fold (only when r > 0): each extra rank 2i (i < r) sends its whole
//      buffer to rank 2i+1, which combines op(buffer of 2i, its own).
//   1. For mask = 1, 2, ..., p/2: virtual rank v swaps its whole buffer
//      with virtual rank v ^ mask, and both compute op(lower rank's buffer,
//      higher rank's buffer). Real ranks grow with virtual ranks, so before
//      step `mask` every rank of a 2*mask-aligned group with bit `mask`
//      clear holds the same value A, every rank with it set holds B, and
//      every pair computes op(A, B): after the last step all p ranks hold
//      bitwise the same result. Each applies the postscale to it.
//   2. Unfold (only when r > 0): rank 2i+1 sends the result to rank 2i.
// Critical path: log2(p) exchanges, plus 2 hops for the fold and unfold;
// every participant sends the whole buffer in each of its steps.
#include <cstring>

#include "collectives/allreduce.h"
#include "collectives/recursive_fold.h"
#include "kernels/cpu/reduce.h"

namespace tfring {
namespace collectives {

// Combines `mine` with `theirs` (the peer's buffer, in `tmp`) as
// op(lower rank's, higher rank's), leaving the result in `mine`.
void combineOrdered(char* mine, char* theirs, size_t count, DataType dtype, ReduceOp op,
                    bool i_am_lower) {
  if (count == 0) return;
  if (i_am_lower) {
    kernels::reduce(mine, theirs, count, dtype, op);
  } else {
    kernels::reduce(theirs, mine, count, dtype, op);
    std::memcpy(mine, theirs, count * dtypeSize(dtype));
  }
}

void recdblAllreduce(RingComm& c, const void* in, void* out, size_t count, DataType dtype,
                     ReduceOp op, double postscale, AllreduceStats* st) {
  transport::HostLinks& H = *c.host;
  transport::PeerLinks& P = H.peers();
  const int N = c.size;
  const int rank = c.ring[c.pos];
  const transport::RecursiveLayout L = transport::recursiveLayout(rank, N);
  const size_t es = dtypeSize(dtype), bytes = count * es;
  char* buf = static_cast<char*>(out);
  if (out != in && bytes) std::memcpy(buf, in, bytes);
  if (H.peer_scratch.size() < bytes) H.peer_scratch.resize(bytes);
  char* tmp = H.peer_scratch.data();
  const Deadline deadline = Deadline::in(c.timeout_s);
  const char* what = "allreduce (recursive doubling)";
  st->hops = static_cast<uint64_t>(L.log2p) + (L.r > 0 ? 2 : 0);
  st->bytes_sent = 0;

  if (!recursiveFoldIn(P, L, buf, tmp, count, dtype, op, deadline, what, st)) return;
  for (int mask = 1; mask < L.p; mask <<= 1) {
    const int q = L.partner(mask);
    transport::exchange(P.to(q), buf, bytes, tmp, bytes, deadline, what);
    st->bytes_sent += bytes;
    combineOrdered(buf, tmp, count, dtype, op, rank < q);
  }
  if (postscale != 1.0) kernels::scale(buf, count, dtype, postscale);
  recursiveFoldOut(P, L, buf, bytes, deadline, what, st);
}

}  // namespace collectives
}  // namespace tfring
