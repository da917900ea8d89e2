// Allgather: the one entry point the executors call. Like allreduce()
// (allreduce.h) it picks an algorithm from values every rank shares (the
// output's size, the topology, rank 0's TFRING_ALLGATHER_ALGO and
// TFRING_SMALL_THRESHOLD), so every rank runs the same one:
//
//   ring     the pipelined N-1 step ring (allgather_ring.cc): bandwidth
//            optimal, shared memory between ranks of one host.
//   recdbl   recursive doubling over point-to-point links
//            (allgather_recdbl.cc): log2(p) exchanges of doubling ranges,
//            +2 hops when N is not a power of two (p the largest power of
//            two <= N).
//
// auto, where the job is "at scale" (recursiveAtScale: the rule that gives
// small allreduces to recursive doubling): recdbl for outputs up to the
// threshold, and up to kGatherRecursiveMaxBytes when every host holds one
// rank (the ring has no shared-memory hops then); the ring otherwise. Blocks may differ in size per rank (the
// ragged allgather); every algorithm only copies bytes, so all give the
// same output.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "collectives/collective_stats.h"
#include "collectives/ring.h"

namespace tfring {
namespace collectives {

enum class AllgatherAlgo { kRing, kRecDbl };
constexpr int kNumAllgatherAlgos = 2;
// With one rank per host, auto keeps recdbl (and the tree broadcast) up to
// this many bytes: at 16 ranks over TCP both beat the ring at 256 KiB and
// tie at 1 MiB (docs/benchmarks.md); where hosts hold several ranks the
// ring's shared-memory hops tie or win from 64 KiB on.
constexpr size_t kGatherRecursiveMaxBytes = 256 << 10;

const char* allgatherAlgoName(AllgatherAlgo a);
AllgatherAlgo chooseAllgather(const RingComm& c, size_t total_bytes);

// Per algorithm over a communicator's calls: calls, hops and bytes sent.
uint64_t allgatherCalls(const CommStats& s, AllgatherAlgo a);
uint64_t allgatherHops(const CommStats& s, AllgatherAlgo a);
uint64_t allgatherBytesSent(const CommStats& s, AllgatherAlgo a);

// Same contract as ringAllgather (ring.h): `out` holds every rank's block
// in rank order, block r being rank_bytes[r] bytes; this rank's block must
// already be in place.
void allgather(RingComm& c, void* out, const std::vector<size_t>& rank_bytes);

// The algorithm itself; callers go through allgather(). Fills st->hops and
// st->bytes_sent.
void recdblAllgather(RingComm& c, void* out, const std::vector<size_t>& rank_bytes,
                     CollectiveStats* st);

}  // namespace collectives
}  // namespace tfring
