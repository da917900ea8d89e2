#include "common/types.h"

#include <cstring>

namespace tfring {

size_t dtypeSize(DataType t) {
  switch (t) {
    case DataType::kFloat16:
    case DataType::kBFloat16:
    case DataType::kInt16:
    case DataType::kUInt16: return 2;
    case DataType::kFloat32:
    case DataType::kInt32: return 4;
    case DataType::kFloat64:
    case DataType::kInt64: return 8;
    case DataType::kUInt8:
    case DataType::kInt8:
    case DataType::kBool: return 1;
  }
  return 0;
}

static const char* const kDtypeNames[kNumDataTypes] = {
    "float16", "bfloat16", "float32", "float64", "int32",
    "int64",   "uint8",    "int8",    "bool",  "int16", "uint16"};
static const char* const kOpNames[kNumReduceOps] = {"sum", "average", "min",
                                                     "max", "product"};

const char* dtypeName(DataType t) {
  auto i = static_cast<int>(t);
  return i < kNumDataTypes ? kDtypeNames[i] : "unknown";
}

const char* reduceOpName(ReduceOp op) {
  auto i = static_cast<int>(op);
  return i < kNumReduceOps ? kOpNames[i] : "unknown";
}

const char* collectiveName(CollectiveType t) {
  switch (t) {
    case CollectiveType::kAllreduce: return "allreduce";
    case CollectiveType::kAllgather: return "allgather";
    case CollectiveType::kBroadcast: return "broadcast";
    case CollectiveType::kReducescatter: return "reducescatter";
    case CollectiveType::kBarrier: return "barrier";
    case CollectiveType::kAlltoall: return "alltoall";
    case CollectiveType::kJoin: return "join";
  }
  return "unknown";
}

bool isFloating(DataType t) {
  return t == DataType::kFloat16 || t == DataType::kBFloat16 ||
         t == DataType::kFloat32 || t == DataType::kFloat64;
}

static const char* const kWireNames[kNumWireTypes] = {"none", "float16", "bfloat16"};

const char* wireTypeName(WireType w) {
  auto i = static_cast<int>(w);
  return i < kNumWireTypes ? kWireNames[i] : "unknown";
}

WireType effectiveWire(WireType wire, DataType dtype) {
  return dtype == DataType::kFloat32 ? wire : WireType::kNone;
}

bool parseWireType(const std::string& s, WireType* out) {
  if (s.empty()) {
    *out = WireType::kNone;
    return true;
  }
  for (int i = 0; i < kNumWireTypes; ++i)
    if (s == kWireNames[i]) {
      *out = static_cast<WireType>(i);
      return true;
    }
  return false;
}

bool parseDataType(const std::string& s, DataType* out) {
  for (int i = 0; i < kNumDataTypes; ++i)
    if (s == kDtypeNames[i]) {
      *out = static_cast<DataType>(i);
      return true;
    }
  return false;
}

bool parseReduceOp(const std::string& s, ReduceOp* out) {
  for (int i = 0; i < kNumReduceOps; ++i)
    if (s == kOpNames[i]) {
      *out = static_cast<ReduceOp>(i);
      return true;
    }
  return false;
}

}  // namespace tfring
