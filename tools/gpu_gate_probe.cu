// Whether a stream gate (csrc/gpu/cuda/stream_gate.cc: cuStreamWaitValue32
// on a word of mapped page-locked host memory, released by a host store)
// works on this machine, and whether a closed gate holds back work that
// other streams of the same process queue meanwhile.
//
// TFRING_GPU_COMPLETION=stream closes a gate on the caller's stream, then
// runs the collective's kernels and copies on the engine's own stream, and
// opens the gate once they are done. CUDA maps a context's streams onto a
// few hardware work queues (CUDA_DEVICE_MAX_CONNECTIONS; under MPS the
// clients of one server share one pool, and the driver may grant fewer than
// asked). Work on a stream that shares a queue with the gated one waits
// behind the gate: the engine would then wait for itself.
//
//   nvcc -O2 -o gpu_gate_probe tools/gpu_gate_probe.cu
//   ./gpu_gate_probe [--streams N] [--timeout-ms T]
//
// Cases, each on fresh streams and a fresh gate word:
//   release      the gate alone: a kernel queued behind it runs once the
//                host raises the word (the start-up probe only tries a
//                wait that is already satisfied);
//   KIND after K for K = 0..N streams created between the caller's stream
//                and the engine's (as a framework creates its own): with
//                the gate closed, the engine's stream (highest priority,
//                non-blocking, as executor.cc makes it) runs a kernel, a
//                device-to-device copy or a device-to-host copy; "held"
//                when it has not finished after T ms, then the gate opens.
// One line per case; exit status 0 when the gate works and holds nothing
// back, 1 otherwise, 2 when there is no GPU or driver support.
#include <dlfcn.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <cuda_runtime.h>

namespace {

using WaitFn = int (*)(void* stream, unsigned long long addr, unsigned value, unsigned flags);

double nowMs() {
  using namespace std::chrono;
  return duration<double, std::milli>(steady_clock::now().time_since_epoch()).count();
}

#define CHECK(x)                                                                    \
  do {                                                                              \
    cudaError_t e_ = (x);                                                           \
    if (e_ != cudaSuccess) {                                                        \
      std::printf("gate-probe: %s failed: %s\n", #x, cudaGetErrorString(e_));       \
      std::exit(2);                                                                 \
    }                                                                               \
  } while (0)

__global__ void mark(volatile unsigned* flag) { *flag = 1; }

// About a microsecond of work, so the kernel is a real launch.
__global__ void touch(float* p, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] += 1.0f;
}

// Polls until done() or timeout_ms; returns the milliseconds it took, or -1.
template <class F>
double waitFor(F done, double timeout_ms) {
  const double t0 = nowMs();
  while (!done()) {
    if (nowMs() - t0 > timeout_ms) return -1;
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  return nowMs() - t0;
}

bool streamDone(cudaStream_t s) { return cudaStreamQuery(s) == cudaSuccess; }

}  // namespace

int main(int argc, char** argv) {
  int streams = 40;
  double timeout_ms = 500;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--streams")) streams = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--timeout-ms")) timeout_ms = std::atof(argv[i + 1]);
  }
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
    std::printf("gate-probe: no CUDA device\n");
    return 2;
  }
  CHECK(cudaSetDevice(0));
  CHECK(cudaFree(nullptr));  // the context, with CUDA_DEVICE_MAX_CONNECTIONS as set
  void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (!h) h = dlopen("libcuda.so.1", RTLD_NOW);
  WaitFn wait = h ? reinterpret_cast<WaitFn>(dlsym(h, "cuStreamWaitValue32_v2")) : nullptr;
  if (!wait && h) wait = reinterpret_cast<WaitFn>(dlsym(h, "cuStreamWaitValue32"));
  if (!wait) {
    std::printf("gate-probe: the driver has no cuStreamWaitValue32\n");
    return 2;
  }
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  const char* conn = std::getenv("CUDA_DEVICE_MAX_CONNECTIONS");
  const char* pipe = std::getenv("CUDA_MPS_PIPE_DIRECTORY");
  std::printf("gate-probe: %s, CUDA_DEVICE_MAX_CONNECTIONS=%s, CUDA_MPS_PIPE_DIRECTORY=%s\n",
              prop.name, conn ? conn : "(unset)", pipe ? pipe : "(unset)");

  const int kWords = 1024;
  unsigned* words = nullptr;  // as stream_gate.cc: mapped, portable, the host address
  CHECK(cudaHostAlloc(reinterpret_cast<void**>(&words), kWords * sizeof(unsigned),
                      cudaHostAllocMapped | cudaHostAllocPortable));
  std::memset(words, 0, kWords * sizeof(unsigned));
  unsigned* flag = nullptr;
  CHECK(cudaHostAlloc(reinterpret_cast<void**>(&flag), sizeof(unsigned), cudaHostAllocMapped));
  const int n = 1 << 20;
  float *dev_a = nullptr, *dev_b = nullptr, *host = nullptr;
  CHECK(cudaMalloc(&dev_a, n * sizeof(float)));
  CHECK(cudaMalloc(&dev_b, n * sizeof(float)));
  CHECK(cudaMallocHost(&host, n * sizeof(float)));
  int least = 0, greatest = 0;
  CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  int next_word = 0;
  auto open = [](unsigned* w) { __atomic_store_n(w, 1u, __ATOMIC_RELEASE); };

  int failures = 0;
  // release: the gate alone.
  {
    cudaStream_t c;
    CHECK(cudaStreamCreateWithFlags(&c, cudaStreamNonBlocking));
    unsigned* w = words + next_word++;
    *flag = 0;
    int r = wait(c, reinterpret_cast<unsigned long long>(w), 1, 0 /* GEQ */);
    if (r != 0) {
      std::printf("gate-probe: release: cuStreamWaitValue32 returned %d\n", r);
      return 2;
    }
    mark<<<1, 1, 0, c>>>(flag);
    CHECK(cudaGetLastError());
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    const bool early = streamDone(c) || *flag;
    open(w);
    const double ms = waitFor([&] { return streamDone(c); }, timeout_ms * 4);
    if (early) {
      std::printf("gate-probe: release: FAILED, the kernel behind the gate ran before it opened\n");
      ++failures;
    } else if (ms < 0) {
      std::printf("gate-probe: release: FAILED, the stream did not drain %.0f ms after the "
                  "host raised the word\n", timeout_ms * 4);
      ++failures;
    } else {
      std::printf("gate-probe: release: ok, drained %.3f ms after the host raised the word\n", ms);
    }
    CHECK(cudaStreamSynchronize(c));
    CHECK(cudaStreamDestroy(c));
  }

  // Work on the engine's stream while the caller's is gated.
  const char* kinds[] = {"kernel", "copy d2d", "copy d2h"};
  for (const char* kind : kinds) {
    int held = 0;
    std::string held_at;
    for (int k = 0; k <= streams && next_word < kWords; ++k) {
      cudaStream_t c, e;
      CHECK(cudaStreamCreateWithFlags(&c, cudaStreamNonBlocking));
      std::vector<cudaStream_t> between(k);
      for (auto& s : between) CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
      CHECK(cudaStreamCreateWithPriority(&e, cudaStreamNonBlocking, greatest));
      unsigned* w = words + next_word++;
      if (wait(c, reinterpret_cast<unsigned long long>(w), 1, 0) != 0) {
        std::printf("gate-probe: %s after %d: cuStreamWaitValue32 failed\n", kind, k);
        return 2;
      }
      touch<<<1, 32, 0, c>>>(dev_b, 32);  // the caller's next work, behind the gate
      if (!std::strcmp(kind, "kernel")) touch<<<(n + 255) / 256, 256, 0, e>>>(dev_a, n);
      else if (!std::strcmp(kind, "copy d2d"))
        CHECK(cudaMemcpyAsync(dev_b, dev_a, n * sizeof(float), cudaMemcpyDeviceToDevice, e));
      else
        CHECK(cudaMemcpyAsync(host, dev_a, n * sizeof(float), cudaMemcpyDeviceToHost, e));
      CHECK(cudaGetLastError());
      const double ms = waitFor([&] { return streamDone(e); }, timeout_ms);
      if (ms < 0) {
        ++held;
        held_at += (held_at.empty() ? "" : ",") + std::to_string(k);
      }
      open(w);
      CHECK(cudaStreamSynchronize(c));
      CHECK(cudaStreamSynchronize(e));
      for (auto& s : between) CHECK(cudaStreamDestroy(s));
      CHECK(cudaStreamDestroy(c));
      CHECK(cudaStreamDestroy(e));
    }
    if (held) {
      std::printf("gate-probe: %s on the engine's stream: HELD behind the closed gate with "
                  "%s streams between (of 0..%d)\n", kind, held_at.c_str(), streams);
      ++failures;
    } else {
      std::printf("gate-probe: %s on the engine's stream: ok, never held (0..%d streams "
                  "between)\n", kind, streams);
    }
  }
  std::printf("gate-probe: %s\n", failures ? "FAILED" : "ok");
  return failures ? 1 : 0;
}
