// CUDA emulation (TFRING_WITH_CUDA=EMU): a fake NCCL, built as
// <build>/nccl/libnccl.so.2 and loaded by the product's NCCL loader only
// through TFRING_NCCL_LIB (tests/gpu_emu.sh sets it), so the product's NCCL
// backend (csrc/gpu/cuda/nccl_comm.cc) runs in CI without a GPU.
//
// It exports the functions csrc/gpu/nccl_loader.cc looks up, with NCCL's C
// ABI and enum values. It links libtfring_core.so, which a process using it
// has already loaded: the same instance (same soname), so the streams the
// product made are the streams this library queues work on.
//
// Faithful where the product depends on it:
//   - ncclCommInitRank blocks until every rank joined (120 s, then
//     ncclSystemError) and fails with ncclInvalidUsage when two ranks are on
//     one GPU (same uuid on the same host, TFRING_HOSTNAME simulating
//     hosts), as NCCL does;
//   - collectives are stream-ordered: the call queues the work on `stream`
//     and returns. On the stream's thread every rank copies its input into
//     its slot of a shared segment, waits at a barrier, computes its result
//     from all slots in rank order (so every rank gets the same bits) and
//     waits at a second barrier before the slots are reused. Large
//     collectives go in chunks of a slot. In place works;
//   - reductions: sum, prod, max, min, avg over NCCL's ten dtypes; integers
//     wrap, float16/bfloat16 are computed in float32 and rounded to nearest
//     even after every step, min/max propagate NaN (like tfring's kernels);
//   - ncclGroupStart/End defer the calls in between (nested groups counted)
//     and issue them at the outermost ncclGroupEnd, in order;
//   - a rank whose peer process died (or aborted its communicator) while it
//     waits stops waiting: its comm's async error becomes ncclRemoteError,
//     the queued work completes (skipped), and so does every later one;
//   - ncclCommAbort returns at once; ncclCommDestroy waits for the comm's
//     queued work first. Both free the comm once its work is done.
// Not emulated: speed, NCCL's algorithms and their rounding order (NCCL's
// sums are not in rank order), channels, NCCL_* environment variables.
#include <cuda_runtime_api.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/cpu/reduce.h"  // the float16/bfloat16 conversions

extern "C" {
typedef enum {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
} ncclResult_t;
typedef struct ncclComm* ncclComm_t;
typedef struct {
  char internal[128];
} ncclUniqueId;
}

namespace {

enum Dtype { kI8, kU8, kI32, kU32, kI64, kU64, kF16, kF32, kF64, kBF16, kNumDtypes };
enum Op { kSum, kProd, kMax, kMin, kAvg, kNumOps };
constexpr size_t kDtypeSize[kNumDtypes] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2};

constexpr int kMaxRanks = 64;
constexpr size_t kSlot = size_t(8) << 20;  // bytes per rank and chunk
constexpr double kJoinTimeout = 120;
constexpr char kIdMagic[8] = "tfrnccl";

double now() {
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

// ---- the last error (ncclGetLastError) ---------------------------------------

std::mutex g_err_mu;
std::string g_err;

void setError(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
void setError(const char* fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  std::lock_guard<std::mutex> lk(g_err_mu);
  g_err = buf;
}


// ---- the shared segment ------------------------------------------------------

// Its head; the ranks' slots follow at kHead. Zero-filled by ftruncate, so
// whoever comes first needs no initialization step. Lock-free atomics only.
struct Header {
  std::atomic<int32_t> joined;
  std::atomic<uint32_t> count, gen;  // the barrier: arrivals, generation
  std::atomic<int32_t> failed;       // 0, or 1 + the rank that gave up (death, abort)
  int32_t pid[kMaxRanks];
  char uuid[kMaxRanks][16];
  uint64_t host[kMaxRanks];  // hash of the rank's host identity
};
static_assert(std::atomic<uint32_t>::is_always_lock_free, "shared atomics must be lock-free");
constexpr size_t kHead = 4096;
static_assert(sizeof(Header) <= kHead, "header too big");

// The host a rank is on, as NCCL tells hosts apart (its hostHash): tests
// simulate several hosts on one machine with TFRING_HOSTNAME, as tfring's
// own host grouping does, so the fake honours it too.
uint64_t hostHash() {
  char name[256] = {0};
  const char* env = getenv("TFRING_HOSTNAME");
  if (env && *env) snprintf(name, sizeof(name), "%s", env);
  else gethostname(name, sizeof(name) - 1);
  uint64_t x = 1469598103934665603ull;  // FNV-1a
  for (const char* c = name; *c; ++c) x = (x ^ static_cast<unsigned char>(*c)) * 1099511628211ull;
  return x;
}

struct State {
  int nranks = 0, rank = 0, device = 0;
  Header* h = nullptr;
  char* map = nullptr;
  size_t map_len = 0;
  std::mutex run_mu;  // one collective at a time, whatever stream it is on
  std::atomic<int> async{ncclSuccess};
  std::atomic<bool> aborted{false};
  std::atomic<int> pending{0};  // queued collectives not finished yet
  ~State() {
    if (map) munmap(map, map_len);
  }
  char* slot(int r) const { return map + kHead + static_cast<size_t>(r) * kSlot; }
  bool broken() const { return aborted.load() || async.load() != ncclSuccess; }

  // Marks the comm failed: ncclRemoteError for every later call, and the
  // peers learn it through `failed`.
  void fail(const char* why) {
    int expected = ncclSuccess;
    if (async.compare_exchange_strong(expected, ncclRemoteError)) {
      setError("rank %d: %s (remote process exited or there was a network error)", rank, why);
      if (getenv("NCCL_DEBUG"))  // as NCCL: warnings only when asked for
        fprintf(stderr, "tfring-emu NCCL WARN rank %d: %s\n", rank, why);
    }
    int32_t zero = 0;
    h->failed.compare_exchange_strong(zero, rank + 1);
  }

  // Waits until all ranks arrive. False when a peer died or gave up, or
  // this comm was aborted: the caller then stops at once.
  bool barrier() {
    if (broken()) return false;
    const uint32_t g = h->gen.load(std::memory_order_acquire);
    if (h->count.fetch_add(1, std::memory_order_acq_rel) == static_cast<uint32_t>(nranks) - 1) {
      h->count.store(0, std::memory_order_relaxed);
      h->gen.store(g + 1, std::memory_order_release);
      return true;
    }
    for (uint64_t i = 0;; ++i) {
      if (h->gen.load(std::memory_order_acquire) != g) return true;
      if (i < 200) {
        sched_yield();
        continue;
      }
      usleep(50);
      if (i % 64) continue;
      if (aborted.load()) return false;
      if (int32_t f = h->failed.load()) {
        if (h->gen.load(std::memory_order_acquire) != g) return true;
        char why[96];
        snprintf(why, sizeof(why), "a peer (rank %d) failed or aborted", f - 1);
        fail(why);
        return false;
      }
      for (int r = 0; r < nranks; ++r)
        if (tfring_emu::processGone(h->pid[r])) {
          if (h->gen.load(std::memory_order_acquire) != g) return true;
          char why[96];
          snprintf(why, sizeof(why), "peer process %d is gone", h->pid[r]);
          fail(why);
          return false;
        }
    }
  }

  // One exchange: `bytes` of src (null: nothing) into this rank's slot, a
  // barrier, consume() reading the slots, a barrier before they are reused.
  template <class F>
  bool exchange(const char* src, size_t bytes, F consume) {
    if (src && src != slot(rank)) memcpy(slot(rank), src, bytes);
    if (!barrier()) return false;
    consume();
    return barrier();
  }
};

}  // namespace

struct ncclComm {
  std::shared_ptr<State> s;
};

namespace {

// ---- reductions ----------------------------------------------------------------

// Element access: C is the type the arithmetic runs in.
template <class S>
struct Plain {
  using C = S;
  static C get(const char* p, size_t i) {
    S v;
    memcpy(&v, p + i * sizeof(S), sizeof(S));
    return v;
  }
  static void put(char* p, size_t i, C v) { memcpy(p + i * sizeof(S), &v, sizeof(S)); }
  static C round(C v) { return v; }
};
template <float (*ToF)(uint16_t), uint16_t (*FromF)(float)>
struct Narrow {
  using C = float;
  static C get(const char* p, size_t i) {
    uint16_t b;
    memcpy(&b, p + 2 * i, 2);
    return ToF(b);
  }
  static void put(char* p, size_t i, C v) {
    uint16_t b = FromF(v);
    memcpy(p + 2 * i, &b, 2);
  }
  static C round(C v) { return ToF(FromF(v)); }
};
using Half = Narrow<tfring::kernels::halfToFloat, tfring::kernels::floatToHalf>;
using BF16 = Narrow<tfring::kernels::bf16ToFloat, tfring::kernels::floatToBf16>;

template <class C>
C combine(int op, C a, C b) {
  if constexpr (std::is_integral_v<C>) {
    using U = std::make_unsigned_t<C>;  // integers wrap
    if (op == kSum || op == kAvg) return static_cast<C>(static_cast<U>(a) + static_cast<U>(b));
    if (op == kProd) return static_cast<C>(static_cast<U>(a) * static_cast<U>(b));
  } else {
    if (op == kSum || op == kAvg) return a + b;
    if (op == kProd) return a * b;
    if (std::isnan(a)) return a;  // NaN propagates through min/max
  }
  if (op == kMax) return a > b ? a : b;
  return a < b ? a : b;
}

// dst[i] = slot0[i] op slot1[i] op ... in rank order, rounding every step.
template <class E>
void reduceSlots(const State& s, char* dst, size_t count, int op) {
  using C = typename E::C;
  for (size_t i = 0; i < count; ++i) {
    C acc = E::get(s.slot(0), i);
    for (int r = 1; r < s.nranks; ++r) acc = E::round(combine<C>(op, acc, E::get(s.slot(r), i)));
    if (op == kAvg) acc = E::round(static_cast<C>(acc / static_cast<C>(s.nranks)));
    E::put(dst, i, acc);
  }
}

void reduceSlots(const State& s, char* dst, size_t count, int dtype, int op) {
  switch (dtype) {
    case kI8: return reduceSlots<Plain<int8_t>>(s, dst, count, op);
    case kU8: return reduceSlots<Plain<uint8_t>>(s, dst, count, op);
    case kI32: return reduceSlots<Plain<int32_t>>(s, dst, count, op);
    case kU32: return reduceSlots<Plain<uint32_t>>(s, dst, count, op);
    case kI64: return reduceSlots<Plain<int64_t>>(s, dst, count, op);
    case kU64: return reduceSlots<Plain<uint64_t>>(s, dst, count, op);
    case kF16: return reduceSlots<Half>(s, dst, count, op);
    case kF32: return reduceSlots<Plain<float>>(s, dst, count, op);
    case kF64: return reduceSlots<Plain<double>>(s, dst, count, op);
    case kBF16: return reduceSlots<BF16>(s, dst, count, op);
  }
}

// ---- collectives -----------------------------------------------------------------

enum Kind { kAllReduce, kBroadcast, kReduce, kAllGather, kReduceScatter };

struct Coll {
  Kind kind;
  const char* send;
  char* recv;
  size_t count;  // allgather: per rank sent; reducescatter: per rank received
  int dtype, op, root;
};

// Reduces `count` elements of every rank's src to dst on `root` (-1: all).
bool reduceTo(State& s, const Coll& c, const char* src, char* dst, size_t count, int root) {
  const size_t es = kDtypeSize[c.dtype], per = kSlot / es;
  for (size_t off = 0; off < count; off += per) {
    const size_t n = std::min(per, count - off);
    if (!s.exchange(src + off * es, n * es, [&] {
          if (root < 0 || root == s.rank) reduceSlots(s, dst + off * es, n, c.dtype, c.op);
        }))
      return false;
  }
  return true;
}

// Runs on the stream's thread.
void run(State& s, const Coll& c) {
  std::lock_guard<std::mutex> lk(s.run_mu);
  if (s.broken()) return;  // a failed comm completes its work without doing it
  const size_t es = kDtypeSize[c.dtype], per = kSlot / es;
  const int me = s.rank;
  switch (c.kind) {
    case kAllReduce: reduceTo(s, c, c.send, c.recv, c.count, -1); return;
    case kReduce: reduceTo(s, c, c.send, c.recv, c.count, c.root); return;
    case kReduceScatter:
      for (int b = 0; b < s.nranks; ++b)
        if (!reduceTo(s, c, c.send + b * c.count * es, c.recv, c.count, b)) return;
      return;
    case kBroadcast:
      for (size_t off = 0; off < c.count; off += per) {
        const size_t n = std::min(per, c.count - off);
        if (!s.exchange(me == c.root ? c.send + off * es : nullptr, n * es,
                        [&] { memmove(c.recv + off * es, s.slot(c.root), n * es); }))
          return;
      }
      return;
    case kAllGather:
      for (size_t off = 0; off < c.count; off += per) {
        const size_t n = std::min(per, c.count - off);
        if (!s.exchange(c.send + off * es, n * es, [&] {
              for (int r = 0; r < s.nranks; ++r)
                memmove(c.recv + (r * c.count + off) * es, s.slot(r), n * es);
            }))
          return;
      }
      return;
  }
}

// Calls between ncclGroupStart and ncclGroupEnd, per thread as in NCCL.
thread_local int t_group_depth = 0;
thread_local std::vector<std::function<ncclResult_t()>> t_deferred;

// Queues c on stream (on the comm's device, like NCCL), now or at GroupEnd.
ncclResult_t issue(ncclComm_t comm, Coll c, cudaStream_t stream) {
  if (!comm || !comm->s) {
    setError("invalid communicator");
    return ncclInvalidArgument;
  }
  State& s = *comm->s;
  if (c.dtype < 0 || c.dtype >= kNumDtypes || c.op < 0 || c.op >= kNumOps ||
      (c.kind != kAllReduce && c.kind != kAllGather && c.kind != kReduceScatter &&
       (c.root < 0 || c.root >= s.nranks)) ||
      (c.count && (!c.send || !c.recv))) {
    setError("invalid argument: dtype %d, op %d, root %d, count %zu", c.dtype, c.op, c.root,
             c.count);
    return ncclInvalidArgument;
  }
  std::shared_ptr<State> st = comm->s;
  auto go = [st, c, stream]() -> ncclResult_t {
    if (c.count == 0) return ncclSuccess;
    int prev = st->device;
    cudaGetDevice(&prev);
    if (prev != st->device) cudaSetDevice(st->device);
    st->pending.fetch_add(1);
    cudaError_t e = tfring_emu::enqueue(stream, [st, c] {
      run(*st, c);
      st->pending.fetch_sub(1);
    });
    if (prev != st->device) cudaSetDevice(prev);
    if (e == cudaSuccess) return ncclSuccess;
    st->pending.fetch_sub(1);
    setError("Cuda failure '%s' queuing a collective", cudaGetErrorString(e));
    return ncclUnhandledCudaError;
  };
  if (t_group_depth > 0) {
    t_deferred.push_back(go);
    return ncclSuccess;
  }
  return go();
}

}  // namespace

// ---- the API ---------------------------------------------------------------------

extern "C" {

ncclResult_t ncclGetVersion(int* version) {
  if (!version) return ncclInvalidArgument;
  *version = 22703;  // 2.27.3
  return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  if (!id) return ncclInvalidArgument;
  uint8_t tag[16];
  if (getrandom(tag, sizeof(tag), 0) != static_cast<ssize_t>(sizeof(tag))) {
    setError("getrandom failed: %s", strerror(errno));
    return ncclSystemError;
  }
  memset(id, 0, sizeof(*id));
  memcpy(id->internal, kIdMagic, sizeof(kIdMagic));
  char* name = id->internal + sizeof(kIdMagic);
  int at = snprintf(name, 32, "/tfring-nccl-%d-", static_cast<int>(getpid()));
  for (uint8_t b : tag) at += snprintf(name + at, 3, "%02x", b);
  return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t* out, int nranks, ncclUniqueId id, int rank) {
  if (!out) return ncclInvalidArgument;
  *out = nullptr;
  if (nranks < 1 || nranks > kMaxRanks || rank < 0 || rank >= nranks ||
      memcmp(id.internal, kIdMagic, sizeof(kIdMagic)) != 0) {
    setError("invalid argument: nranks %d, rank %d, or not a unique id", nranks, rank);
    return ncclInvalidArgument;
  }
  auto st = std::make_shared<State>();
  st->nranks = nranks;
  st->rank = rank;
  cudaDeviceProp prop;
  if (cudaGetDevice(&st->device) != cudaSuccess ||
      cudaGetDeviceProperties(&prop, st->device) != cudaSuccess) {
    setError("Cuda failure: no current device");
    return ncclUnhandledCudaError;
  }
  std::string name(id.internal + sizeof(kIdMagic), strnlen(id.internal + sizeof(kIdMagic), 64));
  // Every rank creates or opens the segment and sizes it the same: the
  // first ftruncate zero-fills it, the others change nothing.
  int fd = shm_open(name.c_str(), O_CREAT | O_RDWR, 0600);
  st->map_len = kHead + static_cast<size_t>(nranks) * kSlot;
  if (fd < 0 || ftruncate(fd, static_cast<off_t>(st->map_len)) != 0) {
    setError("shm_open/ftruncate %s failed: %s", name.c_str(), strerror(errno));
    if (fd >= 0) close(fd);
    return ncclSystemError;
  }
  void* p = mmap(nullptr, st->map_len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) {
    setError("mmap failed: %s", strerror(errno));
    return ncclSystemError;
  }
  st->map = static_cast<char*>(p);
  Header* h = st->h = reinterpret_cast<Header*>(p);
  h->pid[rank] = getpid();
  memcpy(h->uuid[rank], prop.uuid.bytes, 16);
  h->host[rank] = hostHash();
  // The last to join unlinks the name: everyone has it mapped by then.
  if (h->joined.fetch_add(1, std::memory_order_acq_rel) == nranks - 1) shm_unlink(name.c_str());
  const double deadline = now() + kJoinTimeout;
  while (h->joined.load(std::memory_order_acquire) < nranks) {
    if (now() > deadline) {
      shm_unlink(name.c_str());
      setError("rank %d: timed out after %.0f s waiting for %d of %d ranks to join", rank,
               kJoinTimeout, nranks - h->joined.load(), nranks);
      return ncclSystemError;
    }
    usleep(1000);
  }
  for (int r = 0; r < nranks; ++r)
    if (r != rank && h->host[r] == h->host[rank] && memcmp(h->uuid[r], h->uuid[rank], 16) == 0) {
      setError("Duplicate GPU detected : rank %d and rank %d both on CUDA device %d",
               std::min(r, rank), std::max(r, rank), st->device);
      return ncclInvalidUsage;
    }
  *out = new ncclComm{std::move(st)};
  return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (!comm) return ncclSuccess;
  State& s = *comm->s;
  s.aborted.store(true);  // its waits end; peers see `failed` and end theirs
  int32_t zero = 0;
  s.h->failed.compare_exchange_strong(zero, s.rank + 1);
  delete comm;  // the state goes with the last queued collective
  return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (!comm) return ncclSuccess;
  while (comm->s->pending.load() > 0) usleep(200);  // NCCL finalizes: waits for its work
  delete comm;
  return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* err) {
  if (!comm || !err) return ncclInvalidArgument;
  *err = static_cast<ncclResult_t>(comm->s->async.load());
  return ncclSuccess;
}

const char* ncclGetErrorString(ncclResult_t r) {
  switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
  }
  return "unknown result code";
}

const char* ncclGetLastError(ncclComm_t) {
  thread_local std::string copy;
  std::lock_guard<std::mutex> lk(g_err_mu);
  copy = g_err;
  return copy.c_str();
}

ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, int dtype, int op,
                           ncclComm_t comm, cudaStream_t stream) {
  return issue(comm, {kAllReduce, static_cast<const char*>(send), static_cast<char*>(recv), count,
                      dtype, op, -1},
               stream);
}

ncclResult_t ncclBroadcast(const void* send, void* recv, size_t count, int dtype, int root,
                           ncclComm_t comm, cudaStream_t stream) {
  return issue(comm, {kBroadcast, static_cast<const char*>(send), static_cast<char*>(recv), count,
                      dtype, kSum, root},
               stream);
}

ncclResult_t ncclReduce(const void* send, void* recv, size_t count, int dtype, int op, int root,
                        ncclComm_t comm, cudaStream_t stream) {
  return issue(comm, {kReduce, static_cast<const char*>(send), static_cast<char*>(recv), count,
                      dtype, op, root},
               stream);
}

ncclResult_t ncclAllGather(const void* send, void* recv, size_t send_count, int dtype,
                           ncclComm_t comm, cudaStream_t stream) {
  return issue(comm, {kAllGather, static_cast<const char*>(send), static_cast<char*>(recv),
                      send_count, dtype, kSum, -1},
               stream);
}

ncclResult_t ncclReduceScatter(const void* send, void* recv, size_t recv_count, int dtype, int op,
                               ncclComm_t comm, cudaStream_t stream) {
  return issue(comm, {kReduceScatter, static_cast<const char*>(send), static_cast<char*>(recv),
                      recv_count, dtype, op, -1},
               stream);
}

ncclResult_t ncclGroupStart() {
  ++t_group_depth;
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd() {
  if (t_group_depth == 0) {
    setError("ncclGroupEnd: not in a group");
    return ncclInvalidUsage;
  }
  if (--t_group_depth > 0) return ncclSuccess;
  std::vector<std::function<ncclResult_t()>> calls;
  calls.swap(t_deferred);
  ncclResult_t first = ncclSuccess;
  for (auto& f : calls) {
    ncclResult_t r = f();
    if (first == ncclSuccess) first = r;
  }
  return first;
}

}  // extern "C"
