// gpu/device.h with CUDA: device memory and kernel entry points for the
// Python binding, tests and benchmarks.
#include "gpu/device.h"

#include <dlfcn.h>

#include <chrono>

#include "gpu/cuda/cuda_util.h"
#include "kernels/cuda/kernels.h"

namespace tfring {
namespace gpu {

namespace {
cudaStream_t asStream(void* s) { return static_cast<cudaStream_t>(s); }
}  // namespace

int deviceCount() {
  // Fixed for the life of the process (CUDA reads CUDA_VISIBLE_DEVICES once):
  // asked once, since every GPU submission checks it.
  static const int n = [] {
    int c = 0;
    if (cudaGetDeviceCount(&c) != cudaSuccess) {
      cudaGetLastError();  // not sticky: clear it
      return 0;
    }
    return c;
  }();
  return n;
}

std::string unavailableReason() {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();
    std::string why = strCat("the CUDA runtime cannot be used (", cudaGetErrorName(e), ": ",
                             cudaGetErrorString(e), ")");
    void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (!h) h = dlopen("libcuda.so.1", RTLD_NOW);
    if (!h) return "no NVIDIA driver was found (libcuda.so.1 does not load); " + why;
    return why;
  }
  if (n == 0) return "no CUDA device is visible (CUDA_VISIBLE_DEVICES?)";
  return "";
}

std::string describeDevice(int device) {
  cudaDeviceProp prop;
  TFRING_CUDA_CHECK(cudaGetDeviceProperties(&prop, device), "GPU ", device);
  return strCat(prop.name, " (", deviceUuid(device), ", sm_", prop.major, prop.minor, ", ",
                prop.totalGlobalMem >> 20, " MiB)");
}

int currentDevice() {
  int d = 0;
  if (cudaGetDevice(&d) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return d;
}

int pointerDevice(const void* p, const std::string& what) {
  cudaPointerAttributes attr;
  cudaError_t e = cudaPointerGetAttributes(&attr, p);
  if (e != cudaSuccess) {
    cudaGetLastError();
    fail(Code::kInvalidArgument, what, ": cannot inspect pointer ", p, " (", cudaGetErrorString(e),
         ")");
  }
  if (attr.type != cudaMemoryTypeDevice && attr.type != cudaMemoryTypeManaged)
    fail(Code::kInvalidArgument, what, ": pointer ", p,
         " is not GPU memory (it is host or unregistered memory)");
  return attr.device;
}

void* deviceAlloc(int device, size_t bytes) {
  DeviceGuard g(device);
  void* p = nullptr;
  TFRING_CUDA_CHECK(cudaMalloc(&p, bytes ? bytes : 1), "allocating ", bytes, " bytes on GPU ",
                    device);
  return p;
}

void deviceFree(int device, void* p) noexcept {
  if (!p) return;
  int prev = -1;
  cudaGetDevice(&prev);
  if (prev != device) cudaSetDevice(device);
  cudaFree(p);
  if (prev != device && prev >= 0) cudaSetDevice(prev);
}

void copyToHost(void* dst, const void* src, size_t bytes, int device) {
  if (!bytes) return;
  DeviceGuard g(device);
  TFRING_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
}

void copyToDevice(void* dst, const void* src, size_t bytes, int device) {
  if (!bytes) return;
  DeviceGuard g(device);
  TFRING_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
  // From pageable memory cudaMemcpy may return once the data is staged, before
  // the DMA reaches the device. The array is then announced as complete (no
  // producer stream) to work queued on other, non-blocking streams: wait.
  TFRING_CUDA_CHECK(cudaStreamSynchronize(0));
}

void synchronize(int device, void* stream) {
  DeviceGuard g(device);
  TFRING_CUDA_CHECK(cudaStreamSynchronize(asStream(stream)));
}

void* streamCreate(int device) {
  DeviceGuard g(device);
  cudaStream_t s = nullptr;
  TFRING_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "GPU ", device);
  return s;
}

void streamDestroy(int device, void* stream) noexcept {
  if (!stream) return;
  try {
    DeviceGuard g(device);
    cudaStreamDestroy(asStream(stream));
  } catch (const Error&) {
  }
}

double timeLaunches(int device, void* stream, int iters, const std::function<void()>& launch) {
  DeviceGuard g(device);
  cudaStream_t st = asStream(stream);
  launch();  // untimed: first-launch costs (module load, allocations)
  TFRING_CUDA_CHECK(cudaStreamSynchronize(st), "GPU ", device);
#ifdef TFRING_CUDA_EMULATION
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) launch();
  TFRING_CUDA_CHECK(cudaStreamSynchronize(st), "GPU ", device);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iters;
#else
  cudaEvent_t ev[2] = {nullptr, nullptr};
  float ms = 0;
  cudaError_t e = cudaEventCreate(&ev[0]);
  if (e == cudaSuccess) e = cudaEventCreate(&ev[1]);
  if (e == cudaSuccess) e = cudaEventRecord(ev[0], st);
  if (e == cudaSuccess) {
    for (int i = 0; i < iters; ++i) launch();
    e = cudaEventRecord(ev[1], st);
  }
  if (e == cudaSuccess) e = cudaEventSynchronize(ev[1]);
  if (e == cudaSuccess) e = cudaEventElapsedTime(&ms, ev[0], ev[1]);
  for (cudaEvent_t x : ev)
    if (x) cudaEventDestroy(x);
  TFRING_CUDA_CHECK(e, "timing launches on GPU ", device);
  return ms / 1e3 / iters;
#endif
}

void launchReduce(int device, void* dst, const void* a, const void* b, size_t count,
                  DataType dtype, ReduceOp op, double factor, void* stream) {
  DeviceGuard g(device);
  kernels::cuda::reduce(dst, a, b, count, dtype, op, factor, asStream(stream));
}

void launchScale(int device, void* dst, const void* src, size_t count, DataType dtype,
                 double factor, void* stream) {
  DeviceGuard g(device);
  kernels::cuda::scale(dst, src, count, dtype, factor, asStream(stream));
}

void launchCast(int device, void* dst, DataType dst_dtype, const void* src, DataType src_dtype,
                size_t count, void* stream) {
  DeviceGuard g(device);
  kernels::cuda::cast(dst, dst_dtype, src, src_dtype, count, asStream(stream));
}

void launchBatchedCopy(int device, const std::vector<Copy>& copies, void* stream) {
  DeviceGuard g(device);
  std::vector<kernels::cuda::CopyDesc> d;
  d.reserve(copies.size());
  for (auto& c : copies) d.push_back({c.dst, c.src, c.bytes});
  kernels::cuda::batchedCopy(d.data(), d.size(), asStream(stream));
}

}  // namespace gpu
}  // namespace tfring
