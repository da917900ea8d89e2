// The process-wide runtime: one per process, shared by the Python binding and
// the TensorFlow op library (both link libtfring_core.so). init() joins the
// job through a store; enqueue() hands a named request to the background
// engine, which negotiates with the other ranks, fuses, runs the collective
// and calls `done` from its own thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/env.h"
#include "common/status.h"
#include "common/types.h"
#include "rendezvous/store.h"

namespace tfring {
namespace runtime {

struct InitOptions {
  int rank = 0;
  int size = 1;
  // The job's store; null is allowed for size 1 only.
  std::shared_ptr<rendezvous::Store> store;
  // Per-job secret used to authenticate TCP links (same on every rank).
  std::string secret;
};

Status init(const InitOptions& opts);
// Drains outstanding work (failing it with kAborted) and tears down links.
void shutdown();
bool isInitialized();

int rank();
int size();
int localRank();
int localSize();
int crossRank();
int crossSize();
const Config& config();
// "shm", "tcp" or "shm+tcp": what the ring links in this job use.
std::string transportName();

// Allocates the output once its shape is known (allgather, reducescatter).
using Allocator =
    std::function<Status(const std::vector<int64_t>& shape, void** data)>;
using DoneCallback = std::function<void(const Status&)>;

struct Request {
  std::string name;  // matches the request across ranks
  CollectiveType type = CollectiveType::kAllreduce;
  DataType dtype = DataType::kFloat32;
  std::vector<int64_t> shape;
  ReduceOp op = ReduceOp::kSum;  // allreduce, reducescatter
  int root = 0;                  // broadcast
  double prescale = 1.0;         // allreduce, reducescatter
  double postscale = 1.0;
  const void* input = nullptr;
  // allreduce/broadcast: preallocated with the input's shape (may alias
  // input). allgather/reducescatter: leave null and set `allocate`.
  void* output = nullptr;
  Allocator allocate;
  int device = -1;  // -1: host memory; >= 0: CUDA device ordinal
  // GPU tensors: a cudaStream_t. The input is read once the work queued on
  // it before enqueue() is done; null: the input is ready now. `done` comes
  // once the output is complete on the device (see gpu/executor.h).
  void* stream = nullptr;
  // alltoall: rows of dim 0 for each rank, in rank order (empty: an even
  // split); received_splits, when set, gets the rows that came from each
  // rank before `done`. The output is allocated through `allocate`.
  std::vector<int64_t> splits;
  std::vector<int64_t>* received_splits = nullptr;
  // join: `output` points to an int32 that gets the last rank to join.
};

// Queues a request. Errors found locally (not initialized, duplicate name in
// flight, bad shape) are returned at once and `done` is not called;
// otherwise `done` is called exactly once from the engine thread.
Status enqueue(Request req, DoneCallback done);
// Queues several requests at once (a fused group submitted together lands
// in one round): all are accepted, or none is and the error is returned.
Status enqueueBatch(std::vector<Request> reqs, std::vector<DoneCallback> dones);

// A caller about to block on its own result lends its thread: it runs the
// engine's protocol itself until done() (no thread switch on completion),
// or, when another thread is driving, calls wait() (which should sleep
// briefly, returning early when done) until done().
void drive(const std::function<bool()>& done, const std::function<void()>& wait);
// After enqueue: runs what can start at once on the calling thread, if no
// other thread is driving; returns without waiting for peers to show up.
void tryDrive();

// Output shape rules, shared with the TF shape functions and the binding.
// reducescatter splits the first dimension as evenly as possible, the first
// (dim0 % size) ranks getting one extra row.
std::vector<int64_t> reducescatterShape(const std::vector<int64_t>& shape,
                                        int rank, int size);

}  // namespace runtime
}  // namespace tfring
