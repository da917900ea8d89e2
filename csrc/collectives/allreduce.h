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
//
// auto picks oneshot/small up to the threshold, hier above it when the job
// spans hosts that each have the same number (> 1) of ranks, else ring.
// Every algorithm gives bitwise identical results on every rank.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "collectives/ring.h"

namespace tfring {
namespace collectives {

enum class AllreduceAlgo { kRing, kOneShot, kSmall, kHier };

const char* allreduceAlgoName(AllreduceAlgo a);
AllreduceAlgo chooseAllreduce(const RingComm& c, size_t bytes);
// How many allreduce() calls ran each algorithm in this process.
uint64_t allreduceCalls(AllreduceAlgo a);

// Same contract as ringAllreduce (ring.h): `out` may alias `in`; `out` ends
// with op over every rank's `in`, times `postscale`.
void allreduce(RingComm& c, const void* in, void* out, size_t count, DataType dtype,
               ReduceOp op, double postscale);

// Fused tensors (see ringAllreduceSpans): the ring runs on them in place;
// the other algorithms run on a copy packed into *pack.
void allreduceSpans(RingComm& c, const std::vector<Span>& spans, DataType dtype, ReduceOp op,
                    double postscale, std::vector<char>* pack);

// The algorithms themselves; callers go through allreduce().
void oneshotAllreduce(RingComm& c, const void* in, void* out, size_t count, DataType dtype,
                      ReduceOp op, double postscale);
void hierAllreduce(RingComm& c, const void* in, void* out, size_t count, DataType dtype,
                   ReduceOp op, double postscale, bool small);

}  // namespace collectives
}  // namespace tfring
