// CUDA emulation: streams, events and their synchronization. Each stream is
// a worker thread running its queue in order (after a random delay of up to
// TFRING_EMU_DELAY_US per item, to expose missing synchronization); the
// legacy default stream orders with blocking streams only. Events count
// records and completions; interprocess events keep those counts in a shared
// memfd page, so processes order their streams through them. Kernel launches
// reach a stream through tfring_emu::enqueue. See state.h.
#include <sched.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <new>
#include <random>
#include <thread>

#include "state.h"

namespace tfring_emu {
namespace detail {
namespace {

void atomicMax(std::atomic<uint64_t>& a, uint64_t v) {
  uint64_t cur = a.load(std::memory_order_relaxed);
  while (cur < v && !a.compare_exchange_weak(cur, v, std::memory_order_acq_rel)) {
  }
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

// TFRING_EMU_QUEUES=N: streams are aliased onto N hardware queues per
// device, round robin in the order they are made, as CUDA maps them onto
// CUDA_DEVICE_MAX_CONNECTIONS queues. Called under R->mu.
void assignQueue(Runtime* R, CUstream_st* s) {
  if (R->queues <= 0) return;
  Device& d = R->devs[s->device];
  if (d.queues.empty())
    for (int i = 0; i < R->queues; ++i) d.queues.push_back(std::make_shared<EmuQueue>());
  s->hw = d.queues[d.created++ % d.queues.size()];
}

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

uint64_t enqueuedOf(CUstream_st* s) {
  std::lock_guard<std::mutex> lk(s->m);
  return s->enqueued;
}

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
                     if (!shared || !processGone(pid)) return false;
                     if (st->completed.load(std::memory_order_acquire) >= target) return false;
                     fprintf(stderr,
                             "tfring CUDA emulation: process %d died with an event record "
                             "pending; giving up waiting for it\n",
                             pid);
                     return true;
                   });
}

}  // namespace

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
      assignQueue(R, s.get());
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

// Queues fn on s; *seq gets its position. The legacy default stream's
// implicit barriers: an item on it first waits for everything queued before
// on the device's blocking streams, and an item on a blocking stream first
// waits for everything queued before on the legacy stream. Queuing on these
// streams is serialized per device, so such waits always point at earlier
// items and cannot form a cycle. Non-blocking streams get no barrier.
cudaError_t submit(Runtime* R, const StreamP& s, std::function<void()> fn, uint64_t* seq) {
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
    if (s->hw) {
      // A shared hardware queue: this item runs after every item queued
      // on it before, whichever stream it came from.
      const uint64_t ticket = s->hw->next.fetch_add(1);
      fn = [hw = s->hw, ticket, inner = std::move(fn)] {
        pollUntil([&] { return hw->serving.load(std::memory_order_acquire) == ticket; },
                  [] { return false; });
        inner();
        hw->serving.store(ticket + 1, std::memory_order_release);
      };
    }
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

}  // namespace detail
}  // namespace tfring_emu

using namespace tfring_emu::detail;

bool tfring_emu::processGone(int32_t pid) {
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

cudaError_t tfring_emu::enqueue(cudaStream_t stream, std::function<void()> work) {
  RUNTIME(R);
  StreamP s;
  if (cudaError_t e = resolve(R, stream, &s)) return ret(e);
  // CUDA: a kernel launch fails on a stream of another device than the
  // current one (copies and event waits do not).
  if (s->device != t_dev) return ret(cudaErrorInvalidResourceHandle);
  return ret(submit(R, s, std::move(work)));
}

extern "C" {

// ---- streams -----------------------------------------------------------------------

// Unlike a launch, allowed on a stream of another device than the current.
cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void* userData) {
  RUNTIME(R);
  if (!fn) return ret(cudaErrorInvalidValue);
  StreamP s;
  if (cudaError_t e = resolve(R, stream, &s)) return ret(e);
  return ret(submit(R, s, [fn, userData] { fn(userData); }));
}

// Priorities do not change the emulation's scheduling: one worker thread
// per stream. The range is the one real GPUs report (0 lowest, -5 highest).
cudaError_t cudaDeviceGetStreamPriorityRange(int* leastPriority, int* greatestPriority) {
  if (leastPriority) *leastPriority = 0;
  if (greatestPriority) *greatestPriority = -5;
  return cudaSuccess;
}

cudaError_t cudaStreamCreateWithPriority(cudaStream_t* pStream, unsigned int flags, int priority) {
  if (priority > 0 || priority < -5) return cudaErrorInvalidValue;
  return cudaStreamCreateWithFlags(pStream, flags);
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* pStream, unsigned int flags) {
  RUNTIME(R);
  if (!pStream || (flags & ~unsigned(cudaStreamNonBlocking))) return ret(cudaErrorInvalidValue);
  auto s = std::make_shared<CUstream_st>();
  s->device = t_dev;
  s->blocking = !(flags & cudaStreamNonBlocking);
  std::lock_guard<std::mutex> g(R->mu);
  assignQueue(R, s.get());
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

cudaError_t cudaStreamQuery(cudaStream_t stream) {
  RUNTIME(R);
  StreamP s;
  if (cudaError_t e = resolve(R, stream, &s)) return ret(e);
  return s->done.load(std::memory_order_acquire) >= enqueuedOf(s.get()) ? cudaSuccess
                                                                        : cudaErrorNotReady;
}

cudaError_t cudaDeviceSynchronize(void) {
  RUNTIME(R);
  syncDevice(R, t_dev);
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

// The emulation's cuStreamWaitValue32 (CU_STREAM_WAIT_VALUE_GEQ only): the
// stream's later work waits until the 32-bit word at addr (host memory or
// a device allocation; one address space here) is at least `value`,
// polled as a GPU-side wait would.
int tfring_emu_stream_wait_value32(void* stream, unsigned long long addr, uint32_t value,
                                   unsigned flags) {
  RUNTIME(R);
  StreamP s;
  if (!addr || flags != 0) return cudaErrorInvalidValue;
  if (cudaError_t e = resolve(R, static_cast<cudaStream_t>(stream), &s)) return e;
  auto* word = reinterpret_cast<const uint32_t*>(static_cast<uintptr_t>(addr));
  return submit(R, s, [word, value] {
    pollUntil([&] { return __atomic_load_n(word, __ATOMIC_ACQUIRE) >= value; },
              [] { return false; });
  });
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

// ---- IPC events --------------------------------------------------------------------

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
