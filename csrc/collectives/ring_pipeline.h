// The one progress loop every ring collective runs.
//
// A collective is a list of send steps (to the right neighbour) and receive
// steps (from the left). A send step may be chained to a receive step: its
// bytes are the very bytes that receive step produced, so it may only send
// what has already arrived (and been reduced). This is what pipelines the
// ring: the first chunk of a segment travels on to the right while later
// chunks are still arriving from the left, and reducing a chunk overlaps the
// neighbours' copies of the next.
//
// The loop alternates non-blocking moves on both channels; when neither can
// move it sleeps in the Waiter until a neighbour rings.
#pragma once

#include <cstddef>
#include <vector>

#include "collectives/ring.h"

namespace tfring {
namespace collectives {

struct SendStep {
  const char* data = nullptr;
  size_t bytes = 0;
  int chained_to = -1;  // index of the recv step producing these bytes
  double scale = 1.0;   // 16-bit wire: words are narrowed from data * scale
};

struct RecvStep {
  char* data = nullptr;
  size_t bytes = 0;
  bool reduce = false;   // data = op(src, received), else data = received
  double scale = 1.0;    // applied to each reduced piece (final RS step)
  const char* src = nullptr;  // reduce operand; null means data itself
  // 16-bit wire: the reduce operand is src * src_scale, and round_trip
  // replaces each finished piece by its 16-bit rounding (what the owner of a
  // segment sends on in the allgather), so every rank ends with that value.
  double src_scale = 1.0;
  bool round_trip = false;
};

// With wire == kNone the links carry the buffers' own bytes. With a 16-bit
// wire the buffers are float32 (dtype kFloat32), step sizes count float32
// bytes, and the links carry half of them: runRing narrows each send and
// widens each receive, folding it into float32 (kernels/cpu/wire16.h).
struct RingProgram {
  std::vector<SendStep> sends;
  std::vector<RecvStep> recvs;
  DataType dtype = DataType::kUInt8;
  ReduceOp op = ReduceOp::kSum;
  WireType wire = WireType::kNone;
};

void runRing(RingComm& c, const RingProgram& prog, const char* what);

}  // namespace collectives
}  // namespace tfring
