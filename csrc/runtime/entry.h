// Entry: one submitted tensor as the engine holds it from enqueue() until
// its callback runs, and the helpers that read and write its buffers.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "collectives/ring.h"
#include "runtime/messages.h"
#include "runtime/runtime.h"

namespace tfring {
namespace runtime {

class Timeline;

struct Entry {
  Request req;  // its name, shape and splits have moved into meta
  DoneCallback done;
  Meta meta;
  std::shared_ptr<void> gpu_ready;  // GPU tensors: the input's ready event
  double submitted = 0;             // for the fast path's aging
  int32_t id = -1;                  // cache id while waiting on the fast path
  uint64_t fresh_full = 0;          // fresh_names.h: hashes offered in the vote
  uint32_t fresh_name = 0;
  bool rode = false;                // rider.h: finished by the vote
};

using Entries = std::vector<std::shared_ptr<Entry>>;

// An allreduce entry's buffers: its parts (Request::parts), else its one
// input and output. gatherInput packs the inputs at dst, in order;
// scatterOutput unpacks src into the outputs.
void entrySpans(const Entry& e, std::vector<collectives::Span>* out);
void gatherInput(const Entry& e, void* dst);
void scatterOutput(Entry& e, const void* src);

// Allocates a request's output through its allocator once the shape is
// known (allgather, reducescatter); a no-op when the caller supplied one.
void allocateOutput(Entry& e, const std::vector<int64_t>& shape);

// Block layouts shared by the host and GPU executors. Allgather: the bytes
// each rank contributes when rank r has dim0s[r] rows, and the gathered
// shape. Reducescatter: the elements of each rank's block over n ranks.
std::vector<size_t> allgatherBytes(const Meta& m, const std::vector<int64_t>& dim0s,
                                   std::vector<int64_t>* out_shape);
std::vector<size_t> reducescatterCounts(const Meta& m, int n);
// executor.cc: the postscale an allreduce ends with (Average's 1/size
// folded in), and the kernel op behind a reduce op (Average sums).
double finalScale(const Meta& m, int size);
ReduceOp kernelOp(ReduceOp op);
// The last collective's stats (collectives::lastCollectiveStats) as a
// timeline `event` (ALLREDUCE_STATS, ...) on e's row.
void traceCollective(Timeline& t, const collectives::CommStats& s, const Entry& e,
                     const char* event);

// alltoall_join.cc. Resolves one rank's alltoall splits over `size` ranks
// (empty: an even split) into *rows; returns why they are invalid, or "".
std::string alltoallSplits(const Meta& m, int size, std::vector<int64_t>* rows);
// A stand-in for a tensor a joined rank never submitted: zeros of the
// agreed Meta, its output discarded.
std::shared_ptr<Entry> joinFillEntry(const Meta& m);

}  // namespace runtime
}  // namespace tfring
