// Negotiation messages between each rank's engine and the coordinator
// (rank 0). See coordinator.h for the protocol.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/types.h"
#include "common/wire.h"

namespace tfring {
namespace runtime {

// What one rank says about one of its tensors.
struct Meta {
  std::string name;
  CollectiveType type = CollectiveType::kAllreduce;
  DataType dtype = DataType::kFloat32;
  std::vector<int64_t> shape;
  ReduceOp op = ReduceOp::kSum;
  int32_t root = 0;
  double prescale = 1.0, postscale = 1.0;
  int32_t device = -1;
  WireType wire = WireType::kNone;  // allreduce: Request::wire
  // alltoall: rows of dim 0 sent to each rank, in rank order; empty means
  // an even split. An allreduce of several parts (Request::parts): their
  // shapes, as partLayout() writes them.
  std::vector<int64_t> splits;
  // Why this rank's request is invalid by itself (checkRequest, or a layer
  // above the engine such as process sets); empty when it is valid. An
  // invalid request still goes to the coordinator, which fails it on every
  // rank (Group::kInvalid), so ranks that called it validly never wait.
  std::string error;

  bool operator==(const Meta& o) const;
  int64_t numElements() const;
  void write(wire::Writer& w) const;
  static Meta read(wire::Reader& r);
  std::string shapeString() const;
};

// Every check of one rank's request that needs no other rank: the root's
// range, scalars where a first dimension is needed, dtypes an operation
// cannot take, alltoall splits, negative dimensions. Returns the error
// sentence naming the tensor, or "" when the request is valid. `size` is
// the number of ranks of the request's process set. Every path runs it:
// the engine when a request is queued (runtime/engine.cc), and the
// coordinator on every rank's Meta (coordinator.cc).
std::string checkRequest(const Meta& m, int size);

// "[2, 3]": how messages print a shape.
std::string dimsString(const std::vector<int64_t>& dims);

// The shapes of a grouped allreduce's parts as one list of integers:
// {count, rank of part 0, its dims..., rank of part 1, ...}. readPartLayout
// is its inverse; false for a list partLayout() cannot have written.
std::vector<int64_t> partLayout(const std::vector<std::vector<int64_t>>& shapes);
bool readPartLayout(const std::vector<int64_t>& layout,
                    std::vector<std::vector<int64_t>>* shapes);

enum MsgType : uint8_t {
  // engine -> coordinator
  kMsgRequests = 1,  // u32 n; n x {i32 cache id or -1; Meta if -1}
  kMsgDone = 2,      // u64 response sequence number executed
  kMsgBye = 3,       // clean shutdown
  kMsgError = 4,     // str: a fatal local error; the job must stop; i32 the peer
                     // rank it blames (-1: none), named by the coordinator's abort
  kMsgPong = 5,      // answers kMsgPing (sent by the reader thread)
  // coordinator -> engine
  kMsgResponse = 10,  // see Response
  kMsgStall = 11,     // str: warning text
  kMsgAbort = 12,     // i32 culprit rank, str message
  kMsgLeft = 13,      // i32 rank that shut down
  kMsgPing = 14,      // liveness: a process that cannot answer is stopped
};

// One unit of execution, identical on every rank.
struct Group {
  // kError: ranks disagree (a mismatch, a stall); kInvalid: some rank's
  // own arguments are wrong (Meta::error), an InvalidArgument everywhere.
  enum Kind : uint8_t { kExec = 0, kError = 1, kInvalid = 2 } kind = kExec;
  CollectiveType type = CollectiveType::kAllreduce;
  std::vector<std::string> names;           // in execution / fusion order
  std::vector<std::vector<int64_t>> dim0s;  // allgather: per name, per rank
                                            // alltoall: the size x size splits
                                            // join: {last rank to join}
  std::string error;                        // kError, kInvalid: the message
  // While ranks have joined: every name's agreed Meta, in `names` order, so
  // a joined rank can take part with zeros in what it never submitted.
  std::vector<Meta> fill;
};

struct Response {
  uint64_t seq = 0;
  std::vector<std::pair<int32_t, std::string>> new_ids;  // cache ids granted
  std::vector<Group> groups;
  void write(wire::Writer& w) const;
  static Response read(wire::Reader& r);
};

}  // namespace runtime
}  // namespace tfring
