// CUDA emulation (TFRING_WITH_CUDA=EMU): the subset of the CUDA runtime API
// that the product's GPU code uses, with CUDA's names, numeric values and
// struct layouts where the product depends on them (error codes, flags, IPC
// handles of 64 bytes). Implemented by tests/cuda_emu/*.cc (state.h says
// which file does what), which run "device" work on host threads. Only what
// the product calls is declared, so a new CUDA call in the product fails to
// compile here instead of silently behaving differently. See
// tests/cuda_emu/README.md.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "vector_types.h"

#ifdef __cplusplus
#include <functional>
#endif

// Error codes: CUDA's values, so logs read like real CUDA's.
#define TFRING_EMU_CUDA_ERRORS(X)                                                  \
  X(cudaSuccess, 0, "no error")                                                     \
  X(cudaErrorInvalidValue, 1, "invalid argument")                                   \
  X(cudaErrorMemoryAllocation, 2, "out of memory")                                  \
  X(cudaErrorInitializationError, 3, "initialization error")                        \
  X(cudaErrorInvalidConfiguration, 9, "invalid configuration argument")             \
  X(cudaErrorInvalidMemcpyDirection, 21, "invalid copy direction for memcpy")       \
  X(cudaErrorInvalidDeviceFunction, 98, "invalid device function")                  \
  X(cudaErrorNoDevice, 100, "no CUDA-capable device is detected")                   \
  X(cudaErrorInvalidDevice, 101, "invalid device ordinal")                          \
  X(cudaErrorDeviceUninitialized, 201, "invalid device context")                    \
  X(cudaErrorMapBufferObjectFailed, 205, "mapping of buffer object failed")         \
  X(cudaErrorAlreadyMapped, 208, "resource already mapped")                         \
  X(cudaErrorInvalidResourceHandle, 400, "invalid resource handle")                 \
  X(cudaErrorNotReady, 600, "device not ready")                                     \
  X(cudaErrorIllegalAddress, 700, "an illegal memory access was encountered")       \
  X(cudaErrorLaunchOutOfResources, 701, "too many resources requested for launch")  \
  X(cudaErrorLaunchFailure, 719, "unspecified launch failure")                      \
  X(cudaErrorNotSupported, 801, "operation not supported")                          \
  X(cudaErrorUnknown, 999, "unknown error")

#define TFRING_EMU_ENUM_ENTRY(name, value, text) name = value,
enum cudaError { TFRING_EMU_CUDA_ERRORS(TFRING_EMU_ENUM_ENTRY) };
#undef TFRING_EMU_ENUM_ENTRY
typedef enum cudaError cudaError_t;

enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4
};

enum cudaMemoryType {
  cudaMemoryTypeUnregistered = 0,
  cudaMemoryTypeHost = 1,
  cudaMemoryTypeDevice = 2,
  cudaMemoryTypeManaged = 3
};

enum cudaDeviceAttr {
  cudaDevAttrMultiProcessorCount = 16,
  cudaDevAttrMaxThreadsPerMultiProcessor = 39
};

// The handle types: pointers to opaque structs named as in CUDA (the kernel
// headers forward-declare CUstream_st).
typedef struct CUstream_st* cudaStream_t;
typedef struct CUevent_st* cudaEvent_t;

struct CUuuid_st {
  char bytes[16];
};
typedef struct CUuuid_st cudaUUID_t;

// Only the fields the product reads (the real struct has many more).
struct cudaDeviceProp {
  char name[256];
  cudaUUID_t uuid;
  size_t totalGlobalMem;
  int major;
  int minor;
  int multiProcessorCount;
  int maxThreadsPerMultiProcessor;
  int pciBusID;
  int pciDeviceID;
  int pciDomainID;
};

struct cudaPointerAttributes {
  enum cudaMemoryType type;
  int device;
  void* devicePointer;
  void* hostPointer;
};

// Opaque, 64 bytes like CUDA's: the product ships them between processes and
// compares them bytewise.
typedef struct cudaIpcMemHandle_st {
  char reserved[64];
} cudaIpcMemHandle_t;
typedef struct cudaIpcEventHandle_st {
  char reserved[64];
} cudaIpcEventHandle_t;

#define cudaHostAllocDefault 0x00
#define cudaHostAllocPortable 0x01
#define cudaHostAllocMapped 0x02
#define cudaHostAllocWriteCombined 0x04
#define cudaStreamDefault 0x00
#define cudaStreamNonBlocking 0x01
#define cudaStreamLegacy ((cudaStream_t)0x1)
#define cudaEventDefault 0x00
#define cudaEventBlockingSync 0x01
#define cudaEventDisableTiming 0x02
#define cudaEventInterprocess 0x04
#define cudaEventWaitDefault 0x00
#define cudaIpcMemLazyEnablePeerAccess 0x01

#ifdef __cplusplus
#define TFRING_EMU_DEFAULT(v) = v
extern "C" {
#else
#define TFRING_EMU_DEFAULT(v)
#endif

cudaError_t cudaGetLastError(void);
cudaError_t cudaPeekAtLastError(void);
const char* cudaGetErrorString(cudaError_t error);
const char* cudaGetErrorName(cudaError_t error);

cudaError_t cudaGetDeviceCount(int* count);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetDevice(int* device);
cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp* prop, int device);
cudaError_t cudaDeviceGetAttribute(int* value, enum cudaDeviceAttr attr, int device);
cudaError_t cudaDeviceGetPCIBusId(char* pciBusId, int len, int device);
cudaError_t cudaDeviceGetByPCIBusId(int* device, const char* pciBusId);
cudaError_t cudaDeviceCanAccessPeer(int* canAccessPeer, int device, int peerDevice);
cudaError_t cudaDeviceSynchronize(void);

cudaError_t cudaMalloc(void** devPtr, size_t size);
cudaError_t cudaFree(void* devPtr);
cudaError_t cudaHostAlloc(void** pHost, size_t size, unsigned int flags);
cudaError_t cudaFreeHost(void* ptr);
cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes* attributes, const void* ptr);
cudaError_t cudaMemcpy(void* dst, const void* src, size_t count, enum cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, enum cudaMemcpyKind kind,
                            cudaStream_t stream TFRING_EMU_DEFAULT(0));
cudaError_t cudaMemset(void* devPtr, int value, size_t count);
cudaError_t cudaMemsetAsync(void* devPtr, int value, size_t count,
                            cudaStream_t stream TFRING_EMU_DEFAULT(0));

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* pStream, unsigned int flags);
cudaError_t cudaStreamCreateWithPriority(cudaStream_t* pStream, unsigned int flags, int priority);
cudaError_t cudaDeviceGetStreamPriorityRange(int* leastPriority, int* greatestPriority);
cudaError_t cudaStreamDestroy(cudaStream_t stream);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);
cudaError_t cudaStreamQuery(cudaStream_t stream);
#define CUDART_CB
typedef void (*cudaHostFn_t)(void* userData);
// Runs fn(userData) on the stream's worker once the work queued before it is
// done, in order with the stream's later work (which waits for it), as
// CUDA's host function does; fn must not call the runtime.
cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void* userData);
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event,
                                unsigned int flags TFRING_EMU_DEFAULT(0));

cudaError_t cudaEventCreate(cudaEvent_t* event);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags);
cudaError_t cudaEventDestroy(cudaEvent_t event);
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream TFRING_EMU_DEFAULT(0));
cudaError_t cudaEventQuery(cudaEvent_t event);
cudaError_t cudaEventSynchronize(cudaEvent_t event);

cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t* handle, void* devPtr);
cudaError_t cudaIpcOpenMemHandle(void** devPtr, cudaIpcMemHandle_t handle, unsigned int flags);
cudaError_t cudaIpcCloseMemHandle(void* devPtr);
cudaError_t cudaIpcGetEventHandle(cudaIpcEventHandle_t* handle, cudaEvent_t event);
cudaError_t cudaIpcOpenEventHandle(cudaEvent_t* event, cudaIpcEventHandle_t handle);

// Not CUDA runtime API: the emulation's cuMemGetAddressRange_v2. 0 and the
// allocation's base and size when ptr lies inside a cudaMalloc allocation or
// an IPC mapping opened in this process; nonzero otherwise.
int tfring_emu_mem_get_address_range(unsigned long long* base, size_t* size,
                                     unsigned long long ptr);

// Not CUDA runtime API: the emulation's cuStreamWaitValue32_v2 with
// CU_STREAM_WAIT_VALUE_GEQ (flags 0). 0 on success, a CUDA error otherwise.
int tfring_emu_stream_wait_value32(void* stream, unsigned long long addr, uint32_t value,
                                   unsigned flags);

#ifdef __cplusplus
}  // extern "C"

namespace tfring_emu {
// Queues `work` on `stream` (0: the legacy default stream of the current
// device) as a kernel launch: it runs asynchronously on the stream's worker
// thread, in order with the stream's other work. Like a launch, fails with
// cudaErrorInvalidResourceHandle for a stream of another device or a
// destroyed stream (and records that as the thread's last error).
cudaError_t enqueue(cudaStream_t stream, std::function<void()> work);
// Records a (non-success) error as the calling thread's last error, as a
// failed launch does; cudaSuccess leaves the last error alone.
void setLastError(cudaError_t error);
// True once process `pid` is gone or a zombie (never this process): it will
// never record an event or reach a barrier again. The fake NCCL uses it too.
bool processGone(int32_t pid);
}  // namespace tfring_emu
#endif

#undef TFRING_EMU_DEFAULT
