// Allreduce: the one entry point the executors call. It picks an algorithm
// from values every rank shares (the buffer's size, the topology, and rank
// 0's TFRING_ALLREDUCE_ALGO / TFRING_SMALL_THRESHOLD), so every rank always
// runs the same one:
//
//   ring     the pipelined 2(N-1)-step ring (allreduce_ring.cc): bandwidth
//            optimal on one host and across hosts with uneven rank counts.
//   oneshot  one host: every rank writes its input into the host segment and
//            reduces all of it (allreduce_oneshot.cc): one synchronisation,
//            the latency optimum for small buffers.
//   small    several hosts, small buffers: local ranks reduce a share each
//            from the segment, the ranks with the same local rank exchange
//            their hosts' shares in one cross-host allgather and reduce them
//            in host order, and the result is shared through the segment
//            (allreduce_hier.cc).
//   hier     several hosts, large buffers: reduce-scatter through the
//            segment, a ring allreduce of each share among the ranks with
//            the same local rank (all cross-host links busy at once), then
//            an allgather through the segment (allreduce_hier.cc).
//   recdbl   recursive doubling over point-to-point links
//            (allreduce_recdbl.cc): log2(N) exchanges of the whole buffer,
//            +2 hops when N is not a power of two; for small buffers at
//            scale.
//   rabenseifner  recursive-halving reduce-scatter, recursive-doubling
//            allgather (allreduce_rabenseifner.cc): 2 log2(N) steps (+2),
//            ring-like bytes; for medium buffers at scale. On a 16-bit
//            wire (allreduce_rabenseifner_wire.cc) it rounds an element's
//            partial log2(p) times where the ring rounds it N-1 times, so
//            its error stays near one rounding at any N.
//
// auto: on one host, oneshot up to the threshold, ring above it. Across
// hosts, when the job has at least 8 ranks and either at least 4 hosts or
// hosts the cross-host schemes cannot serve (uneven rank counts): recdbl
// up to the threshold; above it hier when every host has the same number
// (> 1) of ranks, else rabenseifner up to kRabenseifnerMaxBytes, then the
// ring. Otherwise across hosts: small up to the threshold, hier above it
// when every host has the same number (> 1) of ranks, else ring (see
// docs/benchmarks.md, "Allreduce at scale", for the measurements). Every
// algorithm gives bitwise identical results on every rank.
//
// A 16-bit wire (`wire`, float32 buffers only; docs/compression.md) is a
// property of the links: the ring, hier's cross-host ring and rabenseifner
// carry 16-bit words and accumulate in float32, and their result is the
// 16-bit rounding of the float32 reduction. oneshot reduces in shared
// memory, where no link is involved, and small and recdbl serve buffers
// whose cost is latency: they reduce at float32 and ignore the wire. Either
// way every rank ends with the same bits. Under auto, a request on a wire
// from kWireTreeMinRanks ranks on that would run the ring above the
// threshold runs rabenseifner instead where the point-to-point links exist
// (across hosts): the same bytes, log2(p) roundings of an element's
// partial instead of N-1.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "collectives/ring.h"

namespace tfring {
namespace collectives {

enum class AllreduceAlgo { kRing, kOneShot, kSmall, kHier, kRecDbl, kRabenseifner };
constexpr int kNumAllreduceAlgos = 6;
// Above this many bytes auto leaves Rabenseifner for hier or the ring.
constexpr size_t kRabenseifnerMaxBytes = 1 << 20;
// From this many ranks auto runs a 16-bit wire's request on Rabenseifner
// where it would run the ring.
constexpr int kWireTreeMinRanks = 16;

const char* allreduceAlgoName(AllreduceAlgo a);
// Whether the job is large and spread enough that log2(N)-step algorithms
// over point-to-point links beat the ring and the host-aware schemes for
// small buffers: the links exist, 8+ ranks, and 4+ hosts or hosts the
// cross-host schemes cannot serve. allgather() and broadcast() use the
// same rule.
bool recursiveAtScale(const RingComm& c);
// `wire`: the 16-bit wire the request would carry (after linkWire and
// effectiveWire), which steers auto from the ring to rabenseifner.
AllreduceAlgo chooseAllreduce(const RingComm& c, size_t bytes, WireType wire = WireType::kNone);
// How many allreduce() calls of a communicator (its CommStats) ran each
// algorithm.
uint64_t allreduceCalls(const CommStats& s, AllreduceAlgo a);

// What one allreduce cost, as this rank saw it:
//   hops        sequential message steps on the collective's critical path
//               (the same on every rank): ring 2(N-1); recdbl log2(p), and
//               rabenseifner 2 log2(p), each +2 when N != p (p the largest
//               power of two <= N); oneshot 1 per segment piece; small
//               2 + (H-1) and hier 2 + 2(H-1) per piece (H hosts).
//   bytes_sent  bytes this rank put on its links (ring channels, the
//               cross-host ring, point-to-point links); writes into the
//               shared host segment are not counted.
struct AllreduceStats {
  AllreduceAlgo algo = AllreduceAlgo::kRing;
  int size = 1;
  uint64_t bytes = 0;  // the buffer
  uint64_t hops = 0;
  uint64_t bytes_sent = 0;
  WireType wire = WireType::kNone;  // what the links carried
};
// The last allreduce() or allreduceSpans() of a communicator.
AllreduceStats lastAllreduceStats(const CommStats& s);
// Totals per algorithm over a communicator's calls.
uint64_t allreduceHops(const CommStats& s, AllreduceAlgo a);
uint64_t allreduceBytesSent(const CommStats& s, AllreduceAlgo a);

// Same contract as ringAllreduce (ring.h): `out` may alias `in`; `out` ends
// with op over every rank's `in`, times `postscale`.
void allreduce(RingComm& c, const void* in, void* out, size_t count, DataType dtype,
               ReduceOp op, double postscale, WireType wire = WireType::kNone);

// Fused tensors (see ringAllreduceSpans): the ring runs on them in place;
// the other algorithms run on copies packed into *pack, in pieces of
// consecutive spans of at most max_pack bytes (a larger span alone runs in
// place), so a grouped request far above the fusion threshold never needs
// a buffer its size. The algorithm is chosen by the whole size, and for
// each piece by its own.
void allreduceSpans(RingComm& c, const std::vector<Span>& spans, DataType dtype, ReduceOp op,
                    double postscale, std::vector<char>* pack, size_t max_pack,
                    WireType wire = WireType::kNone);

// The algorithms themselves; callers go through allreduce().
void oneshotAllreduce(RingComm& c, const void* in, void* out, size_t count, DataType dtype,
                      ReduceOp op, double postscale);
void hierAllreduce(RingComm& c, const void* in, void* out, size_t count, DataType dtype,
                   ReduceOp op, double postscale, bool small,
                   WireType wire = WireType::kNone);
void recdblAllreduce(RingComm& c, const void* in, void* out, size_t count, DataType dtype,
                     ReduceOp op, double postscale, AllreduceStats* st);
void rabenseifnerAllreduce(RingComm& c, const void* in, void* out, size_t count, DataType dtype,
                           ReduceOp op, double postscale, AllreduceStats* st);
// float32 buffers on a 16-bit wire (allreduce_rabenseifner_wire.cc).
// Its last wireTailSteps(p) reduce-scatter steps carry 24-bit words (p: the
// largest power of two <= N): the most t with 2^t - 1 <= (p-1)/4, so those
// steps' partials, the largest, lose almost nothing, for at most 1/16 more
// bytes than 16-bit words throughout (t = 0 up to p = 4, 1 at 8, 2 at 16,
// 3 at 32, 4 at 64).
int wireTailSteps(int p);
void rabenseifnerWireAllreduce(RingComm& c, const void* in, void* out, size_t count,
                               ReduceOp op, double postscale, WireType wire,
                               AllreduceStats* st);
// op(lower rank's buffer, higher rank's buffer) into `mine`; `theirs` is
// scratch (allreduce_recdbl.cc).
void combineOrdered(char* mine, char* theirs, size_t count, DataType dtype, ReduceOp op,
                    bool i_am_lower);

}  // namespace collectives
}  // namespace tfring
