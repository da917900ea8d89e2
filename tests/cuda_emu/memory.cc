// CUDA emulation: device and pinned host memory, copies and memsets, pointer
// attributes, the allocation range lookup (cuMemGetAddressRange's stand-in)
// and IPC memory handles. Device memory is one memfd mapping per cudaMalloc,
// ending at a PROT_NONE guard page; its IPC handle lets another process map
// the same pages, so processes share "GPU 0" as the tests' ranks do on a real
// GPU. Copies and memsets run on the stream's worker, like CUDA's. See
// state.h.
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include "state.h"

namespace tfring_emu {
namespace detail {
namespace {

constexpr size_t kAlign = 256;  // cudaMalloc's alignment guarantee

size_t roundUp(size_t n, size_t to) { return (n + to - 1) / to * to; }

// Maps file_len bytes of fd shared, followed by a PROT_NONE guard page.
char* mapWithGuard(int fd, size_t file_len) {
  void* res = mmap(nullptr, file_len + kPage, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
  if (res == MAP_FAILED) return nullptr;
  void* m = mmap(res, file_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0);
  if (m == MAP_FAILED) {
    munmap(res, file_len + kPage);
    return nullptr;
  }
  return static_cast<char*>(res);
}

enum class Side { Host, Device, Any };

// Checks one side of a copy or memset against the registry: the device side
// must be device-accessible memory (cudaMalloc'd, IPC-mapped or pinned), the
// host side must not be device memory (in CUDA the CPU cannot touch it), and
// no range may run past the end of a device allocation (CUDA's driver checks
// ranges against the allocation).
cudaError_t checkSide(Runtime* R, const void* p, size_t n, Side side) {
  if (!p) return cudaErrorInvalidValue;
  std::lock_guard<std::mutex> g(R->mu);
  uintptr_t base = 0;
  Region* r = R->find(p, &base);
  const bool dev = r && r->kind != Kind::Host;
  if (side == Side::Device && !r) return cudaErrorInvalidValue;
  if (side == Side::Host && dev) return cudaErrorInvalidValue;
  if (dev && reinterpret_cast<uintptr_t>(p) + n > base + r->size) return cudaErrorInvalidValue;
  return cudaSuccess;
}

cudaError_t checkCopy(Runtime* R, void* dst, const void* src, size_t n, cudaMemcpyKind kind) {
  static const Side kSides[5][2] = {{Side::Host, Side::Host},     {Side::Device, Side::Host},
                                    {Side::Host, Side::Device},   {Side::Device, Side::Device},
                                    {Side::Any, Side::Any}};
  if (static_cast<int>(kind) < 0 || static_cast<int>(kind) > 4) return cudaErrorInvalidMemcpyDirection;
  if (cudaError_t e = checkSide(R, dst, n, kSides[kind][0])) return e;
  return checkSide(R, src, n, kSides[kind][1]);
}

// The copy and memset entry points: `check`, then `work` queued on the
// stream. The synchronous forms (`sync`) run on the legacy default stream and
// wait, so they are ordered after blocking streams' work but not after
// non-blocking streams', as in CUDA.
cudaError_t memOp(cudaStream_t stream, bool sync, size_t count,
                  const std::function<cudaError_t(Runtime*)>& check, std::function<void()> work) {
  RUNTIME(R);
  StreamP s;
  if (cudaError_t e = resolve(R, stream, &s)) return ret(e);
  if (count == 0) return cudaSuccess;
  if (cudaError_t e = check(R)) return ret(e);
  uint64_t seq = 0;
  if (cudaError_t e = submit(R, s, std::move(work), &seq)) return ret(e);
  if (sync) waitStream(s.get(), seq);
  return cudaSuccess;
}

// cudaFree and cudaFreeHost. Like CUDA, they first wait for the queued work
// of the allocation's device (of every device for pinned memory, which all
// may use), so freeing memory that queued work still uses is safe.
cudaError_t freeRegion(void* p, Kind kind) {
  RUNTIME(R);
  if (!p) return cudaSuccess;
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  int dev = -1;
  {
    std::lock_guard<std::mutex> g(R->mu);
    auto it = R->regions.find(a);
    if (it == R->regions.end() || it->second.kind != kind) return ret(cudaErrorInvalidValue);
    dev = it->second.device;
  }
  for (int d = 0; d < R->ndev; ++d)
    if (kind == Kind::Host || d == dev) syncDevice(R, d);
  std::unique_lock<std::mutex> g(R->mu);
  auto it = R->regions.find(a);
  if (it == R->regions.end() || it->second.kind != kind) return ret(cudaErrorInvalidValue);
  Region r = std::move(it->second);
  R->regions.erase(it);
  g.unlock();
  munmap(r.map, r.map_len);
  if (r.fd >= 0) close(r.fd);
  return cudaSuccess;
}

}  // namespace
}  // namespace detail
}  // namespace tfring_emu

using namespace tfring_emu::detail;

extern "C" {

// ---- allocations -------------------------------------------------------------------

// The allocation ends at the guard page (its end 256-aligned, as are its
// start and the rest of the mapping's pages before it).
cudaError_t cudaMalloc(void** devPtr, size_t size) {
  RUNTIME(R);
  if (!devPtr) return ret(cudaErrorInvalidValue);
  *devPtr = nullptr;
  if (size > kTotalMem) return ret(cudaErrorMemoryAllocation);
  const size_t want = size ? size : 1;
  const size_t data_len = roundUp(want, kAlign), file_len = roundUp(data_len, kPage);
  const uint64_t gen = ++R->gen;
  int fd = memfd_create(memfdName(R->nonce, gen).c_str(), MFD_CLOEXEC);
  if (fd < 0) return ret(cudaErrorMemoryAllocation);
  char* map = nullptr;
  if (ftruncate(fd, static_cast<off_t>(file_len)) != 0 || !(map = mapWithGuard(fd, file_len))) {
    close(fd);
    return ret(cudaErrorMemoryAllocation);
  }
  char* p = map + (file_len - data_len);
  Region r{Kind::Device, t_dev, want, map, file_len + kPage, fd, std::string(), 0, {}};
  HandleData h{kMagic, kMemHandle, getpid(), fd, t_dev, 0, R->nonce, gen, file_len,
               reinterpret_cast<uint64_t>(p), want};
  fillHandle(r.handle.reserved, h);
  {
    std::lock_guard<std::mutex> g(R->mu);
    R->regions.emplace(reinterpret_cast<uintptr_t>(p), std::move(r));
  }
  *devPtr = p;
  return cudaSuccess;
}

cudaError_t cudaFree(void* devPtr) { return freeRegion(devPtr, Kind::Device); }

cudaError_t cudaHostAlloc(void** pHost, size_t size, unsigned int flags) {
  RUNTIME(R);
  if (!pHost || (flags & ~0xFu)) return ret(cudaErrorInvalidValue);
  *pHost = nullptr;
  const size_t want = size ? size : 1, len = roundUp(want, kPage);
  void* p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return ret(cudaErrorMemoryAllocation);
  std::lock_guard<std::mutex> g(R->mu);
  R->regions.emplace(reinterpret_cast<uintptr_t>(p),
                     Region{Kind::Host, t_dev, want, static_cast<char*>(p), len, -1, std::string(), 0, {}});
  *pHost = p;
  return cudaSuccess;
}

cudaError_t cudaFreeHost(void* ptr) { return freeRegion(ptr, Kind::Host); }

// CUDA 11+: memory CUDA does not know is cudaMemoryTypeUnregistered, with
// success.
cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* attributes, const void* ptr) {
  RUNTIME(R);
  if (!attributes) return ret(cudaErrorInvalidValue);
  std::lock_guard<std::mutex> g(R->mu);
  const Region* r = R->find(ptr);
  void* p = const_cast<void*>(ptr);
  if (!r) {
    *attributes = {cudaMemoryTypeUnregistered, -2, nullptr, p};
  } else if (r->kind == Kind::Host) {
    *attributes = {cudaMemoryTypeHost, r->device, p, p};
  } else {
    *attributes = {cudaMemoryTypeDevice, r->device, p, nullptr};
  }
  return cudaSuccess;
}

int tfring_emu_mem_get_address_range(unsigned long long* base, size_t* size,
                                     unsigned long long ptr) {
  Runtime* R = nullptr;
  if (get(&R) != cudaSuccess) return 1;
  std::lock_guard<std::mutex> g(R->mu);
  uintptr_t b = 0;
  const Region* r = R->find(reinterpret_cast<const void*>(ptr), &b);
  if (!r || r->kind == Kind::Host) return 1;  // CUDA_ERROR_INVALID_VALUE
  if (base) *base = b;
  if (size) *size = r->size;
  return 0;
}

// ---- copies and memsets ------------------------------------------------------------

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, cudaMemcpyKind kind,
                            cudaStream_t stream) {
  return memOp(stream, false, count, [&](Runtime* R) { return checkCopy(R, dst, src, count, kind); },
               [=] { memcpy(dst, src, count); });
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t count, cudaMemcpyKind kind) {
  return memOp(nullptr, true, count, [&](Runtime* R) { return checkCopy(R, dst, src, count, kind); },
               [=] { memcpy(dst, src, count); });
}

cudaError_t cudaMemsetAsync(void* devPtr, int value, size_t count, cudaStream_t stream) {
  return memOp(stream, false, count,
               [&](Runtime* R) { return checkSide(R, devPtr, count, Side::Device); },
               [=] { memset(devPtr, value, count); });
}

cudaError_t cudaMemset(void* devPtr, int value, size_t count) {
  return memOp(nullptr, true, count,
               [&](Runtime* R) { return checkSide(R, devPtr, count, Side::Device); },
               [=] { memset(devPtr, value, count); });
}

// ---- IPC memory handles ------------------------------------------------------------

// Any address inside an allocation gives the allocation's one handle.
cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t* handle, void* devPtr) {
  RUNTIME(R);
  if (!handle || !devPtr) return ret(cudaErrorInvalidValue);
  std::lock_guard<std::mutex> g(R->mu);
  const Region* r = R->find(devPtr);
  if (!r || r->kind != Kind::Device) return ret(cudaErrorInvalidValue);
  *handle = r->handle;
  return cudaSuccess;
}

// Maps another process's allocation; the same handle opened again gives the
// same mapping, reference counted (CUDA 11.x+). CUDA refuses handles from
// the opening process itself with cudaErrorDeviceUninitialized, and a
// handle whose allocation overlaps, in the exporter's address space, an
// allocation of the same exporter this process still has mapped (a freed
// allocation whose range the exporter has reused) with
// cudaErrorAlreadyMapped: a real H100 driver did, so a cache of mappings
// must drop stale ones before opening new ones.
cudaError_t cudaIpcOpenMemHandle(void** devPtr, cudaIpcMemHandle_t handle, unsigned int flags) {
  RUNTIME(R);
  if (!devPtr || flags != cudaIpcMemLazyEnablePeerAccess) return ret(cudaErrorInvalidValue);
  HandleData h;
  if (!readHandle(handle.reserved, kMemHandle, &h) || roundUp(h.size, kAlign) > h.file_len)
    return ret(cudaErrorInvalidResourceHandle);
  const uint64_t offset = h.file_len - roundUp(h.size, kAlign);
  if (h.pid == getpid()) return ret(cudaErrorDeviceUninitialized);
  const std::string key(handle.reserved, sizeof(handle.reserved));
  std::lock_guard<std::mutex> g(R->mu);
  auto it = R->imports.find(key);
  if (it != R->imports.end()) {
    ++R->regions.at(it->second).refs;
    *devPtr = reinterpret_cast<void*>(it->second);
    return cudaSuccess;
  }
  for (const auto& kv : R->regions) {
    const Region& r = kv.second;
    if (r.kind == Kind::Imported && r.remote_pid == h.pid && r.remote_nonce == h.nonce &&
        r.remote_base < h.base + h.size && h.base < r.remote_base + r.size)
      return ret(cudaErrorAlreadyMapped);
  }
  int fd = openExported(h, h.file_len);
  if (fd < 0) return ret(cudaErrorMapBufferObjectFailed);
  char* map = mapWithGuard(fd, h.file_len);
  close(fd);  // the mapping keeps the memory
  if (!map) return ret(cudaErrorMapBufferObjectFailed);
  char* p = map + offset;
  const int dev = validDevice(R, h.device) ? h.device : t_dev;
  R->regions.emplace(reinterpret_cast<uintptr_t>(p),
                     Region{Kind::Imported, dev, h.size, map, h.file_len + kPage, -1, key, 1, {},
                            h.pid, h.nonce, h.base});
  R->imports.emplace(key, reinterpret_cast<uintptr_t>(p));
  *devPtr = p;
  return cudaSuccess;
}

// Unmaps at the last close, at once: like CUDA, closing does not wait for
// queued work that still reads the mapping (that is the caller's job).
cudaError_t cudaIpcCloseMemHandle(void* devPtr) {
  RUNTIME(R);
  char* map = nullptr;
  size_t len = 0;
  {
    std::lock_guard<std::mutex> g(R->mu);
    auto it = R->regions.find(reinterpret_cast<uintptr_t>(devPtr));
    if (!devPtr || it == R->regions.end() || it->second.kind != Kind::Imported)
      return ret(cudaErrorInvalidValue);
    if (--it->second.refs > 0) return cudaSuccess;
    map = it->second.map;
    len = it->second.map_len;
    R->imports.erase(it->second.key);
    R->regions.erase(it);
  }
  munmap(map, len);
  return cudaSuccess;
}

}  // extern "C"
