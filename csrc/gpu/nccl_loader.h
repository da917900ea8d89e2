// NCCL, loaded at run time: no NCCL headers at build time and no link
// dependency, so one tfring build works with the NCCL of the
// nvidia-nccl-cu12 / -cu13 wheels, of the system, or none at all.
//
// Search order for libnccl.so.2 (first that loads wins):
//   1. TFRING_NCCL_LIB: the library file, or a directory holding it;
//   2. nvidia/nccl/lib (and nvidia/cu13/lib, nvidia/cu12/lib) under every
//      Python path registered with setSearchPaths() (tfring._core passes
//      sys.path when it is imported), which finds the pip wheels;
//   3. the same, relative to the directory libtfring_core.so lives in
//      (an installed tfring sits in the same site-packages as the wheels);
//   4. plain "libnccl.so.2" through the system's library path.
//
// Only the handful of types and functions tfring uses are declared, with
// NCCL's C ABI (stable since NCCL 2.0; ncclBfloat16 since 2.10).
#pragma once

#include <string>
#include <vector>

#include "common/types.h"

struct CUstream_st;  // cudaStream_t is CUstream_st*

namespace tfring {
namespace gpu {
namespace nccl {

using Comm = struct ncclComm*;
using Stream = ::CUstream_st*;
struct UniqueId {
  char internal[128];
};

enum Result : int {
  kSuccess = 0,
  kUnhandledCudaError = 1,
  kSystemError = 2,
  kInternalError = 3,
  kInvalidArgument = 4,
  kInvalidUsage = 5,
  kRemoteError = 6,
  kInProgress = 7,
};

struct Api {
  Result (*getVersion)(int* version);
  Result (*getUniqueId)(UniqueId* id);
  Result (*commInitRank)(Comm* comm, int nranks, UniqueId id, int rank);
  Result (*commDestroy)(Comm comm);
  Result (*commAbort)(Comm comm);
  Result (*commGetAsyncError)(Comm comm, Result* async_error);
  const char* (*getErrorString)(Result r);
  const char* (*getLastError)(Comm comm);  // may be null (NCCL < 2.13)
  Result (*allReduce)(const void* send, void* recv, size_t count, int dtype, int op, Comm comm,
                      Stream stream);
  Result (*broadcast)(const void* send, void* recv, size_t count, int dtype, int root, Comm comm,
                      Stream stream);
  Result (*reduce)(const void* send, void* recv, size_t count, int dtype, int op, int root,
                   Comm comm, Stream stream);
  Result (*allGather)(const void* send, void* recv, size_t send_count, int dtype, Comm comm,
                      Stream stream);
  Result (*reduceScatter)(const void* send, void* recv, size_t recv_count, int dtype, int op,
                          Comm comm, Stream stream);
  Result (*groupStart)();
  Result (*groupEnd)();
};

struct Library {
  const Api* api = nullptr;  // null when no library loaded
  std::string path;          // the file that loaded
  int version = 0;           // e.g. 22703 for 2.27.3
  std::string error;         // why nothing loaded
  std::vector<std::string> searched;
};

// Registers Python's sys.path (or any directories) for step 2. Takes effect
// for the next load() that has not succeeded yet.
void setSearchPaths(const std::vector<std::string>& dirs);

// Loads NCCL once (thread-safe); later calls return the same result unless
// the last attempt failed, in which case the search runs again.
const Library& load();

// The candidate files of steps 1-3 that exist, in search order (for
// messages and tests).
std::vector<std::string> candidates();

// NCCL enums for tfring's dtypes and ops. Bool travels as uint8 with
// sum/max as max (logical or) and product/min as min (logical and).
int dtypeOf(DataType t);
int opOf(ReduceOp op, DataType t);
int byteType();  // ncclUint8

// "NCCL error 2 (unhandled system error): <last error>" for messages.
std::string describe(const Api* api, Result r, Comm comm);

}  // namespace nccl
}  // namespace gpu
}  // namespace tfring
