// The collectives, each written once against a ring of SendChannel /
// RecvChannel (transport/channel.h). No TensorFlow, no CUDA, no sockets here.
//
// Buffers are host memory. Segments are indexed by ring position; the
// callers (runtime/executor.cc) map ranks to positions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "common/types.h"
#include "common/env.h"
#include "collectives/collective_stats.h"
#include "collectives/store_tuner.h"
#include "transport/channel.h"
#include "transport/ring_links.h"
#include "transport/host_links.h"
#include "transport/waiter.h"

namespace tfring {
namespace collectives {

struct RingComm {
  int size = 1;
  int pos = 0;                      // my position in the ring
  std::vector<int> ring;            // rank at each position
  transport::SendChannel* right = nullptr;
  transport::RecvChannel* left = nullptr;
  transport::Waiter* waiter = nullptr;
  // The communicator's failure state (the links'); waits outside a Waiter
  // (the GPU side's) poll it.
  AbortState* abort = nullptr;
  size_t chunk_bytes = 1 << 20;     // pipeline unit
  double timeout_s = 300;
  // The host segment and cross-host ring for the host-aware allreduce
  // algorithms (collectives/allreduce.h); null means ring only.
  transport::HostLinks* host = nullptr;
  // How large collectives write into `right` (store_tuner.h), from 8 MiB of
  // output and from 256 KiB (ring_pipeline.cc); shared by copies of this
  // comm, null for a ring built for one call.
  std::shared_ptr<StoreTuner> tuner, tuner_mid;
  // The communicator's statistics (collective_stats.h), shared by copies.
  std::shared_ptr<CommStats> stats;
};

// The ring of a job's links, as every collective sees it.
RingComm makeRingComm(const transport::RingLinks& links, transport::Waiter* waiter,
                      const Config& cfg);

// A ring allreduce of at least kRingRoundsMinBytes on one host runs as
// rounds of N segments of kRingRoundSegmentBytes each (allreduce_ring.cc).
// Constants, not settings: every rank must cut the same rounds.
constexpr size_t kRingRoundsMinBytes = 8 << 20;
constexpr size_t kRingRoundSegmentBytes = 512 << 10;

// Splits `count` elements into `parts` nearly equal pieces (the first
// count % parts get one more). Returns element offsets, parts+1 entries.
std::vector<size_t> evenSplit(size_t count, int parts);

// `out` (which may alias `in`) ends with op over all ranks' `in`, then
// multiplied by `postscale` (the caller folds 1/size in for Average). `in`
// is only read: the first reduction of each segment reads it and writes
// `out`, so no up-front copy is needed. The result is bitwise identical on
// every rank: each segment is reduced along one chain of ranks and then
// copied, never recomputed. `wire` (float32 buffers only; other dtypes
// ignore it) puts 16-bit words on the links and accumulates in float32
// (allreduce_ring.cc); the result is then the 16-bit rounding of the
// float32 reduction, widened, on every rank.
void ringAllreduce(RingComm& c, const void* in, void* out, size_t count, DataType dtype,
                   ReduceOp op, double postscale, WireType wire = WireType::kNone);

// A tensor of a fused allreduce: `count` elements read from `in` and
// written to `out` (which may alias `in`).
struct Span {
  const char* in;
  char* out;
  size_t count;
};

// ringAllreduce over tensors laid end to end, without packing them into one
// buffer: every ring step is cut at tensor boundaries, so the reductions
// read the inputs and write the outputs in place. All ranks must pass the
// same counts in the same order.
void ringAllreduceSpans(RingComm& c, const std::vector<Span>& spans, DataType dtype,
                        ReduceOp op, double postscale, WireType wire = WireType::kNone);

// `out` holds every rank's block in rank order; block r is rank_bytes[r]
// bytes. This rank's block must already be in place in `out`.
void ringAllgather(RingComm& c, void* out, const std::vector<size_t>& rank_bytes);

// `data` on the root is sent; on every other rank it is overwritten.
void ringBroadcast(RingComm& c, void* data, size_t bytes, int root_rank);

// Reduces `work` (count elements, modified) across ranks; afterwards rank r's
// block — rows split by rank_counts (elements per rank, in rank order) — of
// `work` holds the reduced values times postscale. Other blocks are garbage.
void ringReducescatter(RingComm& c, void* work, const std::vector<size_t>& rank_counts,
                       DataType dtype, ReduceOp op, double postscale);

// Alltoall (alltoall.cc): bytes[s * size + d] is what rank s sends rank d.
// `in` holds this rank's blocks in destination rank order, `out` receives
// one block from every rank in source rank order (this rank's own block is
// copied locally). `in` and `out` must not overlap.
void ringAlltoall(RingComm& c, const void* in, void* out, const std::vector<size_t>& bytes);

}  // namespace collectives
}  // namespace tfring
