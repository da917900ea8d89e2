// The GPU side of a build without CUDA: GPU tensors are refused at enqueue
// with a clear error, and the device helpers say CUDA is not built in.
#include "common/status.h"
#include "gpu/device.h"
#include "gpu/executor.h"

namespace tfring {
namespace gpu {

namespace {

[[noreturn]] void noCuda() {
  fail(Code::kUnavailable,
       "this tfring build has no CUDA support; rebuild with nvcc on the PATH");
}

}  // namespace

bool builtWithCuda() { return false; }
bool cudaEmulated() { return false; }
int boundDevice() { return -1; }

Status acceptTensor(const std::string& name, int device, void*, std::shared_ptr<void>*) {
  return Status(Code::kUnavailable,
                strCat("tensor '", name, "' is on GPU ", device,
                       " but this tfring build has no CUDA support; "
                       "rebuild with nvcc on the PATH or place the tensor on the CPU"));
}

Status createExecutor(int, const HostLink&, std::unique_ptr<Executor>*) {
  return Status(Code::kUnavailable, "this tfring build has no CUDA support");
}

uint64_t allreduceAlgorithmCount(const collectives::CommStats&, const std::string&) { return 0; }

int deviceCount() { return 0; }
std::string unavailableReason() { return "this tfring build has no CUDA support"; }
std::string describeDevice(int) { noCuda(); }
int currentDevice() { return 0; }
int pointerDevice(const void*, const std::string&) { noCuda(); }
void* deviceAlloc(int, size_t) { noCuda(); }
void deviceFree(int, void*) noexcept {}
void copyToHost(void*, const void*, size_t, int) { noCuda(); }
void copyToDevice(void*, const void*, size_t, int) { noCuda(); }
void synchronize(int, void*) { noCuda(); }
void* streamCreate(int) { noCuda(); }
double timeLaunches(int, void*, int, const std::function<void()>&) { noCuda(); }
void streamDestroy(int, void*) noexcept {}
void launchReduce(int, void*, const void*, const void*, size_t, DataType, ReduceOp, double,
                  void*) {
  noCuda();
}
void launchScale(int, void*, const void*, size_t, DataType, double, void*) { noCuda(); }
void launchCast(int, void*, DataType, const void*, DataType, size_t, void*) { noCuda(); }
void launchBatchedCopy(int, const std::vector<Copy>&, void*) { noCuda(); }
bool streamGatesSupported(int, std::string* why) {
  if (why) *why = "this tfring build has no CUDA support";
  return false;
}
std::shared_ptr<StreamGate> closeStream(int, void*) { noCuda(); }
bool gateHoldsBack(int, void*, void*, double, std::string*) { noCuda(); }

}  // namespace gpu
}  // namespace tfring
