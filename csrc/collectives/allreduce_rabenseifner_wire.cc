// Rabenseifner's allreduce (allreduce_rabenseifner.cc) on a 16-bit wire:
// the same pairs, blocks and steps, with the exchanges carrying float16 or
// bfloat16 words and every combine done in float32 (kernels/cpu/wire16.h).
//
// Why this tree keeps its error near one rounding: a block's partial is
// rounded once per halving step it is sent, log2(p) times, and the partial
// sent at step j holds the sums of 2^j ranks, where the ring rounds N-1
// partials that grow to the whole sum. Every step adds about as much
// rounding error as it halves (p/2^(j+1) partials of 2^j ranks each), but
// the last steps carry the fewest bytes (the step with mask m sends m/p of
// the buffer). So the last t = wireTailSteps(p) reduce-scatter steps send
// 24-bit words instead (float32 with its low byte rounded off to nearest
// even: 15 fraction bits, an error 2^-5 of float16's, 2^-8 of bfloat16's):
// (2^t - 1)/p of the buffer at 3 bytes instead of 2, at most 1/16 more
// bytes than the reduce-scatter and allgather's 2(p-1)/p of the buffer in
// 16-bit words (docs/compression.md has the errors measured).
//
//   0. Sum and Average scale the input by the postscale first (partials of
//      an average stay within the inputs' range). Fold (N != p): an extra
//      rank sends its input in words, its partner folds them in.
//   1. Reduce-scatter, mask = p/2, ..., 1: send the half I give (16-bit
//      words, 24-bit in the last t steps), fold what I receive into the
//      half I keep. Then the block I own is final: scaled (min, max, product) and
//      replaced by its 16-bit rounding, the value every rank will hold.
//   2. Allgather and unfold: words of final blocks, narrowed exactly and
//      widened into place.
//
// Each exchange converts a piece at a time: words are narrowed a few
// pieces ahead of what the link has taken, and folded a piece at a time
// behind what it has delivered, so the conversions overlap the transfer
// instead of preceding and following it. The combine is elementwise, so
// the pieces change no bits.
#include <algorithm>
#include <cstdint>
#include <cstring>

#include "collectives/allreduce.h"
#include "kernels/cpu/reduce.h"
#include "kernels/cpu/wire16.h"

namespace tfring {
namespace collectives {

int wireTailSteps(int p) {
  int t = 0;
  while ((2 << t) - 1 <= (p - 1) / 4.0 && (2 << t) <= p) ++t;
  return t;
}

namespace {

constexpr size_t kTailBytes = 3;

// float32 -> its top 24 bits, rounded to nearest even (an overflow rounds
// to inf, a NaN stays a quiet NaN), as 3 little-endian bytes.
void narrowTail(char* dst, const float* src, size_t n) {
  auto* d = reinterpret_cast<unsigned char*>(dst);
  for (size_t i = 0; i < n; ++i) {
    uint32_t b;
    std::memcpy(&b, src + i, 4);
    const uint32_t r = (b & 0x7FFFFFFFu) > 0x7F800000u ? (b >> 8) | 0x4000u
                                                        : (b + 0x7Fu + ((b >> 8) & 1u)) >> 8;
    d[3 * i] = static_cast<unsigned char>(r);
    d[3 * i + 1] = static_cast<unsigned char>(r >> 8);
    d[3 * i + 2] = static_cast<unsigned char>(r >> 16);
  }
}

void widenTail(float* dst, const char* src, size_t n) {
  const auto* s = reinterpret_cast<const unsigned char*>(src);
  for (size_t i = 0; i < n; ++i) {
    const uint32_t b = (uint32_t{s[3 * i]} << 8) | (uint32_t{s[3 * i + 1]} << 16) |
                       (uint32_t{s[3 * i + 2]} << 24);
    std::memcpy(dst + i, &b, 4);
  }
}

// Elements converted at once: 64 KiB of float32, a cache-sized piece.
constexpr size_t kPiece = 16 << 10;
// How far narrowing runs ahead of the link, in pieces.
constexpr size_t kAhead = 4;

// How one exchange carries its elements and what the receiver does.
struct Leg {
  const float* send = nullptr;  // elements to send
  size_t ns = 0;
  float* recv = nullptr;  // elements received: folded in, or written
  size_t nr = 0;
  bool tail = false;    // 24-bit words on the link instead of 16-bit
  bool reduce = false;  // recv = op(recv, received), else recv = received
};

struct Wire {
  transport::PeerLinks* P;
  WireType w;
  size_t ws;  // bytes of a word
  ReduceOp op;
  char* words_out;  // staging of narrowed words: the largest send
  char* words_in;   // what arrives, before it is folded
  Deadline deadline;
  const char* what;
  AllreduceStats* st;

  // Runs one exchange with `peer` (either side may be empty).
  void exchange(int peer, const Leg& g) {
    if (g.ns == 0 && g.nr == 0) return;
    transport::PeerLink& L = P->to(peer);
    const size_t es = g.tail ? kTailBytes : ws;
    const size_t sbytes = g.ns * es, rbytes = g.nr * es;
    size_t ready = 0;       // bytes narrowed for the link
    size_t so = 0, ro = 0;  // bytes sent, received
    size_t done = 0;        // elements folded
    L.waiter->begin(deadline, what);
    // A bulk exchange sleeps in poll() when its link cannot move.
    L.waiter->sleepAtOnceIfBulk(std::max(sbytes, rbytes));
    while (so < sbytes || done < g.nr) {
      bool moved = false;
      if (ready < sbytes && ready - so < kAhead * kPiece * es) {
        const size_t at = ready / es, n = std::min(kPiece, g.ns - at);
        if (g.tail)
          narrowTail(words_out + ready, g.send + at, n);
        else
          kernels::narrow(words_out + ready, g.send + at, n, w);
        ready += n * es;
        moved = true;
      }
      // Past the lead only once the peer is in this exchange
      // (transport::exchange says why).
      const size_t allowed =
          (rbytes == 0 || ro > 0) ? ready : std::min(ready, transport::kExchangeLead);
      if (so < allowed) {
        const size_t n = L.send->trySend(words_out + so, allowed - so);
        so += n;
        moved |= n > 0;
      }
      if (ro < rbytes) {
        const size_t n = L.recv->tryRecv(words_in + ro, rbytes - ro);
        ro += n;
        moved |= n > 0;
      }
      const size_t avail = ro / es;
      if (avail > done && (avail - done >= kPiece || ro == rbytes)) {
        fold(g, done, avail - done);
        done = avail;
        moved = true;
      }
      if (moved)
        L.waiter->progressed();
      else
        L.waiter->idle(0, so < allowed, ro < rbytes);
    }
    st->bytes_sent += sbytes;
  }

  // Elements [at, at + n) of what arrived, into g.recv.
  void fold(const Leg& g, size_t at, size_t n) {
    float* dst = g.recv + at;
    if (g.tail) {  // only reduce-scatter steps carry 24-bit words
      alignas(64) static thread_local float wide[kPiece];
      for (size_t o = 0; o < n; o += kPiece) {
        const size_t k = std::min(kPiece, n - o);
        widenTail(wide, words_in + (at + o) * kTailBytes, k);
        kernels::reduce3(dst + o, dst + o, wide, k, DataType::kFloat32, op);
      }
    } else if (g.reduce) {
      kernels::widenReduce(dst, dst, words_in + at * ws, n, w, op);
    } else {
      kernels::widen(dst, words_in + at * ws, n, w);
    }
  }
};

}  // namespace

void rabenseifnerWireAllreduce(RingComm& c, const void* in, void* out, size_t count,
                               ReduceOp op, double postscale, WireType wire,
                               AllreduceStats* st) {
  transport::HostLinks& H = *c.host;
  const int N = c.size;
  const int rank = c.ring[c.pos];
  const transport::RecursiveLayout L = transport::recursiveLayout(rank, N);
  const size_t ws = kernels::wireWordBytes(wire);
  float* buf = static_cast<float*>(out);
  if (out != in) std::memcpy(buf, in, count * sizeof(float));
  const bool prescale = op == ReduceOp::kSum || op == ReduceOp::kAverage;
  if (prescale) kernels::scale(buf, count, DataType::kFloat32, postscale);
  st->hops = 2 * static_cast<uint64_t>(L.log2p) + (L.r > 0 ? 2 : 0);
  st->bytes_sent = 0;
  const std::vector<size_t> blk = evenSplit(count, L.p);  // element offsets
  const int tail = wireTailSteps(L.p);
  // Scratch for the largest send and the largest receive: the whole buffer
  // in 16-bit words (a tail step moves 2^(t-1) <= p/4 blocks at 3 bytes).
  size_t most = 0;
  for (int b = 0; b < L.p; ++b) most = std::max(most, blk[b + 1] - blk[b]);
  const size_t half = std::max(count * ws, tail > 0 ? (most << (tail - 1)) * kTailBytes : 0);
  if (H.peer_scratch.size() < 2 * half) H.peer_scratch.resize(2 * half);
  Wire X{&H.peers(), wire, ws, op, H.peer_scratch.data(), H.peer_scratch.data() + half,
         Deadline::in(c.timeout_s), "allreduce (Rabenseifner, 16-bit wire)", st};

  if (L.vrank < 0) {  // an extra rank: its words go to its partner and back
    X.exchange(L.fold_peer, {buf, count, nullptr, 0, false, false});
    X.exchange(L.fold_peer, {nullptr, 0, buf, count, false, false});
    return;
  }
  if (L.fold_peer >= 0) X.exchange(L.fold_peer, {nullptr, 0, buf, count, false, true});
  const int v = L.vrank;
  int lo = 0, hi = L.p, step = 0;
  for (int mask = L.p / 2; mask >= 1; mask >>= 1, ++step) {  // reduce-scatter
    const int mid = lo + mask;
    const bool upper = (v & mask) != 0;
    const int keep_lo = upper ? mid : lo, keep_hi = upper ? hi : mid;
    const int give_lo = upper ? lo : mid, give_hi = upper ? mid : hi;
    const bool wide = step >= L.log2p - tail;
    X.exchange(L.partner(mask), {buf + blk[give_lo], blk[give_hi] - blk[give_lo],
                                 buf + blk[keep_lo], blk[keep_hi] - blk[keep_lo], wide, true});
    lo = keep_lo;
    hi = keep_hi;
  }
  const size_t mine = blk[v + 1] - blk[v];
  if (!prescale && postscale != 1.0)
    kernels::scale(buf + blk[v], mine, DataType::kFloat32, postscale);
  kernels::roundTrip(buf + blk[v], mine, wire);
  for (int mask = 1; mask < L.p; mask <<= 1) {  // allgather
    const int mine_lo = v & ~(mask - 1), theirs_lo = (v ^ mask) & ~(mask - 1);
    X.exchange(L.partner(mask),
               {buf + blk[mine_lo], blk[mine_lo + mask] - blk[mine_lo], buf + blk[theirs_lo],
                blk[theirs_lo + mask] - blk[theirs_lo], false, false});
  }
  if (L.fold_peer >= 0) X.exchange(L.fold_peer, {buf, count, nullptr, 0, false, false});
}

}  // namespace collectives
}  // namespace tfring
