// gpu/device.h with CUDA: device memory and kernel entry points for the
// Python binding, tests and benchmarks.
#include "gpu/device.h"

#include <dlfcn.h>

#include "gpu/cuda/cuda_util.h"
#include "kernels/cuda/kernels.h"

namespace tfring {
namespace gpu {

namespace {
cudaStream_t asStream(void* s) { return static_cast<cudaStream_t>(s); }
}  // namespace

int deviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // not sticky: clear it
    return 0;
  }
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
