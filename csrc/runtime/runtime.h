// The runtime's API, shared by the Python binding and the TensorFlow op
// library (both link libtfring_core.so). init() joins the job through a
// store and builds the world, the first communicator (runtime/comm.h);
// process sets are more of them (runtime/registry.h). enqueue() hands a
// named request to its communicator's engine, which negotiates with the
// other ranks, fuses, runs the collective and calls `done` from its own
// thread.
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
// True when every host runs the same number of ranks.
bool isHomogeneous();
const Config& config();
// "shm", "tcp" or "shm+tcp": what the ring links in this job use.
std::string transportName();

// How this rank's ring collectives of 8 MiB of output or more (large) or
// of 256 KiB or more (not large) write into the right link
// (collectives/store_tuner.h): the averaged seconds per byte with ordinary
// and with streaming stores (0 while unmeasured) and how many collectives
// chose. All 0 before init or in a job of one.
struct StoreModes {
  double ordinary_s_per_byte = 0, streaming_s_per_byte = 0;
  uint64_t calls = 0;
};
StoreModes storeModes(bool large);

// Starts writing the timeline (timeline.h) to `path` while the job runs,
// replacing one already being written; a path without "{rank}" is written
// by rank 0 only. kAborted when not initialized, kInvalidArgument when the
// file cannot be created. stopTimeline closes it (a no-op when none is
// open).
Status startTimeline(const std::string& path);
Status stopTimeline();

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
  // allreduce: the words on the links (docs/compression.md). Only float32
  // host tensors narrow onto a 16-bit wire; other requests carry kNone
  // whatever was asked, so ranks agree on what their bytes are.
  WireType wire = WireType::kNone;
  const void* input = nullptr;
  // allreduce/broadcast: preallocated with the input's shape (may alias
  // input). allgather/reducescatter: leave null and set `allocate`.
  void* output = nullptr;
  // A host allreduce of several tensors of one dtype (a grouped allreduce)
  // may be one request: input and output stay null, each part is one
  // tensor's buffers and element count, shape is {total elements} and
  // splits is partLayout() of the tensors' shapes, so ranks that group
  // differently disagree on the request (runtime/messages.h). It is
  // negotiated, fused and completed as one tensor, at the cost of one.
  struct Part {
    const void* input = nullptr;
    void* output = nullptr;  // may alias input
    int64_t count = 0;
  };
  std::vector<Part> parts;
  Allocator allocate;
  int device = -1;  // -1: host memory; >= 0: CUDA device ordinal
  // GPU tensors: a cudaStream_t. The input is read once the work queued on
  // it before enqueue() is done; null: the input is ready now. `done` comes
  // once the output is complete on the device (see gpu/executor.h).
  void* stream = nullptr;
  // The process set that runs it: 0 is the world; others are created by
  // addProcessSet. Every request of one batch names the same set.
  int process_set = 0;
  // alltoall: rows of dim 0 for each rank, in rank order (empty: an even
  // split); received_splits, when set, gets the rows that came from each
  // rank before `done`. The output is allocated through `allocate`. An
  // allreduce with parts: their layout (setParts).
  std::vector<int64_t> splits;
  std::vector<int64_t>* received_splits = nullptr;
  // join: `output` points to an int32 that gets the last rank to join.
  // The submitting thread blocks on this request right after enqueueing it
  // and drives the engine itself (drive()): a parked engine thread is not
  // woken for it.
  bool caller_drives = false;
  // Why a layer above the engine (process sets) found the request invalid;
  // the engine treats it as its own checkRequest's verdict (Meta::error):
  // the request fails on every rank through the coordinator.
  std::string error;
};

// Makes `req` (its name, dtype, op and scales already set) the one request
// of a grouped allreduce: `parts` in order, `shapes` their tensors' shapes.
// Sets parts, shape {total elements} and splits, and clears input/output.
void setParts(Request* req, std::vector<Request::Part> parts,
              const std::vector<std::vector<int64_t>>& shapes);

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
void drive(const std::function<bool()>& done, const std::function<void()>& wait,
           int process_set = 0);
// After enqueue: runs what can start at once on the calling thread, if no
// other thread is driving; returns without waiting for peers to show up.
void tryDrive(int process_set = 0);

// ----------------------------------------------------------- process sets ----
// A process set is a communicator of its own over some of the world's ranks
// (runtime/registry.h): its own ring, in the order of its sorted global
// ranks, its own engine and coordinator (on its first rank), so its
// negotiation, cache and fusion are separate from every other set's, and
// collectives on disjoint sets run at the same time. Requests name their set
// (Request.process_set); ranks inside a set are numbered 0..n-1 in that
// order, except a broadcast's root, which callers give as a global rank.

// Called on every rank of the world with the same id and ranks, in the same
// order (the callers check that): members connect the set's ring through
// the world's store under "pset/<id>/"; the others only note the set, so
// their requests on it are refused naming it.
Status addProcessSet(int id, const std::vector<int>& ranks);
// Called on every rank, after every rank has finished its collectives on
// the set: members tear down its communicator. Later requests on it fail
// saying it was removed.
Status removeProcessSet(int id);
// The set's sorted global ranks; empty if the id is unknown or removed.
std::vector<int> processSetRanks(int id);
// The ids of the live process sets, ascending (the world, 0, not among them).
std::vector<int> processSetIds();
// The id the next addProcessSet should use: one past every id this world
// has used, removed sets included, so every rank that makes the same adds
// gets the same ids. 0 before init.
int nextProcessSetId();
// Fault injection, for tests: this rank fails communicator `id` (0: the
// world) with `message` as a collective's fatal error would. Its
// coordinator aborts it on every member; the other communicators go on.
Status failCommunicator(int id, const std::string& message);

// Output shape rules, shared with the TF shape functions and the binding.
// reducescatter splits the first dimension as evenly as possible, the first
// (dim0 % size) ranks getting one extra row.
std::vector<int64_t> reducescatterShape(const std::vector<int64_t>& shape,
                                        int rank, int size);

}  // namespace runtime
}  // namespace tfring
