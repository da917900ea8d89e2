// Rabenseifner's allreduce (allreduce_rabenseifner.cc) on a 16-bit wire:
// the same pairs, blocks and steps, with every exchange carrying float16 or
// bfloat16 words and every combine done in float32 (kernels/cpu/wire16.h).
//
// Why this tree keeps its error near one rounding at any rank count: a
// block's partial is rounded to 16 bits once per halving step it is sent,
// log2(p) times, and the partial sent at step j holds the sums of 2^j
// ranks, so the roundings grow geometrically and add up to about two
// roundings of the final sum, where the ring rounds N-1 partials that
// grow linearly (docs/compression.md has the measurements). The bytes are
// the ring's: 2(p-1)/p of the buffer in 16-bit words.
//
//   0. Sum and Average scale the input by the postscale first (partials of
//      an average stay within the inputs' range); fold: an extra rank sends
//      its words, its partner folds them in.
//   1. Reduce-scatter: narrow the half I give, widen and fold the half I
//      keep. Then the block I own is final: scaled (min, max, product) and
//      replaced by its 16-bit rounding, the value every rank will hold.
//   2. Allgather and unfold: words of final blocks, narrowed exactly and
//      widened into place.
#include <algorithm>
#include <cstring>

#include "collectives/allreduce.h"
#include "kernels/cpu/reduce.h"
#include "kernels/cpu/wire16.h"

namespace tfring {
namespace collectives {

void rabenseifnerWireAllreduce(RingComm& c, const void* in, void* out, size_t count,
                               ReduceOp op, double postscale, WireType wire,
                               AllreduceStats* st) {
  transport::HostLinks& H = *c.host;
  transport::PeerLinks& P = H.peers();
  const int N = c.size;
  const int rank = c.ring[c.pos];
  const transport::RecursiveLayout L = transport::recursiveLayout(rank, N);
  const size_t ws = kernels::wireWordBytes(wire);
  float* buf = static_cast<float*>(out);
  if (out != in) std::memcpy(buf, in, count * sizeof(float));
  const bool prescale = op == ReduceOp::kSum || op == ReduceOp::kAverage;
  if (prescale) kernels::scale(buf, count, DataType::kFloat32, postscale);
  const Deadline deadline = Deadline::in(c.timeout_s);
  const char* what = "allreduce (Rabenseifner, 16-bit wire)";
  st->hops = 2 * static_cast<uint64_t>(L.log2p) + (L.r > 0 ? 2 : 0);
  st->bytes_sent = 0;
  // Words out and words in, count of each at most.
  if (H.peer_scratch.size() < 2 * count * ws) H.peer_scratch.resize(2 * count * ws);
  char* words_out = H.peer_scratch.data();
  char* words_in = words_out + count * ws;
  auto send = [&](int peer, const float* from, size_t n) {
    kernels::narrow(words_out, from, n, wire);
    transport::exchange(P.to(peer), words_out, n * ws, nullptr, 0, deadline, what);
    st->bytes_sent += n * ws;
  };
  if (L.vrank < 0) {  // an extra rank: its words go to its partner and back
    send(L.fold_peer, buf, count);
    transport::exchange(P.to(L.fold_peer), nullptr, 0, words_in, count * ws, deadline, what);
    kernels::widen(buf, words_in, count, wire);
    return;
  }
  if (L.fold_peer >= 0) {
    transport::exchange(P.to(L.fold_peer), nullptr, 0, words_in, count * ws, deadline, what);
    kernels::widenReduce(buf, buf, words_in, count, wire, op);
  }
  const std::vector<size_t> blk = evenSplit(count, L.p);  // element offsets
  const int v = L.vrank;
  int lo = 0, hi = L.p;
  for (int mask = L.p / 2; mask >= 1; mask >>= 1) {  // reduce-scatter
    const int q = L.partner(mask);
    const int mid = lo + mask;
    const bool upper = (v & mask) != 0;
    const int keep_lo = upper ? mid : lo, keep_hi = upper ? hi : mid;
    const int give_lo = upper ? lo : mid, give_hi = upper ? mid : hi;
    const size_t keep = blk[keep_hi] - blk[keep_lo], give = blk[give_hi] - blk[give_lo];
    kernels::narrow(words_out, buf + blk[give_lo], give, wire);
    transport::exchange(P.to(q), words_out, give * ws, words_in, keep * ws, deadline, what);
    st->bytes_sent += give * ws;
    kernels::widenReduce(buf + blk[keep_lo], buf + blk[keep_lo], words_in, keep, wire, op);
    lo = keep_lo;
    hi = keep_hi;
  }
  const size_t mine = blk[v + 1] - blk[v];
  if (!prescale && postscale != 1.0)
    kernels::scale(buf + blk[v], mine, DataType::kFloat32, postscale);
  kernels::roundTrip(buf + blk[v], mine, wire);
  for (int mask = 1; mask < L.p; mask <<= 1) {  // allgather
    const int q = L.partner(mask);
    const int mine_lo = v & ~(mask - 1), theirs_lo = (v ^ mask) & ~(mask - 1);
    const size_t n_send = blk[mine_lo + mask] - blk[mine_lo];
    const size_t n_recv = blk[theirs_lo + mask] - blk[theirs_lo];
    kernels::narrow(words_out, buf + blk[mine_lo], n_send, wire);
    transport::exchange(P.to(q), words_out, n_send * ws, words_in, n_recv * ws, deadline, what);
    st->bytes_sent += n_send * ws;
    kernels::widen(buf + blk[theirs_lo], words_in, n_recv, wire);
  }
  if (L.fold_peer >= 0) send(L.fold_peer, buf, count);
}

}  // namespace collectives
}  // namespace tfring
