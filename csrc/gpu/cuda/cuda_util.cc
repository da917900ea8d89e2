#include "gpu/cuda/cuda_util.h"

#include <dlfcn.h>
#include <sched.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>
#include <functional>

#include "common/abort.h"
#include "common/logging.h"

namespace tfring {
namespace gpu {

void cudaFail(cudaError_t e, const char* expr, const std::string& context) {
  fail(Code::kInternal, "CUDA error ", static_cast<int>(e), " (", cudaGetErrorName(e), ": ",
       cudaGetErrorString(e), ") in ", expr, context.empty() ? "" : ": ", context);
}

DeviceGuard::DeviceGuard(int device) {
  TFRING_CUDA_CHECK(cudaGetDevice(&prev_));
  if (prev_ != device) {
    TFRING_CUDA_CHECK(cudaSetDevice(device), "GPU ", device);
    changed_ = true;
  }
}

DeviceGuard::~DeviceGuard() {
  if (changed_) cudaSetDevice(prev_);
}

namespace {
size_t roundUp(size_t bytes) {
  size_t c = size_t(1) << 20;
  while (c < bytes) c <<= 1;
  return c;
}
}  // namespace

DeviceBuffer::~DeviceBuffer() {
  if (p_) cudaFree(p_);
  for (void* p : retired_) cudaFree(p);
}

char* DeviceBuffer::reserve(size_t bytes) {
  if (bytes <= cap_ && p_) return p_;
  size_t cap = roundUp(bytes);
  void* p = nullptr;
  TFRING_CUDA_CHECK(cudaMalloc(&p, cap), "allocating a ", cap, "-byte GPU buffer");
  if (p_) retired_.push_back(p_);
  p_ = static_cast<char*>(p);
  cap_ = cap;
  return p_;
}

PinnedBuffer::~PinnedBuffer() {
  if (p_) cudaFreeHost(p_);
  for (void* p : retired_) cudaFreeHost(p);
}

char* PinnedBuffer::reserve(size_t bytes) {
  if (bytes <= cap_ && p_) return p_;
  size_t cap = roundUp(bytes);
  void* p = nullptr;
  TFRING_CUDA_CHECK(cudaHostAlloc(&p, cap, cudaHostAllocPortable),
                    "allocating ", cap, " bytes of pinned host memory");
  // Kept until teardown, as DeviceBuffer's: cudaFreeHost synchronizes the
  // device, and a caller's stream may be held by a gate until this
  // collective is done (runtime/stream_completion.h).
  if (p_) retired_.push_back(p_);
  p_ = static_cast<char*>(p);
  cap_ = cap;
  return p_;
}

namespace {

// Completion of a stream's queued work, signalled by a host function queued
// behind it. Shared with the callback, which may run after the waiter gave
// up (an abort) or never (a stream stuck behind a dead peer: then it leaks,
// a few bytes).
struct HostSignal {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  static void CUDART_CB fire(void* p) {
    auto* sp = static_cast<std::shared_ptr<HostSignal>*>(p);
    {
      std::lock_guard<std::mutex> lk((*sp)->mu);
      (*sp)->done = true;
    }
    (*sp)->cv.notify_all();
    delete sp;
  }
};

constexpr double kSpinSeconds = 100e-6;  // short collectives: no wake-up latency
constexpr double kCheckSeconds = 0.01;   // abort/deadline/peer checks while blocked

// Waits until `ev` (recorded on `stream`) completes: spins on the event for
// up to kSpinSeconds, then blocks on a host function queued on the stream,
// waking every kCheckSeconds for `check` (which may throw) and to surface a
// stream error. Returns false if `check` says to stop waiting.
bool waitEvent(cudaStream_t stream, cudaEvent_t ev, const std::string& what,
               const std::function<bool()>& check) {
  const double spin_until = nowSeconds() + kSpinSeconds;
  for (uint32_t i = 0;; ++i) {
    cudaError_t e = cudaEventQuery(ev);
    if (e == cudaSuccess) return true;
    if (e != cudaErrorNotReady) cudaFail(e, "waiting for the GPU", what);
    if ((i & 15) == 15 && nowSeconds() > spin_until) break;
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
  }
  auto sig = std::make_shared<HostSignal>();
  auto* arg = new std::shared_ptr<HostSignal>(sig);
  cudaError_t e = cudaLaunchHostFunc(stream, &HostSignal::fire, arg);
  if (e != cudaSuccess) {
    delete arg;
    cudaFail(e, "cudaLaunchHostFunc", what);
  }
  std::unique_lock<std::mutex> lk(sig->mu);
  for (;;) {
    if (sig->cv.wait_for(lk, std::chrono::duration<double>(kCheckSeconds),
                         [&] { return sig->done; }))
      return true;
    lk.unlock();
    e = cudaEventQuery(ev);
    if (e == cudaSuccess) return true;
    if (e != cudaErrorNotReady) cudaFail(e, "waiting for the GPU", what);
    if (!check()) return false;
    lk.lock();
  }
}

}  // namespace

void waitStream(cudaStream_t stream, const Deadline& deadline, const std::string& what,
                AbortState* abort, const std::function<void()>& poll) {
  // Nothing queued, or all of it done already (a collective of one rank in
  // place, say): no event, no GPU round trip.
  cudaError_t q = cudaStreamQuery(stream);
  if (q == cudaSuccess) return;
  if (q != cudaErrorNotReady) cudaFail(q, "waiting for the GPU", what);
  cudaEvent_t ev;
  TFRING_CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  try {
    TFRING_CUDA_CHECK(cudaEventRecord(ev, stream), what);
    waitEvent(stream, ev, what, [&] {
      if (poll) poll();
      if (abort) abort->check();
      if (deadline.expired())
        fail(Code::kTimeout, "timed out waiting for the GPU to finish ", what,
             " (TFRING_TIMEOUT; a peer may be stuck)");
      return true;
    });
  } catch (...) {
    cudaEventDestroy(ev);  // the stream may never reach it; that is fine
    throw;
  }
  cudaEventDestroy(ev);
}

bool drainStream(cudaStream_t stream, double seconds) {
  cudaEvent_t ev;
  if (cudaEventCreateWithFlags(&ev, cudaEventDisableTiming) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  bool done = false;
  try {
    if (cudaEventRecord(ev, stream) == cudaSuccess) {
      const double until = nowSeconds() + seconds;
      done = waitEvent(stream, ev, "teardown", [&] { return nowSeconds() < until; });
    }
  } catch (const Error&) {
    done = false;
  }
  cudaGetLastError();
  cudaEventDestroy(ev);
  return done;
}

std::string deviceUuid(int device) {
  cudaDeviceProp prop;
  TFRING_CUDA_CHECK(cudaGetDeviceProperties(&prop, device), "GPU ", device);
  const unsigned char* b = reinterpret_cast<const unsigned char*>(prop.uuid.bytes);
  char buf[64];
  snprintf(buf, sizeof(buf),
           "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1],
           b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
  return buf;
}

namespace {
std::mutex g_deferred_mu;
std::vector<std::pair<void*, bool>> g_deferred;  // (pointer, is host memory)
}  // namespace

void freeLater(void* device_ptr, void* host_ptr) {
  std::lock_guard<std::mutex> lk(g_deferred_mu);
  if (device_ptr) g_deferred.emplace_back(device_ptr, false);
  if (host_ptr) g_deferred.emplace_back(host_ptr, true);
}

void freeDeferred() {
  std::vector<std::pair<void*, bool>> all;
  {
    std::lock_guard<std::mutex> lk(g_deferred_mu);
    all.swap(g_deferred);
  }
  for (auto& p : all) {
    if (p.second)
      cudaFreeHost(p.first);
    else
      cudaFree(p.first);
  }
}

cudaStream_t setupStream(int device) {
  static std::mutex mu;
  static cudaStream_t streams[64] = {};
  std::lock_guard<std::mutex> lk(mu);
  cudaStream_t& s = streams[device & 63];
  if (!s) {
    DeviceGuard g(device);
    TFRING_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "GPU ", device);
  }
  return s;
}

bool allocationRange(const void* p, void** base, size_t* size) {
  using Fn = int (*)(unsigned long long*, size_t*, unsigned long long);
#ifdef TFRING_CUDA_EMULATION
  static Fn fn = &tfring_emu_mem_get_address_range;  // the fake driver's answer
#else
  static Fn fn = []() -> Fn {
    void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (!h) h = dlopen("libcuda.so.1", RTLD_NOW);
    if (!h) return nullptr;
    return reinterpret_cast<Fn>(dlsym(h, "cuMemGetAddressRange_v2"));
  }();
#endif
  if (!fn) return false;
  unsigned long long b = 0;
  size_t s = 0;
  if (fn(&b, &s, reinterpret_cast<unsigned long long>(p)) != 0) return false;
  *base = reinterpret_cast<void*>(b);
  *size = s;
  return true;
}

}  // namespace gpu
}  // namespace tfring
