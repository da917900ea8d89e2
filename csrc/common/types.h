// Data types and reduce operations the core understands. The numeric values
// are part of the wire protocol between ranks (negotiation messages) and of
// the Python binding, so they never change once released.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace tfring {

enum class DataType : uint8_t {
  kFloat16 = 0,
  kBFloat16 = 1,
  kFloat32 = 2,
  kFloat64 = 3,
  kInt32 = 4,
  kInt64 = 5,
  kUInt8 = 6,
  kInt8 = 7,
  kBool = 8,  // broadcast/allgather only
  kInt16 = 9,
  kUInt16 = 10,
};
constexpr int kNumDataTypes = 11;

enum class ReduceOp : uint8_t {
  kSum = 0,
  kAverage = 1,
  kMin = 2,
  kMax = 3,
  kProduct = 4,
};
constexpr int kNumReduceOps = 5;

// The words an allreduce of float32 buffers puts on its links: its own
// (kNone) or 16-bit floats, accumulated in float32 on every rank
// (collectives/ring.h, docs/compression.md). Part of the negotiation
// messages like DataType.
enum class WireType : uint8_t {
  kNone = 0,
  kFloat16 = 1,
  kBFloat16 = 2,
};
constexpr int kNumWireTypes = 3;

enum class CollectiveType : uint8_t {
  kAllreduce = 0,
  kAllgather = 1,
  kBroadcast = 2,
  kReducescatter = 3,
  kBarrier = 4,
  kAlltoall = 5,  // rows of dim 0 scattered by per-rank splits
  kJoin = 6,      // this rank is out of data (see coordinator.h)
};

size_t dtypeSize(DataType t);
const char* dtypeName(DataType t);
const char* reduceOpName(ReduceOp op);
const char* collectiveName(CollectiveType t);
bool isFloating(DataType t);
// "none", "float16", "bfloat16".
const char* wireTypeName(WireType w);
// The wire type a request for `wire` gets on a `dtype` buffer: only float32
// buffers narrow onto a 16-bit wire; every other dtype (integers, and the
// floats already 16 bits wide or kept at float64) travels as it is.
WireType effectiveWire(WireType wire, DataType dtype);

// Parses names as the Python layer spells them ("float32", "sum", ...).
bool parseDataType(const std::string& s, DataType* out);
bool parseReduceOp(const std::string& s, ReduceOp* out);
// "none" (or ""), "float16", "bfloat16".
bool parseWireType(const std::string& s, WireType* out);

}  // namespace tfring
