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
#include <cuda_runtime_api.h>

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

namespace {

constexpr size_t kTotalMem = size_t(16) << 30;
constexpr size_t kAlign = 256;  // cudaMalloc's alignment guarantee
const size_t kPage = static_cast<size_t>(sysconf(_SC_PAGESIZE));
constexpr uint32_t kMagic = 0x4d454654;  // "TFEM"
constexpr uint32_t kMemHandle = 1, kEventHandle = 2;

size_t roundUp(size_t n, size_t to) { return (n + to - 1) / to * to; }

// Per-thread state, as in CUDA: the current device and the last error.
thread_local int t_dev = 0;
thread_local cudaError_t t_last = cudaSuccess;
std::atomic<bool> g_forked{false};

// Every failing call records its error as the thread's last error, except
// cudaErrorNotReady, which CUDA does not count as an error.
cudaError_t ret(cudaError_t e) {
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

// What the 64 reserved bytes of an IPC handle hold. `nonce` and `gen` name
// the memfd ("tfring-emu-<nonce>-<gen>"), so an opener can check that
// /proc/<pid>/fd/<fd> is still the exported object and not a reused fd or
// pid; `gen` also makes a new allocation at a freed one's address get a new
// handle, as CUDA documents.
struct HandleData {
  uint32_t magic, kind;
  int32_t pid, fd, device, pad;
  uint64_t nonce, gen, file_len, offset, size;
};
static_assert(sizeof(HandleData) <= 64, "must fit cudaIpc*Handle_t");

std::string memfdName(uint64_t nonce, uint64_t gen) {
  char buf[64];
  snprintf(buf, sizeof(buf), "tfring-emu-%016llx-%llu", static_cast<unsigned long long>(nonce),
           static_cast<unsigned long long>(gen));
  return buf;
}

void atomicMax(std::atomic<uint64_t>& a, uint64_t v) {
  uint64_t cur = a.load(std::memory_order_relaxed);
  while (cur < v && !a.compare_exchange_weak(cur, v, std::memory_order_acq_rel)) {
  }
}

// True once `pid` is gone (or a zombie: it will never record again).
bool pidDead(int32_t pid) {
  if (pid <= 0 || pid == getpid()) return false;
  char path[64], buf[512];
  snprintf(path, sizeof(path), "/proc/%d/stat", pid);
  FILE* f = fopen(path, "r");
  if (!f) return true;
  size_t n = fread(buf, 1, sizeof(buf) - 1, f);
  fclose(f);
  buf[n] = 0;
  const char* p = strrchr(buf, ')');
  return p && p[1] == ' ' && (p[2] == 'Z' || p[2] == 'X');
}

// Polls `done` the way a GPU-side wait would spin: briefly hot, then with
// short sleeps. `give_up` is consulted now and then; it ends the wait early.
template <class Done, class GiveUp>
bool pollUntil(Done done, GiveUp give_up) {
  for (uint64_t i = 0; !done(); ++i) {
    if (i < 200) {
      sched_yield();
      continue;
    }
    usleep(50);
    if (i % 512 == 0 && give_up()) return false;
  }
  return true;
}

}  // namespace

// An event. Queued work holds a shared_ptr to it, so cudaEventDestroy may
// return at once with records still pending, as in CUDA.
struct CUevent_st {
  int device = 0;
  unsigned flags = 0;
  EventState local;
  EventState* st = &local;
  void* page = nullptr;  // the shared page of an interprocess event
  int fd = -1;           // its memfd, kept open while the exporter's event lives
  cudaIpcEventHandle_t handle{};
  ~CUevent_st() {
    if (page) munmap(page, kPage);
    if (fd >= 0) close(fd);
  }
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
};

namespace {

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
};

struct Device {
  std::mutex order;  // serializes queuing on blocking/legacy streams
  StreamP legacy;
  std::vector<StreamP> streams;  // every stream with a live worker, legacy included
};

struct Runtime {
  std::vector<int> physical;  // visible device -> physical index
  int ndev = 0;
  int delay_us = 0;
  uint64_t nonce = 0;
  std::atomic<uint64_t> gen{0};
  std::mutex mu;  // guards everything below, and Device::legacy/streams
  std::unique_ptr<Device[]> devs;
  std::unordered_map<CUstream_st*, StreamP> streams;  // live handles
  std::unordered_map<CUevent_st*, EventP> events;     // live handles
  std::map<uintptr_t, Region> regions;                // by base address
  std::map<std::string, uintptr_t> imports;           // handle bytes -> base

  Runtime() {
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

#define RUNTIME(R)                                   \
  Runtime* R = nullptr;                              \
  if (cudaError_t e_ = get(&R)) return ret(e_)

bool validDevice(Runtime* R, int d) { return d >= 0 && d < R->ndev; }

// ---- streams ---------------------------------------------------------------

void startWorker(Runtime* R, const StreamP& s) {
  std::thread([R, s] {
    std::minstd_rand rng(static_cast<unsigned>(std::random_device()()));
    for (;;) {
      std::function<void()> fn;
      {
        std::unique_lock<std::mutex> lk(s->m);
        s->cv.wait(lk, [&] { return !s->q.empty() || s->destroyed; });
        if (s->q.empty()) break;  // destroyed and drained
        fn = std::move(s->q.front());
        s->q.pop_front();
      }
      if (R->delay_us > 0) usleep(rng() % (unsigned(R->delay_us) + 1));
      fn();
      {
        std::lock_guard<std::mutex> lk(s->m);
        s->done.fetch_add(1, std::memory_order_release);
      }
      s->cv.notify_all();
    }
    std::lock_guard<std::mutex> g(R->mu);
    auto& v = R->devs[s->device].streams;
    v.erase(std::remove(v.begin(), v.end(), s), v.end());
  }).detach();
}

// Handle -> stream: 0 (and cudaStreamLegacy) is the current device's legacy
// default stream, created on first use; anything else must be live.
cudaError_t resolve(Runtime* R, cudaStream_t h, StreamP* out) {
  std::lock_guard<std::mutex> g(R->mu);
  if (h == nullptr || h == cudaStreamLegacy) {
    Device& d = R->devs[t_dev];
    if (!d.legacy) {
      auto s = std::make_shared<CUstream_st>();
      s->device = t_dev;
      s->legacy = true;
      try {
        startWorker(R, s);
      } catch (...) {
        return cudaErrorMemoryAllocation;
      }
      d.legacy = s;
      d.streams.push_back(s);
    }
    *out = d.legacy;
    return cudaSuccess;
  }
  auto it = R->streams.find(h);
  if (it == R->streams.end()) return cudaErrorInvalidResourceHandle;
  *out = it->second;
  return cudaSuccess;
}

uint64_t enqueuedOf(CUstream_st* s) {
  std::lock_guard<std::mutex> lk(s->m);
  return s->enqueued;
}

// Queues fn on s; *seq gets its position. The legacy default stream's
// implicit barriers: an item on it first waits for everything queued before
// on the device's blocking streams, and an item on a blocking stream first
// waits for everything queued before on the legacy stream. Queuing on these
// streams is serialized per device, so such waits always point at earlier
// items and cannot form a cycle. Non-blocking streams get no barrier.
cudaError_t submit(Runtime* R, const StreamP& s, std::function<void()> fn, uint64_t* seq = nullptr) {
  std::unique_lock<std::mutex> order;
  if (s->blocking) {
    Device& d = R->devs[s->device];
    order = std::unique_lock<std::mutex>(d.order);
    std::vector<std::pair<StreamP, uint64_t>> deps;
    {
      std::lock_guard<std::mutex> g(R->mu);
      for (auto& o : d.streams)
        if (o != s && o->blocking && (s->legacy || o->legacy)) {
          uint64_t t = enqueuedOf(o.get());
          if (o->done.load(std::memory_order_acquire) < t) deps.emplace_back(o, t);
        }
    }
    if (!deps.empty())
      fn = [deps = std::move(deps), inner = std::move(fn)] {
        for (auto& dep : deps) {
          const StreamP& o = dep.first;
          const uint64_t t = dep.second;
          pollUntil([&] { return o->done.load(std::memory_order_acquire) >= t; },
                    [] { return false; });
        }
        inner();
      };
  }
  {
    std::lock_guard<std::mutex> lk(s->m);
    if (s->destroyed) return cudaErrorInvalidResourceHandle;
    s->q.push_back(std::move(fn));
    ++s->enqueued;
    if (seq) *seq = s->enqueued;
  }
  s->cv.notify_all();
  return cudaSuccess;
}

void waitStream(CUstream_st* s, uint64_t target) {
  std::unique_lock<std::mutex> lk(s->m);
  s->cv.wait(lk, [&] { return s->done.load(std::memory_order_acquire) >= target; });
}

// Waits for everything queued so far on every stream of a device (what
// cudaDeviceSynchronize, and the implicit synchronization of cudaFree, do).
void syncDevice(Runtime* R, int dev) {
  std::vector<std::pair<StreamP, uint64_t>> all;
  {
    std::lock_guard<std::mutex> g(R->mu);
    for (auto& s : R->devs[dev].streams) all.emplace_back(s, enqueuedOf(s.get()));
  }
  for (auto& p : all) waitStream(p.first.get(), p.second);
}

// ---- events ------------------------------------------------------------------

cudaError_t lookupEvent(Runtime* R, cudaEvent_t h, EventP* out) {
  std::lock_guard<std::mutex> g(R->mu);
  auto it = R->events.find(h);
  if (it == R->events.end()) return cudaErrorInvalidResourceHandle;
  *out = it->second;
  return cudaSuccess;
}

// Waits until record `target` of ev completed. For an interprocess event,
// gives up (false) once the process that last recorded it is dead: its
// pending record will never complete.
bool waitEvent(const EventP& ev, uint64_t target) {
  EventState* st = ev->st;
  const bool shared = ev->flags & cudaEventInterprocess;
  return pollUntil([&] { return st->completed.load(std::memory_order_acquire) >= target; },
                   [&] {
                     const int32_t pid = st->recorder.load();
                     if (!shared || !pidDead(pid)) return false;
                     if (st->completed.load(std::memory_order_acquire) >= target) return false;
                     fprintf(stderr,
                             "tfring CUDA emulation: process %d died with an event record "
                             "pending; giving up waiting for it\n",
                             pid);
                     return true;
                   });
}

// ---- memory and IPC ------------------------------------------------------------

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

void fillHandle(char reserved[64], const HandleData& d) {
  memset(reserved, 0, 64);
  memcpy(reserved, &d, sizeof(d));
}

bool readHandle(const char reserved[64], uint32_t kind, HandleData* d) {
  memcpy(d, reserved, sizeof(*d));
  return d->magic == kMagic && d->kind == kind && d->pid > 0 && d->fd >= 0;
}

// Opens the exporter's memfd through /proc, after checking that the fd still
// is the object the handle names. -1 if the exporter (or the object) is gone.
int openExported(const HandleData& h, uint64_t min_len) {
  char path[64], link[512];
  snprintf(path, sizeof(path), "/proc/%d/fd/%d", h.pid, h.fd);
  ssize_t n = readlink(path, link, sizeof(link) - 1);
  if (n < 0) return -1;
  link[n] = 0;
  const std::string want = "/memfd:" + memfdName(h.nonce, h.gen);  // then " (deleted)"
  if (strncmp(link, want.c_str(), want.size()) != 0 || (link[want.size()] && link[want.size()] != ' '))
    return -1;
  int fd = open(path, O_RDWR | O_CLOEXEC);
  if (fd < 0) return -1;
  struct stat sb;
  if (fstat(fd, &sb) != 0 || static_cast<uint64_t>(sb.st_size) < min_len) {
    close(fd);
    return -1;
  }
  return fd;
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

// ==== the API ====================================================================

namespace tfring_emu {

cudaError_t enqueue(cudaStream_t stream, std::function<void()> work) {
  RUNTIME(R);
  StreamP s;
  if (cudaError_t e = resolve(R, stream, &s)) return ret(e);
  // CUDA: a kernel launch fails on a stream of another device than the
  // current one (copies and event waits do not).
  if (s->device != t_dev) return ret(cudaErrorInvalidResourceHandle);
  return ret(submit(R, s, std::move(work)));
}

void setLastError(cudaError_t error) { ret(error); }

}  // namespace tfring_emu

extern "C" {

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

cudaError_t cudaDeviceSynchronize(void) {
  RUNTIME(R);
  syncDevice(R, t_dev);
  return cudaSuccess;
}

// ---- memory ------------------------------------------------------------------------

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
               file_len - data_len, want};
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

// ---- streams -----------------------------------------------------------------------

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* pStream, unsigned int flags) {
  RUNTIME(R);
  if (!pStream || (flags & ~unsigned(cudaStreamNonBlocking))) return ret(cudaErrorInvalidValue);
  auto s = std::make_shared<CUstream_st>();
  s->device = t_dev;
  s->blocking = !(flags & cudaStreamNonBlocking);
  std::lock_guard<std::mutex> g(R->mu);
  try {
    startWorker(R, s);
  } catch (...) {
    return ret(cudaErrorMemoryAllocation);
  }
  R->streams.emplace(s.get(), s);
  R->devs[s->device].streams.push_back(s);
  *pStream = s.get();
  return cudaSuccess;
}

// Returns at once, like CUDA: queued work still runs, then the worker exits.
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  RUNTIME(R);
  StreamP s;
  {
    std::lock_guard<std::mutex> g(R->mu);
    auto it = R->streams.find(stream);
    if (it == R->streams.end()) return ret(cudaErrorInvalidResourceHandle);
    s = it->second;
    R->streams.erase(it);
  }
  {
    std::lock_guard<std::mutex> lk(s->m);
    s->destroyed = true;
  }
  s->cv.notify_all();
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  RUNTIME(R);
  StreamP s;
  if (cudaError_t e = resolve(R, stream, &s)) return ret(e);
  waitStream(s.get(), enqueuedOf(s.get()));
  return cudaSuccess;
}

// Waits for the event's most recent record as of this call (none: no wait),
// not for records made later, as in CUDA.
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags) {
  RUNTIME(R);
  StreamP s;
  EventP ev;
  if (cudaError_t e = resolve(R, stream, &s)) return ret(e);
  if (cudaError_t e = lookupEvent(R, event, &ev)) return ret(e);
  if (flags != 0) return ret(cudaErrorInvalidValue);
  const uint64_t target = ev->st->recorded.load(std::memory_order_acquire);
  if (target == 0) return cudaSuccess;
  return ret(submit(R, s, [ev, target] { waitEvent(ev, target); }));
}

// ---- events ------------------------------------------------------------------------

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) {
  RUNTIME(R);
  const unsigned known = cudaEventBlockingSync | cudaEventDisableTiming | cudaEventInterprocess;
  if (!event || (flags & ~known)) return ret(cudaErrorInvalidValue);
  // CUDA: interprocess events must also disable timing.
  if ((flags & cudaEventInterprocess) && !(flags & cudaEventDisableTiming))
    return ret(cudaErrorInvalidValue);
  auto ev = std::make_shared<CUevent_st>();
  ev->device = t_dev;
  ev->flags = flags;
  if (flags & cudaEventInterprocess) {
    const uint64_t gen = ++R->gen;
    ev->fd = memfd_create(memfdName(R->nonce, gen).c_str(), MFD_CLOEXEC);
    if (ev->fd < 0 || ftruncate(ev->fd, static_cast<off_t>(kPage)) != 0)
      return ret(cudaErrorMemoryAllocation);
    void* m = mmap(nullptr, kPage, PROT_READ | PROT_WRITE, MAP_SHARED, ev->fd, 0);
    if (m == MAP_FAILED) return ret(cudaErrorMemoryAllocation);
    ev->page = m;
    ev->st = new (m) EventState();
    HandleData h{kMagic, kEventHandle, getpid(), ev->fd, t_dev, 0, R->nonce, gen, kPage, 0, 0};
    fillHandle(ev->handle.reserved, h);
  }
  std::lock_guard<std::mutex> g(R->mu);
  R->events.emplace(ev.get(), ev);
  *event = ev.get();
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* event) { return cudaEventCreateWithFlags(event, 0); }

// Returns at once; pending records keep the event's state alive.
cudaError_t cudaEventDestroy(cudaEvent_t event) {
  RUNTIME(R);
  EventP ev;
  std::lock_guard<std::mutex> g(R->mu);
  auto it = R->events.find(event);
  if (it == R->events.end()) return ret(cudaErrorInvalidResourceHandle);
  ev = std::move(it->second);  // destroyed after the lock is released
  R->events.erase(it);
  return cudaSuccess;
}

// Record N is issued now (so waits and queries made from now on target it)
// and completes when the stream reaches it.
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  RUNTIME(R);
  StreamP s;
  EventP ev;
  if (cudaError_t e = resolve(R, stream, &s)) return ret(e);
  if (cudaError_t e = lookupEvent(R, event, &ev)) return ret(e);
  // CUDA: the event and the stream must belong to the same device.
  if (ev->device != s->device) return ret(cudaErrorInvalidResourceHandle);
  const uint64_t n = ev->st->recorded.fetch_add(1, std::memory_order_acq_rel) + 1;
  ev->st->recorder.store(static_cast<int32_t>(getpid()));
  cudaError_t e = submit(R, s, [ev, n] { atomicMax(ev->st->completed, n); });
  if (e != cudaSuccess) atomicMax(ev->st->completed, n);  // never queued: do not leave it pending
  return ret(e);
}

cudaError_t cudaEventQuery(cudaEvent_t event) {
  RUNTIME(R);
  EventP ev;
  if (cudaError_t e = lookupEvent(R, event, &ev)) return ret(e);
  return ev->st->completed.load(std::memory_order_acquire) >=
                 ev->st->recorded.load(std::memory_order_acquire)
             ? cudaSuccess
             : cudaErrorNotReady;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  RUNTIME(R);
  EventP ev;
  if (cudaError_t e = lookupEvent(R, event, &ev)) return ret(e);
  const uint64_t target = ev->st->recorded.load(std::memory_order_acquire);
  return waitEvent(ev, target) ? cudaSuccess : ret(cudaErrorLaunchFailure);
}

// ---- IPC ---------------------------------------------------------------------------

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
// the opening process itself with cudaErrorDeviceUninitialized.
cudaError_t cudaIpcOpenMemHandle(void** devPtr, cudaIpcMemHandle_t handle, unsigned int flags) {
  RUNTIME(R);
  if (!devPtr || flags != cudaIpcMemLazyEnablePeerAccess) return ret(cudaErrorInvalidValue);
  HandleData h;
  if (!readHandle(handle.reserved, kMemHandle, &h) || h.offset + h.size > h.file_len)
    return ret(cudaErrorInvalidResourceHandle);
  if (h.pid == getpid()) return ret(cudaErrorDeviceUninitialized);
  const std::string key(handle.reserved, sizeof(handle.reserved));
  std::lock_guard<std::mutex> g(R->mu);
  auto it = R->imports.find(key);
  if (it != R->imports.end()) {
    ++R->regions.at(it->second).refs;
    *devPtr = reinterpret_cast<void*>(it->second);
    return cudaSuccess;
  }
  int fd = openExported(h, h.file_len);
  if (fd < 0) return ret(cudaErrorMapBufferObjectFailed);
  char* map = mapWithGuard(fd, h.file_len);
  close(fd);  // the mapping keeps the memory
  if (!map) return ret(cudaErrorMapBufferObjectFailed);
  char* p = map + h.offset;
  const int dev = validDevice(R, h.device) ? h.device : t_dev;
  R->regions.emplace(reinterpret_cast<uintptr_t>(p),
                     Region{Kind::Imported, dev, h.size, map, h.file_len + kPage, -1, key, 1, {}});
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

cudaError_t cudaIpcGetEventHandle(cudaIpcEventHandle_t* handle, cudaEvent_t event) {
  RUNTIME(R);
  EventP ev;
  if (!handle) return ret(cudaErrorInvalidValue);
  if (cudaError_t e = lookupEvent(R, event, &ev)) return ret(e);
  if (!(ev->flags & cudaEventInterprocess)) return ret(cudaErrorInvalidResourceHandle);
  *handle = ev->handle;
  return cudaSuccess;
}

// The opened event aliases the exporter's shared state; like a CUDA IPC
// event it behaves as a local cudaEventDisableTiming event of the current
// device. Handles of the opening process itself are refused, as for memory.
cudaError_t cudaIpcOpenEventHandle(cudaEvent_t* event, cudaIpcEventHandle_t handle) {
  RUNTIME(R);
  if (!event) return ret(cudaErrorInvalidValue);
  HandleData h;
  if (!readHandle(handle.reserved, kEventHandle, &h)) return ret(cudaErrorInvalidResourceHandle);
  if (h.pid == getpid()) return ret(cudaErrorDeviceUninitialized);
  int fd = openExported(h, kPage);
  if (fd < 0) return ret(cudaErrorInvalidResourceHandle);
  void* m = mmap(nullptr, kPage, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (m == MAP_FAILED) return ret(cudaErrorInvalidResourceHandle);
  auto ev = std::make_shared<CUevent_st>();
  ev->device = t_dev;
  ev->flags = cudaEventDisableTiming | cudaEventInterprocess;
  ev->page = m;
  ev->st = static_cast<EventState*>(m);
  ev->handle = handle;
  std::lock_guard<std::mutex> g(R->mu);
  R->events.emplace(ev.get(), ev);
  *event = ev.get();
  return cudaSuccess;
}

}  // extern "C"
