// CUDA emulation: the runtime singleton, the devices and their properties,
// and CUDA's error reporting (error names and strings, the per-thread last
// error). The devices are TFRING_EMU_DEVICES (default 1) emulated GPUs,
// filtered by CUDA_VISIBLE_DEVICES; their properties depend only on the
// physical index, so all processes see the same GPUs. See state.h.
#include <pthread.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>

#include "state.h"

namespace tfring_emu {
namespace detail {

Runtime::Runtime() {
  const char* env = getenv("TFRING_EMU_DEVICES");
  int total = env && *env ? atoi(env) : 1;
  if (total < 0) total = 0;
  char* end = nullptr;
  // CUDA_VISIBLE_DEVICES: a comma-separated list of indices; enumeration
  // stops at the first entry that is not a valid index, as in CUDA.
  if (const char* vis = getenv("CUDA_VISIBLE_DEVICES")) {
    for (const char* p = vis;; p = end + 1) {
      long v = strtol(p, &end, 10);
      if (end == p || (*end && *end != ',') || v < 0 || v >= total ||
          std::count(physical.begin(), physical.end(), int(v)))
        break;
      physical.push_back(int(v));
      if (!*end) break;
    }
  } else {
    for (int i = 0; i < total; ++i) physical.push_back(i);
  }
  ndev = static_cast<int>(physical.size());
  devs.reset(new Device[ndev > 0 ? ndev : 1]);
  const char* d = getenv("TFRING_EMU_DELAY_US");
  delay_us = d ? std::max(0, atoi(d)) : 0;
  const char* q = getenv("TFRING_EMU_QUEUES");
  queues = q ? std::max(0, atoi(q)) : 0;
  std::random_device rd;
  nonce = (uint64_t(rd()) << 32) ^ rd() ^ uint64_t(getpid());
  // Every allocation and interprocess event holds a file descriptor.
  rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
  }
  pthread_atfork(nullptr, nullptr, [] { g_forked.store(true); });
}

// Never destroyed: at exit, worker threads may still be blocked (on a peer
// that died), and they must not find the runtime gone.
Runtime* runtime() {
  static Runtime* r = new Runtime();
  return r;
}

cudaError_t get(Runtime** r) {
  if (g_forked.load()) return cudaErrorInitializationError;
  *r = runtime();
  if (g_forked.load()) return cudaErrorInitializationError;
  return (*r)->ndev == 0 ? cudaErrorNoDevice : cudaSuccess;
}

namespace {

void fillProps(Runtime* R, int dev, cudaDeviceProp* p) {
  const int phys = R->physical[dev];
  memset(p, 0, sizeof(*p));
  snprintf(p->name, sizeof(p->name), "tfring emulated GPU");
  static const char kUuid[16] = {'\x7f', 't', 'f', 'r', 'i', 'n', 'g', '-', 'e', 'm', 'u', '-'};
  memcpy(p->uuid.bytes, kUuid, 16);
  p->uuid.bytes[14] = static_cast<char>(phys >> 8);
  p->uuid.bytes[15] = static_cast<char>(phys);
  p->totalGlobalMem = kTotalMem;
  p->major = 9;  // sm_90
  p->multiProcessorCount = 2;
  p->maxThreadsPerMultiProcessor = 2048;
  p->pciBusID = phys + 1;  // domain and device 0
}

}  // namespace
}  // namespace detail
}  // namespace tfring_emu

using namespace tfring_emu::detail;

void tfring_emu::setLastError(cudaError_t error) { ret(error); }

extern "C" {

// ---- errors ------------------------------------------------------------------------

cudaError_t cudaGetLastError(void) {
  cudaError_t e = t_last;
  t_last = cudaSuccess;
  return e;
}

cudaError_t cudaPeekAtLastError(void) { return t_last; }

#define TFRING_EMU_NAME_CASE(name, value, text) \
  case name:                                    \
    return #name;
#define TFRING_EMU_TEXT_CASE(name, value, text) \
  case name:                                    \
    return text;

const char* cudaGetErrorName(cudaError_t error) {
  switch (error) { TFRING_EMU_CUDA_ERRORS(TFRING_EMU_NAME_CASE) }
  return "cudaErrorUnrecognized";
}

const char* cudaGetErrorString(cudaError_t error) {
  switch (error) { TFRING_EMU_CUDA_ERRORS(TFRING_EMU_TEXT_CASE) }
  return "unrecognized error code";
}

// ---- devices -----------------------------------------------------------------------

cudaError_t cudaGetDeviceCount(int* count) {
  if (!count) return ret(cudaErrorInvalidValue);
  Runtime* R = nullptr;
  cudaError_t e = get(&R);
  *count = e == cudaSuccess ? R->ndev : 0;
  return ret(e);
}

cudaError_t cudaSetDevice(int device) {
  RUNTIME(R);
  if (!validDevice(R, device)) return ret(cudaErrorInvalidDevice);
  t_dev = device;
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
  RUNTIME(R);
  if (!device) return ret(cudaErrorInvalidValue);
  *device = t_dev;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  RUNTIME(R);
  if (!prop) return ret(cudaErrorInvalidValue);
  if (!validDevice(R, device)) return ret(cudaErrorInvalidDevice);
  fillProps(R, device, prop);
  return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  RUNTIME(R);
  if (!value) return ret(cudaErrorInvalidValue);
  if (!validDevice(R, device)) return ret(cudaErrorInvalidDevice);
  cudaDeviceProp p;
  fillProps(R, device, &p);
  if (attr == cudaDevAttrMultiProcessorCount) *value = p.multiProcessorCount;
  else if (attr == cudaDevAttrMaxThreadsPerMultiProcessor) *value = p.maxThreadsPerMultiProcessor;
  else return ret(cudaErrorInvalidValue);
  return cudaSuccess;
}

cudaError_t cudaDeviceGetPCIBusId(char* pciBusId, int len, int device) {
  RUNTIME(R);
  if (!pciBusId || len <= 0) return ret(cudaErrorInvalidValue);
  if (!validDevice(R, device)) return ret(cudaErrorInvalidDevice);
  snprintf(pciBusId, static_cast<size_t>(len), "%04X:%02X:%02X.0", 0, R->physical[device] + 1, 0);
  return cudaSuccess;
}

// Accepts "domain:bus:device.function" and "bus:device.function" (hex).
cudaError_t cudaDeviceGetByPCIBusId(int* device, const char* pciBusId) {
  RUNTIME(R);
  if (!device || !pciBusId) return ret(cudaErrorInvalidValue);
  unsigned dom = 0, bus = 0, dv = 0, fn = 0;
  if (sscanf(pciBusId, "%x:%x:%x.%x", &dom, &bus, &dv, &fn) != 4) {
    dom = 0;
    if (sscanf(pciBusId, "%x:%x.%x", &bus, &dv, &fn) != 3) return ret(cudaErrorInvalidValue);
  }
  for (int d = 0; d < R->ndev; ++d)
    if (dom == 0 && dv == 0 && bus == unsigned(R->physical[d] + 1)) {
      *device = d;
      return cudaSuccess;
    }
  return ret(cudaErrorInvalidDevice);
}

cudaError_t cudaDeviceCanAccessPeer(int* canAccessPeer, int device, int peerDevice) {
  RUNTIME(R);
  if (!canAccessPeer) return ret(cudaErrorInvalidValue);
  if (!validDevice(R, device) || !validDevice(R, peerDevice)) return ret(cudaErrorInvalidDevice);
  *canAccessPeer = device != peerDevice;  // CUDA answers 0 for a device and itself
  return cudaSuccess;
}

}  // extern "C"
