// Device memory and kernel entry points for the Python binding, tests and
// benchmarks (tfring._core: CudaArray, cuda_* functions). No CUDA types
// here; in builds without CUDA the queries say so and everything else
// throws kUnavailable.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/types.h"

namespace tfring {
namespace gpu {

// Number of usable GPUs: 0 without CUDA support, driver or device.
int deviceCount();
// Why deviceCount() is 0 ("" when it is not).
std::string unavailableReason();
// Name, UUID and compute capability of a device, for reports.
std::string describeDevice(int device);

// The calling thread's current device (0 without CUDA).
int currentDevice();

// The device holding `p`; throws kInvalidArgument naming `what` if `p` is
// not device (or managed) memory.
int pointerDevice(const void* p, const std::string& what);

void* deviceAlloc(int device, size_t bytes);
void deviceFree(int device, void* p) noexcept;
void copyToHost(void* dst, const void* src, size_t bytes, int device);
void copyToDevice(void* dst, const void* src, size_t bytes, int device);
// Blocks until `stream` (a cudaStream_t; null: the legacy default stream)
// is idle.
void synchronize(int device, void* stream);
// A non-blocking stream on `device`, for callers without a CUDA library of
// their own (tests, benchmarks); destroy it with streamDestroy.
void* streamCreate(int device);
void streamDestroy(int device, void* stream) noexcept;

// Kernels (kernels/cuda/kernels.h), launched on `stream`.
void launchReduce(int device, void* dst, const void* a, const void* b, size_t count,
                  DataType dtype, ReduceOp op, double factor, void* stream);
void launchScale(int device, void* dst, const void* src, size_t count, DataType dtype,
                 double factor, void* stream);
void launchCast(int device, void* dst, DataType dst_dtype, const void* src, DataType src_dtype,
                size_t count, void* stream);
struct Copy {
  void* dst;
  const void* src;
  size_t bytes;
};
void launchBatchedCopy(int device, const std::vector<Copy>& copies, void* stream);

// Stream-ordered completion (TFRING_GPU_COMPLETION=stream). A gate makes
// `stream` wait, on the device, until open() is called from any host
// thread: work queued on `stream` after close() runs only once the gate is
// open, and no host thread blocks meanwhile (not even CUDA's host-function
// thread, which the engine's own waits use). The wait is
// cuStreamWaitValue32 on a word of mapped pinned host memory that open()
// raises to the gate's generation, so a gate opened before its wait is
// reached costs nothing. A caller that completes a collective this way
// hands its outputs to its stream at once and lets the host go on queueing
// the step's later work (the optimizer, the next step) behind the gate.
class StreamGate {
 public:
  virtual ~StreamGate() = default;
  // Thread-safe; opening twice is harmless.
  virtual void open() = 0;
};
// Whether gates work on `device` (driver support for stream memory
// operations); `why` says why not.
bool streamGatesSupported(int device, std::string* why);
// Queues the gate's wait on `stream` (a cudaStream_t on `device`). Throws
// kUnavailable where gates are not supported.
std::shared_ptr<StreamGate> closeStream(int device, void* stream);
// Whether work queued on `other` waits behind a closed gate on `gated`: the
// two streams share a hardware work queue (CUDA maps a context's streams
// onto CUDA_DEVICE_MAX_CONNECTIONS queues; under MPS the driver may grant
// fewer). Waits for what `other` already holds, then closes a gate on
// `gated`, queues a small kernel (a memset) and a device-to-host copy on
// `other`, and sees whether they finish within `timeout_s`; the gate opens
// either way. `why`: a CUDA error that prevented the check (then true).
bool gateHoldsBack(int device, void* gated, void* other, double timeout_s, std::string* why);

// Seconds per call of `launch` (which queues work on `stream`), for
// benchmarks: CUDA events recorded on `stream` before the first and after
// the last of `iters` back-to-back calls, so the time is the GPU's, with no
// host work before or after the launches. The emulation has no event
// timer: it drains the stream and reads the host clock around the calls.
double timeLaunches(int device, void* stream, int iters, const std::function<void()>& launch);

}  // namespace gpu
}  // namespace tfring
