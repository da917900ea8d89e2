// Choosing the allreduce algorithm (see allreduce.h). Only job-wide values
// enter the choice: the byte size (every rank reduces the same shape), the
// topology every rank computed from the same store records, and rank 0's
// settings that RingLinks::connect distributed.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>

#include "collectives/allreduce.h"
#include "collectives/collective_stats.h"
#include "kernels/cpu/reduce.h"
#include "kernels/cpu/wire16.h"

namespace tfring {
namespace collectives {

static_assert(kNumAllreduceAlgos <= kMaxAlgos, "CommStats has no room for every algorithm");

namespace {

// Bytes position `pos` of an n-position ring sends in a ring allreduce of
// `count` elements: every segment but (pos+1) in the reduce-scatter, every
// segment but (pos+2) in the allgather (allreduce_ring.cc).
uint64_t ringSent(int n, int pos, size_t count, size_t es) {
  if (n <= 1 || count == 0) return 0;
  const auto off = evenSplit(count, n);
  auto seg = [&](int i) {
    i %= n;
    return (off[i + 1] - off[i]) * es;
  };
  return 2 * count * es - seg(pos + 1) - seg(pos + 2);
}

// The wire an algorithm puts on its links for a request of `wire` (see
// allreduce.h): only the rings narrow.
WireType algoWire(AllreduceAlgo a, WireType wire) {
  return a == AllreduceAlgo::kRing || a == AllreduceAlgo::kHier ||
                 a == AllreduceAlgo::kRabenseifner
             ? wire
             : WireType::kNone;
}

// A 16-bit wire saves link bytes at the cost of narrowing and widening every
// element: over shared memory, where no link limits the ring, that costs
// about 1.4x the float32 ring's time. So where every link of the job is in
// one host's shared memory and the algorithm is auto, a wire request is
// served at float32 (exact, and faster); a job that names its algorithm
// (TFRING_ALLREDUCE_ALGO, rank 0's) or keeps hosts off shared memory
// (TFRING_TRANSPORT=tcp) gets the wire as asked. Every rank decides alike:
// the policy and the topology are the job's.
WireType linkWire(const RingComm& c, WireType wire) {
  if (wire == WireType::kNone || c.host == nullptr) return wire;
  const transport::HostLinks& H = *c.host;
  const bool one_host_shm = H.num_hosts == 1 && H.policy.transport != "tcp";
  return one_host_shm && H.policy.allreduce_algo == "auto" ? WireType::kNone : wire;
}

// The counts of the algorithms that do not report their own (see
// AllreduceStats): they follow from the sizes every rank knows. `es` is
// the buffer's element size; the rings send st->wire's words.
void formulaStats(const RingComm& c, AllreduceAlgo a, size_t count, size_t es,
                  AllreduceStats* st) {
  const int N = c.size;
  const size_t ws = st->wire == WireType::kNone ? es : kernels::wireWordBytes(st->wire);
  if (a == AllreduceAlgo::kRing) {
    st->hops = N > 1 ? 2 * static_cast<uint64_t>(N - 1) : 0;
    st->bytes_sent = ringSent(N, c.pos, count, ws);
    return;
  }
  const transport::HostLinks& H = *c.host;
  const transport::HostSegment* S = H.segment.get();
  const size_t per = S ? std::max<size_t>(S->slotBytes() / es, 1) : count;
  const int nh = H.num_hosts, L = H.local_size;
  for (size_t off = 0; off < count; off += per) {
    const size_t n = std::min(per, count - off);
    if (a == AllreduceAlgo::kOneShot) {
      st->hops += 1;
      continue;
    }
    size_t sh = n;  // my share of the piece
    if (S) {
      const auto shares = evenSplit(n, L);
      sh = shares[H.local_rank + 1] - shares[H.local_rank];
    }
    const uint64_t seg_hops = S ? 2 : 0;
    if (a == AllreduceAlgo::kSmall) {
      st->hops += seg_hops + (nh - 1);
      st->bytes_sent += sh ? sh * es * (nh - 1) : 0;
    } else {
      st->hops += seg_hops + 2 * (nh - 1);
      st->bytes_sent += ringSent(nh, H.cross_rank, sh, ws);
    }
  }
}

void record(RingComm& c, const AllreduceStats& st) {
  CollectiveStats cs;
  cs.collective = "allreduce";
  cs.algo = allreduceAlgoName(st.algo);
  cs.size = st.size;
  cs.bytes = st.bytes;
  cs.hops = st.hops;
  cs.bytes_sent = st.bytes_sent;
  cs.wire = wireTypeName(st.wire);
  if (!c.stats) return;
  recordCollective(c.stats.get(), cs);
  const int i = static_cast<int>(st.algo);
  c.stats->allreduce.add(i, st.hops, st.bytes_sent);
  c.stats->setLast(CommStats::kAllreduce, cs, i);
}

}  // namespace

uint64_t allreduceCalls(const CommStats& s, AllreduceAlgo a) {
  return s.allreduce.calls(static_cast<int>(a));
}
uint64_t allreduceHops(const CommStats& s, AllreduceAlgo a) {
  return s.allreduce.hops(static_cast<int>(a));
}
uint64_t allreduceBytesSent(const CommStats& s, AllreduceAlgo a) {
  return s.allreduce.bytesSent(static_cast<int>(a));
}
AllreduceStats lastAllreduceStats(const CommStats& s) {
  int algo = 0;
  const CollectiveStats cs = s.last(CommStats::kAllreduce, &algo);
  AllreduceStats st;
  st.algo = static_cast<AllreduceAlgo>(algo);
  st.size = cs.size;
  st.bytes = cs.bytes;
  st.hops = cs.hops;
  st.bytes_sent = cs.bytes_sent;
  parseWireType(cs.wire, &st.wire);
  return st;
}

const char* allreduceAlgoName(AllreduceAlgo a) {
  switch (a) {
    case AllreduceAlgo::kRing: return "ring";
    case AllreduceAlgo::kOneShot: return "oneshot";
    case AllreduceAlgo::kSmall: return "small";
    case AllreduceAlgo::kHier: return "hier";
    case AllreduceAlgo::kRecDbl: return "recdbl";
    case AllreduceAlgo::kRabenseifner: return "rabenseifner";
  }
  return "?";
}

bool recursiveAtScale(const RingComm& c) {
  const transport::HostLinks* H = c.host;
  if (!H || c.size < 8 || !H->want_peers || H->num_hosts < 2) return false;
  // At scale the cross-host schemes' H-1 (or 2(H-1)) sequential steps, or
  // the ring's 2(N-1) where hosts are uneven, lose to log2(N) steps.
  const bool cross = H->uniform && (H->local_size == 1 || H->segment);
  return H->num_hosts >= 4 || !cross;
}

namespace {

// The choice without regard to a wire (see allreduce.h).
AllreduceAlgo chooseFloat(const RingComm& c, size_t bytes) {
  const transport::HostLinks* H = c.host;
  if (!H || c.size == 1) return AllreduceAlgo::kRing;
  const bool spans = H->num_hosts > 1;
  // The cross ring exists, and each host can share within itself.
  const bool cross = spans && H->uniform && (H->local_size == 1 || H->segment);
  // Host-local schemes without a segment only make sense with one rank per
  // host, and then only across hosts.
  auto small = [&]() {
    if (!spans) return H->segment ? AllreduceAlgo::kOneShot : AllreduceAlgo::kRing;
    return cross ? AllreduceAlgo::kSmall : AllreduceAlgo::kRing;
  };
  const std::string& a = H->policy.allreduce_algo;
  const bool p2p = H->want_peers;
  if (a == "recdbl") return p2p ? AllreduceAlgo::kRecDbl : AllreduceAlgo::kRing;
  if (a == "rabenseifner") return p2p ? AllreduceAlgo::kRabenseifner : AllreduceAlgo::kRing;
  if (a == "ring") return AllreduceAlgo::kRing;
  if (a == "oneshot") return small();
  if (a == "hier") {
    if (!spans) return H->segment ? AllreduceAlgo::kHier : AllreduceAlgo::kRing;
    return cross ? AllreduceAlgo::kHier : AllreduceAlgo::kRing;
  }
  const bool at_scale = recursiveAtScale(c);
  if (bytes <= static_cast<uint64_t>(H->policy.small_threshold))
    return at_scale ? AllreduceAlgo::kRecDbl : small();
  // Medium buffers: the hierarchical scheme where hosts hold several ranks
  // (it keeps most traffic in shared memory; measured faster than
  // Rabenseifner over TCP at 16 ranks on 4 hosts), else Rabenseifner.
  const bool hier = cross && H->local_size > 1;
  if (at_scale && !hier && bytes <= kRabenseifnerMaxBytes) return AllreduceAlgo::kRabenseifner;
  return hier ? AllreduceAlgo::kHier : AllreduceAlgo::kRing;
}

}  // namespace

// On a 16-bit wire, auto trades the ring for Rabenseifner from
// kWireTreeMinRanks ranks on, where the point-to-point links exist: both
// send 2(N-1)/N of the buffer in words, but the ring rounds an element's
// partial N-1 times as it grows to the whole sum, Rabenseifner log2(p)
// times, its largest partials in 24-bit words (allreduce_rabenseifner_
// wire.cc). Below that the ring's error is at most about two roundings and
// the ring is faster on rate-limited links (docs/compression.md measures
// both). hier keeps its cross-host ring. The wire is the job's for this
// tensor (ranks that disagree on it get an error first), so every rank
// chooses alike.
AllreduceAlgo chooseAllreduce(const RingComm& c, size_t bytes, WireType wire) {
  const AllreduceAlgo a = chooseFloat(c, bytes);
  if (wire == WireType::kNone || a != AllreduceAlgo::kRing || !c.host) return a;
  const transport::HostLinks& H = *c.host;
  const bool latency = bytes <= static_cast<uint64_t>(H.policy.small_threshold);
  return H.policy.allreduce_algo == "auto" && H.want_peers && !latency &&
                 c.size >= kWireTreeMinRanks
             ? AllreduceAlgo::kRabenseifner
             : a;
}

void allreduce(RingComm& c, const void* in, void* out, size_t count, DataType dtype,
               ReduceOp op, double postscale, WireType wire) {
  if (count == 0) return;
  const size_t es = dtypeSize(dtype);
  AllreduceStats st;
  const WireType want = c.size > 1 ? effectiveWire(linkWire(c, wire), dtype) : WireType::kNone;
  st.algo = chooseAllreduce(c, count * es, want);
  st.size = c.size;
  st.bytes = count * es;
  st.wire = algoWire(st.algo, want);
  switch (st.algo) {
    case AllreduceAlgo::kOneShot:
      oneshotAllreduce(c, in, out, count, dtype, op, postscale);
      break;
    case AllreduceAlgo::kSmall:
      hierAllreduce(c, in, out, count, dtype, op, postscale, true);
      break;
    case AllreduceAlgo::kHier:
      hierAllreduce(c, in, out, count, dtype, op, postscale, false, st.wire);
      break;
    case AllreduceAlgo::kRecDbl:
      recdblAllreduce(c, in, out, count, dtype, op, postscale, &st);
      break;
    case AllreduceAlgo::kRabenseifner:
      if (st.wire != WireType::kNone)
        rabenseifnerWireAllreduce(c, in, out, count, op, postscale, st.wire, &st);
      else
        rabenseifnerAllreduce(c, in, out, count, dtype, op, postscale, &st);
      break;
    case AllreduceAlgo::kRing:
      ringAllreduce(c, in, out, count, dtype, op, postscale, st.wire);
      break;
  }
  if (st.algo != AllreduceAlgo::kRecDbl && st.algo != AllreduceAlgo::kRabenseifner)
    formulaStats(c, st.algo, count, es, &st);
  record(c, st);
}

void allreduceSpans(RingComm& c, const std::vector<Span>& spans, DataType dtype, ReduceOp op,
                    double postscale, std::vector<char>* pack, size_t max_pack,
                    WireType wire) {
  const size_t es = dtypeSize(dtype);
  size_t count = 0;
  for (auto& s : spans) count += s.count;
  if (count == 0) return;
  const WireType want = c.size > 1 ? effectiveWire(linkWire(c, wire), dtype) : WireType::kNone;
  const AllreduceAlgo a = chooseAllreduce(c, count * es, want);
  if (a == AllreduceAlgo::kRing) {
    AllreduceStats st;
    st.wire = want;
    ringAllreduceSpans(c, spans, dtype, op, postscale, st.wire);
    st.size = c.size;
    st.bytes = count * es;
    formulaStats(c, a, count, es, &st);
    record(c, st);
    return;
  }
  // Pieces of consecutive spans up to max_pack bytes, each packed, reduced
  // and unpacked; a span larger than that alone is reduced where it lies.
  // Every rank holds the same spans, so every rank cuts the same pieces
  // (and, on a wire, Rabenseifner rounds each piece's elements alike).
  const size_t limit = std::max(max_pack, es);
  for (size_t i = 0; i < spans.size();) {
    if (spans[i].count * es >= limit) {
      allreduce(c, spans[i].in, spans[i].out, spans[i].count, dtype, op, postscale, wire);
      ++i;
      continue;
    }
    size_t j = i, bytes = 0;
    while (j < spans.size() && bytes + spans[j].count * es <= limit) bytes += spans[j++].count * es;
    if (pack->size() < bytes) pack->resize(bytes);
    size_t off = 0;
    for (size_t k = i; k < j; ++k) {
      if (spans[k].count) std::memcpy(pack->data() + off, spans[k].in, spans[k].count * es);
      off += spans[k].count * es;
    }
    allreduce(c, pack->data(), pack->data(), bytes / es, dtype, op, postscale, wire);
    off = 0;
    for (size_t k = i; k < j; ++k) {
      if (spans[k].count) std::memcpy(spans[k].out, pack->data() + off, spans[k].count * es);
      off += spans[k].count * es;
    }
    i = j;
  }
}

}  // namespace collectives
}  // namespace tfring
