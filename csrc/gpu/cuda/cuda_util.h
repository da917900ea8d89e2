// CUDA runtime helpers for csrc/gpu/cuda: checked calls, device guards,
// owned events and buffers, and stream waits that honour the job's abort
// state and deadlines.
#pragma once

#include <cuda_runtime_api.h>

#include <functional>
#include <string>
#include <vector>

#include "common/abort.h"
#include "common/clock.h"
#include "common/status.h"

namespace tfring {
namespace gpu {

[[noreturn]] void cudaFail(cudaError_t e, const char* expr, const std::string& context);

}  // namespace gpu
}  // namespace tfring

// Every CUDA runtime call is checked; the error names the call and context.
#define TFRING_CUDA_CHECK(expr, ...)                                              \
  do {                                                                            \
    cudaError_t _tfring_e = (expr);                                               \
    if (_tfring_e != cudaSuccess)                                                 \
      ::tfring::gpu::cudaFail(_tfring_e, #expr, ::tfring::strCat(__VA_ARGS__));   \
  } while (0)

namespace tfring {
namespace gpu {

// Makes `device` current for a scope (the caller's thread may use another).
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int prev_ = -1;
  bool changed_ = false;
};

// A device allocation that grows on demand. Allocations it outgrows are kept
// until it is destroyed: a ring neighbour may still hold a CUDA IPC mapping
// of them, and freeing mapped memory under it is not allowed.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  ~DeviceBuffer();
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  // At least `bytes` (rounded up to a power of two, at least 1 MiB).
  char* reserve(size_t bytes);
  char* data() const { return p_; }
  size_t capacity() const { return cap_; }

 private:
  char* p_ = nullptr;
  size_t cap_ = 0;
  std::vector<void*> retired_;
};

// Page-locked host memory for staging, grown on demand.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  ~PinnedBuffer();
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  char* reserve(size_t bytes);

 private:
  char* p_ = nullptr;
  size_t cap_ = 0;
  std::vector<void*> retired_;  // outgrown, freed at teardown
};

// Blocks until the work queued on `stream` so far is done, without fixed
// sleeps: spins on an event for ~100 us (short collectives), then sleeps on
// a host function (cudaLaunchHostFunc) queued behind the work, which wakes
// it the moment the stream gets there. While blocked it wakes every 10 ms
// so a job abort (a dead peer) or the deadline ends the wait with an error
// instead of a hang; `poll` (may be null) runs then, e.g. to surface NCCL's
// asynchronous errors or a dead peer of the peer allreduce.
void waitStream(cudaStream_t stream, const Deadline& deadline, const std::string& what,
                AbortState* abort, const std::function<void()>& poll = nullptr);

// Waits (the same way) up to `seconds` for the work queued on `stream` to
// finish, whatever the job's state (for teardown); false if it did not.
bool drainStream(cudaStream_t stream, double seconds);

// A non-blocking stream of this process on `device` for one-time set-up
// work (zeroing, probes), created on first use. Set-up must never
// synchronize the whole device (cudaDeviceSynchronize, cudaFree) or go
// through the legacy default stream: a caller's stream may be held by a
// stream gate (device.h) until a collective this set-up serves is done.
cudaStream_t setupStream(int device);

// cudaFree and cudaFreeHost wait for every stream of the device, a stream
// held by a gate included: memory given up while collectives may be in
// flight (a declined set-up) is kept here and freed by freeDeferred(), at
// the GPU backend's teardown.
void freeLater(void* device_ptr, void* host_ptr);
void freeDeferred();

// "GPU-xxxxxxxx-xxxx-..." identity of a device, unique per physical GPU.
std::string deviceUuid(int device);

// The allocation containing `p` (driver API cuMemGetAddressRange, found in
// the libcuda.so.1 the runtime loaded). False if it is unknown.
bool allocationRange(const void* p, void** base, size_t* size);

}  // namespace gpu
}  // namespace tfring
