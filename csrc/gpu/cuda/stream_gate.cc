// Stream gates (gpu/device.h): a caller's stream waits on the device for a
// collective that completes on the host side, with no host thread blocked.
//
// Protocol. Gates take slots in one page-locked, device-mapped array of
// 32-bit words (kSlots of them), round robin: the n-th gate gets slot
// n % kSlots and generation n / kSlots + 1. close() queues
// cuStreamWaitValue32(word, generation, GEQ) on the caller's stream; open()
// raises the word to the generation (never lowers it: an older gate of the
// same slot opened late must not undo a newer one). A word only grows, so a
// gate opened before the stream reaches its wait lets the stream through at
// once. A slot is reused after kSlots later gates: a wait still queued then
// (kSlots collectives in flight on one process) would be let through by the
// newer generation, so kSlots is far above any step's collectives.
//
// The driver call comes from the libcuda.so.1 the runtime loaded
// (cuStreamWaitValue32_v2: stream memory operations, on by default since
// CUDA 11.7); the emulation build has its own (tests/cuda_emu).
#include <dlfcn.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "common/clock.h"
#include "common/status.h"
#include "gpu/cuda/cuda_util.h"
#include "gpu/device.h"

namespace tfring {
namespace gpu {

namespace {

constexpr uint32_t kSlots = 1u << 16;  // 256 KiB of pinned words
constexpr unsigned kWaitGeq = 0x0;     // CU_STREAM_WAIT_VALUE_GEQ

using WaitFn = int (*)(void* stream, unsigned long long addr, uint32_t value, unsigned flags);

struct Gates {
  WaitFn wait = nullptr;
  uint32_t* words = nullptr;  // kSlots words, mapped for the device (UVA: same address)
  std::atomic<uint64_t> next{0};
  std::string why;  // why gates are unavailable ("" when they work)
};

Gates& gates() {
  static Gates* g = [] {
    auto* g = new Gates();
#ifdef TFRING_CUDA_EMULATION
    g->wait = &tfring_emu_stream_wait_value32;
#else
    void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (!h) h = dlopen("libcuda.so.1", RTLD_NOW);
    if (h) {
      g->wait = reinterpret_cast<WaitFn>(dlsym(h, "cuStreamWaitValue32_v2"));
      if (!g->wait) g->wait = reinterpret_cast<WaitFn>(dlsym(h, "cuStreamWaitValue32"));
    }
#endif
    if (!g->wait) {
      g->why = "the CUDA driver has no cuStreamWaitValue32";
      return g;
    }
    void* p = nullptr;
    cudaError_t e = cudaHostAlloc(&p, kSlots * sizeof(uint32_t),
                                  cudaHostAllocMapped | cudaHostAllocPortable);
    if (e != cudaSuccess) {
      g->why = strCat("cudaHostAlloc of the gate words failed: ", cudaGetErrorString(e));
      return g;
    }
    g->words = static_cast<uint32_t*>(p);
    for (uint32_t i = 0; i < kSlots; ++i) g->words[i] = 0;
    return g;
  }();
  return *g;
}

class Gate final : public StreamGate {
 public:
  Gate(uint32_t* word, uint32_t generation) : word_(word), generation_(generation) {}
  ~Gate() override { open(); }  // a gate dropped unopened must not hang its stream

  void open() override {
    // Raise, never lower: release order makes every write the engine made
    // before (the outputs, done on its own stream) visible first.
    uint32_t cur = __atomic_load_n(word_, __ATOMIC_RELAXED);
    while (static_cast<int32_t>(generation_ - cur) > 0 &&
           !__atomic_compare_exchange_n(word_, &cur, generation_, true, __ATOMIC_RELEASE,
                                        __ATOMIC_RELAXED)) {
    }
  }

 private:
  uint32_t* word_;
  uint32_t generation_;
};

}  // namespace

bool streamGatesSupported(int device, std::string* why) {
  Gates& g = gates();
  if (g.why.empty() && g.words) {
    // One probe per process and device: a wait that is already satisfied
    // (value 0) on a fresh stream, so a driver that refuses stream memory
    // operations says so here instead of inside a step.
    static std::mutex mu;
    static int probed[64] = {0};  // 0 unknown, 1 works, 2 refused
    static std::string refused[64];
    std::lock_guard<std::mutex> lk(mu);
    int& st = probed[device & 63];
    if (st == 0) {
      DeviceGuard dg(device);
      cudaStream_t s = nullptr;
      cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
      int r = e == cudaSuccess
                  ? g.wait(s, reinterpret_cast<unsigned long long>(g.words), 0, kWaitGeq)
                  : -1;
      if (e == cudaSuccess) {
        if (cudaStreamSynchronize(s) != cudaSuccess) r = r ? r : -2;
        cudaStreamDestroy(s);
      }
      st = r == 0 ? 1 : 2;
      if (st == 2)
        refused[device & 63] = strCat("cuStreamWaitValue32 on GPU ", device, " failed (",
                                      r, "): the driver refuses stream memory operations");
    }
    if (st == 1) return true;
    if (why) *why = refused[device & 63];
    return false;
  }
  if (why) *why = g.why;
  return false;
}

std::shared_ptr<StreamGate> closeStream(int device, void* stream) {
  std::string why;
  if (!streamGatesSupported(device, &why)) fail(Code::kUnavailable, "stream gate: ", why);
  Gates& g = gates();
  const uint64_t n = g.next.fetch_add(1);
  uint32_t* word = g.words + n % kSlots;
  const auto generation = static_cast<uint32_t>(n / kSlots + 1);
  auto gate = std::make_shared<Gate>(word, generation);
  DeviceGuard dg(device);
  const int r = g.wait(stream, reinterpret_cast<unsigned long long>(word), generation, kWaitGeq);
  if (r != 0) fail(Code::kInternal, "cuStreamWaitValue32 on GPU ", device, " failed (", r, ")");
  return gate;
}

bool gateHoldsBack(int device, void* gated, void* other, double timeout_s, std::string* why) {
  DeviceGuard dg(device);
  auto failed = [why](const char* what, cudaError_t e) {
    if (why) *why = strCat(what, " failed: ", cudaGetErrorString(e));
    return true;
  };
  // A few bytes per device, allocated before any gate is closed (an
  // allocation may wait for the device) and kept for the process.
  static std::mutex mu;
  static void* scratches[64] = {nullptr};
  static void* pinneds[64] = {nullptr};
  void*& scratch = scratches[device & 63];
  void*& pinned = pinneds[device & 63];
  {
    std::lock_guard<std::mutex> lk(mu);
    cudaError_t e = cudaSuccess;
    if (!scratch) e = cudaMalloc(&scratch, 64);
    if (e != cudaSuccess) return failed("cudaMalloc", e);
    if (!pinned) e = cudaHostAlloc(&pinned, 64, cudaHostAllocPortable);
    if (e != cudaSuccess) return failed("cudaHostAlloc", e);
  }
  auto s = static_cast<cudaStream_t>(other);
  cudaError_t e = cudaStreamSynchronize(s);  // its own work first: not what is timed
  if (e != cudaSuccess) return failed("cudaStreamSynchronize", e);
  std::shared_ptr<StreamGate> gate = closeStream(device, gated);
  e = cudaMemsetAsync(scratch, 0, 64, s);
  if (e == cudaSuccess) e = cudaMemcpyAsync(pinned, scratch, 64, cudaMemcpyDeviceToHost, s);
  if (e != cudaSuccess) {
    gate->open();
    return failed("queueing the check's memset and copy", e);
  }
  const double until = nowSeconds() + timeout_s;
  bool done = false;
  while (!(done = cudaStreamQuery(s) == cudaSuccess) && nowSeconds() < until)
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  cudaGetLastError();  // the queries' cudaErrorNotReady is no error: clear it
  gate->open();
  if (!done) {
    e = cudaStreamSynchronize(s);  // the gate is open: it drains now
    if (e != cudaSuccess) return failed("cudaStreamSynchronize", e);
  }
  return !done;
}

}  // namespace gpu
}  // namespace tfring
