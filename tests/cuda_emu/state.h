// CUDA emulation (TFRING_WITH_CUDA=EMU): a fake CUDA runtime that runs
// "device" work on host threads, so that the unchanged product GPU code can
// be built with g++ and tested where there is no GPU. The point is to catch
// the product's bugs, so the emulation mirrors the CUDA behaviour the product
// relies on and never synchronizes more than CUDA does:
//   - Streams are asynchronous: each stream has a worker thread running its
//     work in FIFO order, each item after a random delay of up to
//     TFRING_EMU_DELAY_US microseconds (default 0) to expose missing
//     synchronization. Stream 0 is the legacy default stream of the current
//     device, with its implicit barriers against *blocking* streams only.
//   - Device memory is one memfd mapping per cudaMalloc, so it can be
//     exported through IPC handles (opened by another process through
//     /proc/<pid>/fd). Each allocation ends at a PROT_NONE guard page, so
//     gross overruns fault instead of silently hitting a neighbour.
//   - Events are sequence counters {recorded, completed}; interprocess ones
//     keep them in a shared memfd page, so processes record, wait on and
//     query the same event.
//   - TFRING_EMU_DEVICES (default 1) devices, filtered and renumbered by
//     CUDA_VISIBLE_DEVICES like CUDA; properties depend only on the physical
//     index, so processes agree on them (same uuid: a shared GPU).
//   - Use after fork() in a child of an initialized process fails with
//     cudaErrorInitializationError, as CUDA does.
// Deviations, chosen to keep tests from hanging rather than to hide bugs: a
// stream waiting on an interprocess event whose last recorder died gives up
// (with a warning on stderr); cudaEventSynchronize then returns
// cudaErrorLaunchFailure.
//
// The runtime's files: devices.cc (the runtime singleton, devices, errors),
// memory.cc (allocations, copies and memsets, IPC memory handles),
// streams.cc (stream workers, events, IPC events, synchronization) and
// handles.cc (the IPC handle format both kinds of handle share). This header
// holds what they share: the per-thread state, the registries of streams,
// events and memory regions, and the stream and event objects. Internal
// names live in tfring_emu::detail.
#pragma once

#include <cuda_runtime_api.h>

#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace tfring_emu {
namespace detail {

constexpr size_t kTotalMem = size_t(16) << 30;
inline const size_t kPage = static_cast<size_t>(sysconf(_SC_PAGESIZE));
constexpr uint32_t kMagic = 0x4d454654;  // "TFEM"
constexpr uint32_t kMemHandle = 1, kEventHandle = 2;

// Per-thread state, as in CUDA: the current device and the last error.
inline thread_local int t_dev = 0;
inline thread_local cudaError_t t_last = cudaSuccess;
inline std::atomic<bool> g_forked{false};

// Every failing call records its error as the thread's last error, except
// cudaErrorNotReady, which CUDA does not count as an error.
inline cudaError_t ret(cudaError_t e) {
  if (e != cudaSuccess && e != cudaErrorNotReady) t_last = e;
  return e;
}

// The state of an event: how many records were issued and the highest one
// completed. Lives in a shared page for interprocess events, so it must be
// lock-free atomics only. `recorder` is the pid of the last recorder, used
// to stop waiting when it dies with its record pending.
struct EventState {
  std::atomic<uint64_t> recorded{0};
  std::atomic<uint64_t> completed{0};
  std::atomic<int32_t> recorder{0};
};
static_assert(std::atomic<uint64_t>::is_always_lock_free, "shared events need lock-free atomics");

// ---- IPC handles (handles.cc) ------------------------------------------------

// What the 64 reserved bytes of an IPC handle hold. `nonce` and `gen` name
// the memfd ("tfring-emu-<nonce>-<gen>"), so an opener can check that
// /proc/<pid>/fd/<fd> is still the exported object and not a reused fd or
// pid; `gen` also makes a new allocation at a freed one's address get a new
// handle, as CUDA documents.
// `base` is the allocation's address in the exporter (its offset in the
// mapping is file_len - size rounded up to 256).
struct HandleData {
  uint32_t magic, kind;
  int32_t pid, fd, device, pad;
  uint64_t nonce, gen, file_len, base, size;
};
static_assert(sizeof(HandleData) <= 64, "must fit cudaIpc*Handle_t");

std::string memfdName(uint64_t nonce, uint64_t gen);
void fillHandle(char reserved[64], const HandleData& d);
bool readHandle(const char reserved[64], uint32_t kind, HandleData* d);
int openExported(const HandleData& h, uint64_t min_len);

}  // namespace detail
}  // namespace tfring_emu

// An event. Queued work holds a shared_ptr to it, so cudaEventDestroy may
// return at once with records still pending, as in CUDA.
struct CUevent_st {
  int device = 0;
  unsigned flags = 0;
  tfring_emu::detail::EventState local;
  tfring_emu::detail::EventState* st = &local;
  void* page = nullptr;  // the shared page of an interprocess event
  int fd = -1;           // its memfd, kept open while the exporter's event lives
  cudaIpcEventHandle_t handle{};
  ~CUevent_st() {
    if (page) munmap(page, tfring_emu::detail::kPage);
    if (fd >= 0) close(fd);
  }
};

// A hardware work queue shared by several streams (TFRING_EMU_QUEUES=N):
// items of all its streams run in the order they were queued, each taking
// a ticket at submission and running once every earlier ticket is done.
struct EmuQueue {
  std::atomic<uint64_t> next{0};
  std::atomic<uint64_t> serving{0};
};

// A stream: a FIFO of work run by its own worker thread. `enqueued` and
// `done` count items, so "everything queued so far" is a number to wait for.
struct CUstream_st {
  int device = 0;
  bool blocking = true;  // synchronizes with the legacy default stream
  bool legacy = false;   // is the legacy default stream
  std::mutex m;
  std::condition_variable cv;  // worker wake-ups and host waits
  std::deque<std::function<void()>> q;
  uint64_t enqueued = 0;
  std::atomic<uint64_t> done{0};
  bool destroyed = false;
  // TFRING_EMU_QUEUES: the hardware work queue this stream is aliased onto
  // (null: a queue of its own).
  std::shared_ptr<EmuQueue> hw;
};

namespace tfring_emu {
namespace detail {

using StreamP = std::shared_ptr<CUstream_st>;
using EventP = std::shared_ptr<CUevent_st>;

// A registered address range: a cudaMalloc allocation, an IPC mapping of
// another process's allocation, or cudaHostAlloc memory.
enum class Kind { Device, Imported, Host };
struct Region {
  Kind kind;
  int device;
  size_t size;      // the size asked for (at least 1)
  char* map;        // the whole mapping, guard page included
  size_t map_len;
  int fd;           // Device: the memfd behind it
  std::string key;  // Imported: the handle's bytes
  int refs;         // Imported: opens not yet closed
  cudaIpcMemHandle_t handle;  // Device: its one IPC handle
  int32_t remote_pid = 0;     // Imported: the exporter
  uint64_t remote_nonce = 0;  // Imported: the exporter's runtime
  uint64_t remote_base = 0;   // Imported: the allocation's address in the exporter
};

struct Device {
  std::mutex order;  // serializes queuing on blocking/legacy streams
  std::vector<std::shared_ptr<EmuQueue>> queues;  // TFRING_EMU_QUEUES of them
  uint64_t created = 0;                           // streams made (round robin)
  StreamP legacy;
  std::vector<StreamP> streams;  // every stream with a live worker, legacy included
};

struct Runtime {
  std::vector<int> physical;  // visible device -> physical index
  int ndev = 0;
  int delay_us = 0;
  int queues = 0;  // TFRING_EMU_QUEUES: 0, every stream its own queue
  uint64_t nonce = 0;
  std::atomic<uint64_t> gen{0};
  std::mutex mu;  // guards everything below, and Device::legacy/streams
  std::unique_ptr<Device[]> devs;
  std::unordered_map<CUstream_st*, StreamP> streams;  // live handles
  std::unordered_map<CUevent_st*, EventP> events;     // live handles
  std::map<uintptr_t, Region> regions;                // by base address
  std::map<std::string, uintptr_t> imports;           // handle bytes -> base

  Runtime();  // devices.cc: reads the environment

  // The region containing p, or null. Caller holds mu.
  Region* find(const void* p, uintptr_t* base = nullptr) {
    const uintptr_t a = reinterpret_cast<uintptr_t>(p);
    auto it = regions.upper_bound(a);
    if (it == regions.begin()) return nullptr;
    --it;
    if (a >= it->first + it->second.size) return nullptr;
    if (base) *base = it->first;
    return &it->second;
  }
};

// The runtime, created on first use and never destroyed (devices.cc).
Runtime* runtime();

// The runtime for an API call: cudaErrorInitializationError after fork(),
// cudaErrorNoDevice without devices.
cudaError_t get(Runtime** r);

#define RUNTIME(R)                                   \
  Runtime* R = nullptr;                              \
  if (cudaError_t e_ = get(&R)) return ret(e_)

inline bool validDevice(Runtime* R, int d) { return d >= 0 && d < R->ndev; }

// ---- streams (streams.cc) ------------------------------------------------------

// The stream a handle names (0: the current device's legacy default stream).
cudaError_t resolve(Runtime* R, cudaStream_t h, StreamP* out);
// Queues fn on s, with the legacy default stream's implicit barriers.
cudaError_t submit(Runtime* R, const StreamP& s, std::function<void()> fn, uint64_t* seq = nullptr);
// Waits until s has run its first `target` items.
void waitStream(CUstream_st* s, uint64_t target);
// Waits for everything queued so far on a device's streams.
void syncDevice(Runtime* R, int dev);

}  // namespace detail
}  // namespace tfring_emu
