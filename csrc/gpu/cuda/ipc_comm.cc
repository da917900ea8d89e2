// IpcRingComm: the ring collectives between GPUs of one host through CUDA
// IPC, with the pull protocol of gpu/pull_ring.h. Allreduces up to
// TFRING_GPU_TWOSHOT_MAX go to the one-shot/two-shot peer allreduce instead
// (gpu/cuda/peer_allreduce.h), which it creates beside the ring. Several ranks may share a
// GPU (each process maps the others' memory through IPC all the same);
// ranks on different GPUs need peer access between them.
//
// Each rank owns a small control block in POSIX shared memory (created by
// it, mapped by both neighbours, unlinked once mapped): its pull counters,
// the IPC handles of its unit events and done event, and, per collective,
// the IPC handle and offset of the buffer the right neighbour should read.
// That buffer is the tensor itself when its allocation can be exported
// (cudaMalloc memory, e.g. CuPy's or PyTorch's pools) and a staging copy in
// a buffer of ours otherwise (stream-ordered or virtual-memory allocations).
// Mapped allocations are cached, since opening one costs far more than a
// collective step: by (peer, allocation base, size) in the peer's address
// space, checked against the handle. A peer may free an allocation and
// reuse its range (a memory pool growing a chunk, a tensor freed and
// another allocated), and CUDA refuses to map an allocation overlapping one
// still mapped from that peer (cudaErrorAlreadyMapped), so a new export
// drops every cached mapping it overlaps. Should the driver still refuse,
// every mapping of that peer is dropped and the open retried once; if that
// fails too, the neighbour is asked (through our control block) to stage
// its buffers in its own staging area from the next collective on.
#include <cuda_runtime_api.h>

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <new>
#include <random>

#include "collectives/ring.h"
#include "common/logging.h"
#include "gpu/cuda/comm.h"
#include "gpu/cuda/cuda_util.h"
#include "gpu/cuda/peer_allreduce.h"
#include "gpu/pull_ring.h"
#include "kernels/cuda/kernels.h"
#include "transport/ring_links.h"
#include "transport/shm/shm_channel.h"

namespace tfring {
namespace gpu {

namespace {

constexpr int kEvents = 64;
constexpr size_t kMaxImports = 16;

struct CtlBlock {
  PullCounters counters;
  cudaIpcEventHandle_t events[kEvents];  // my unit events, slot = unit % kEvents
  cudaIpcEventHandle_t done_event;
  cudaIpcMemHandle_t probe;  // setup: a small buffer the right reads once
  char pci_bus_id[32];
  // The buffer of the collective counters.desc_epoch names.
  cudaIpcMemHandle_t mem;
  uint64_t offset;
  uint64_t remote_base;  // the allocation's address in its owner's process
  uint64_t remote_size;  // and its size
  // Set by the right neighbour when it could not map our buffer: from then
  // on we hand it our staging buffer, whose mapping it keeps.
  std::atomic<int32_t> refuse_user_buffers{0};
};

bool sameHandle(const cudaIpcMemHandle_t& a, const cudaIpcMemHandle_t& b) {
  return memcmp(&a, &b, sizeof(a)) == 0;
}

class IpcRingComm;

// PullDevice on one stream: IPC event waits/records, reduce kernels and
// copies reading the left neighbour's mapped buffer.
class IpcDevice : public PullDevice {
 public:
  IpcDevice(cudaStream_t s, cudaEvent_t* mine, cudaEvent_t* left, cudaEvent_t done,
            cudaEvent_t right_done, char* buf, const char* left_buf, DataType dt, ReduceOp op)
      : s_(s), mine_(mine), left_(left), done_(done), right_done_(right_done), buf_(buf),
        left_buf_(left_buf), dt_(dt), op_(op) {}
  void waitLeft(uint64_t unit) override {
    TFRING_CUDA_CHECK(cudaStreamWaitEvent(s_, left_[unit % kEvents], 0));
  }
  void record(uint64_t unit) override {
    TFRING_CUDA_CHECK(cudaEventRecord(mine_[unit % kEvents], s_));
  }
  void reduce(size_t off, size_t bytes, double scale) override {
    kernels::cuda::reduce(buf_ + off, buf_ + off, left_buf_ + off, bytes / dtypeSize(dt_), dt_,
                          op_, scale, s_);
  }
  void copy(size_t off, size_t bytes) override {
    TFRING_CUDA_CHECK(
        cudaMemcpyAsync(buf_ + off, left_buf_ + off, bytes, cudaMemcpyDefault, s_));
  }
  void recordDone() override { TFRING_CUDA_CHECK(cudaEventRecord(done_, s_)); }
  void waitRightDone() override { TFRING_CUDA_CHECK(cudaStreamWaitEvent(s_, right_done_, 0)); }

 private:
  cudaStream_t s_;
  cudaEvent_t* mine_;
  cudaEvent_t* left_;
  cudaEvent_t done_, right_done_;
  char* buf_;
  const char* left_buf_;
  DataType dt_;
  ReduceOp op_;
};

class IpcRingComm : public GpuComm {
 public:
  static std::unique_ptr<GpuComm> create(const CommContext& ctx, std::string* why);
  ~IpcRingComm() override;
  std::string name() const override { return "ring-ipc"; }

  void allreduce(void* data, size_t count, DataType dt, ReduceOp op, double post) override {
    if (count == 0) return;
    const size_t es = dtypeSize(dt), bytes = count * es;
    if (peer_) {
      const PeerAlgo a = peer_->choose(bytes);
      if (a != PeerAlgo::kRing) return peer_->allreduce(a, data, data, count, dt, op, 1.0, post);
    }
    if (staged_ && bytes <= staged_max_) {
      countPeerAlgo(c_.host.comm->stats.get(), PeerAlgo::kStaged);
      return staged_->allreduce(data, count, dt, op, post);
    }
    countPeerAlgo(c_.host.comm->stats.get(), PeerAlgo::kRing);
    const int n = n_;
    char* buf = begin(data, bytes, true);
    run([=](int p) { return pullAllreduce(n, p, count, es, post); }, buf, es, dt, op,
        "allreduce");
    end(data, buf, 0, bytes);
  }

  void allgather(void* out, const std::vector<size_t>& rank_bytes) override {
    size_t total = 0, mine = 0;
    for (int r = 0; r < n_; ++r) {
      if (r < me_) mine += rank_bytes[r];
      total += rank_bytes[r];
    }
    if (total == 0) return;
    char* buf = begin(out, total, false);
    if (buf != out && rank_bytes[me_])
      TFRING_CUDA_CHECK(cudaMemcpyAsync(buf + mine, static_cast<char*>(out) + mine,
                                        rank_bytes[me_], cudaMemcpyDeviceToDevice, c_.stream));
    const int n = n_;
    const std::vector<int> ring = c_.host.topo->ring;
    run([=](int p) { return pullAllgather(n, p, ring, rank_bytes); }, buf, 1, DataType::kUInt8,
        ReduceOp::kSum, "allgather");
    end(out, buf, 0, total);
  }

  void broadcast(void* data, size_t bytes, int root) override {
    if (bytes == 0) return;
    char* buf = begin(data, bytes, me_ == root);
    const int n = n_;
    int root_pos = 0;
    for (int i = 0; i < n; ++i)
      if (c_.host.topo->ring[i] == root) root_pos = i;
    run([=](int p) { return pullBroadcast(n, p, root_pos, bytes); }, buf, 1, DataType::kUInt8,
        ReduceOp::kSum, "broadcast");
    if (me_ != root) end(data, buf, 0, bytes);
  }

  bool allreduceFrom(const void* in, void* out, size_t count, DataType dt, ReduceOp op,
                     double pre, double post) override {
    if (!peer_ || count == 0) return false;
    const PeerAlgo a = peer_->choose(count * dtypeSize(dt));
    if (a == PeerAlgo::kRing) return false;
    peer_->allreduce(a, in, out, count, dt, op, pre, post);
    return true;
  }

  void poll() override {
    if (peer_) peer_->poll();
  }
  void abort() override {
    if (peer_) peer_->abort();
  }

  void reducescatter(void* work, const std::vector<size_t>& counts, DataType dt, ReduceOp op,
                     double post) override {
    const size_t es = dtypeSize(dt);
    size_t total = 0, mine = 0;
    for (int r = 0; r < n_; ++r) {
      if (r < me_) mine += counts[r];
      total += counts[r];
    }
    if (total == 0) return;
    char* buf = begin(work, total * es, true);
    const int n = n_;
    const std::vector<int> ring = c_.host.topo->ring;
    run([=](int p) { return pullReducescatter(n, p, ring, counts, es, post); }, buf, es, dt, op,
        "reducescatter");
    end(work, buf, mine * es, counts[me_] * es);
  }

 private:
  explicit IpcRingComm(const CommContext& c) : c_(c) {
    const transport::Topology& T = *c.host.topo;
    n_ = T.size;
    me_ = T.rank;
    pos_ = T.ring_pos;
    left_rank_ = T.left;
    right_rank_ = T.right;
  }

  int label(int place) const { return c_.host.labels(place); }  // for messages
  void createOwn(const std::string& job);
  void openPeers(const std::string& job);
  void probeLeft();

  // Picks the buffer the right neighbour will read (the tensor, or our
  // staging copy of it) and publishes it for this collective.
  char* begin(void* data, size_t bytes, bool copy_in) {
    void* base = nullptr;
    size_t size = 0;
    cudaIpcMemHandle_t h;
    char* buf = static_cast<char*>(data);
    bool exported = c_.cfg.ipc_user_buffers &&
                    !right_->refuse_user_buffers.load(std::memory_order_acquire) &&
                    allocationRange(data, &base, &size) &&
                    cudaIpcGetMemHandle(&h, base) == cudaSuccess;
    if (!exported) {
      cudaGetLastError();  // not sticky; clear it
      buf = work_.reserve(bytes);
      TFRING_CUDA_CHECK(allocationRange(buf, &base, &size) ? cudaSuccess : cudaErrorInvalidValue,
                        "finding the staging buffer's allocation");
      TFRING_CUDA_CHECK(cudaIpcGetMemHandle(&h, base), "exporting the staging buffer");
      if (copy_in && bytes)
        TFRING_CUDA_CHECK(
            cudaMemcpyAsync(buf, data, bytes, cudaMemcpyDeviceToDevice, c_.stream));
    }
    self_->mem = h;
    self_->offset = static_cast<uint64_t>(buf - static_cast<char*>(base));
    self_->remote_base = reinterpret_cast<uint64_t>(base);
    self_->remote_size = size;
    self_->counters.desc_epoch.store(state_.epoch + 1, std::memory_order_release);
    return buf;
  }

  // Copies the result back out of the staging buffer, if one was used.
  void end(void* data, char* buf, size_t off, size_t bytes) {
    if (buf != data && bytes)
      TFRING_CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(data) + off, buf + off, bytes,
                                        cudaMemcpyDeviceToDevice, c_.stream));
  }

  const char* leftBuffer(const Deadline& deadline) {
    const uint64_t want = state_.epoch + 1;
    waitForPeer([&] { return left_->counters.desc_epoch.load(std::memory_order_acquire) >= want; },
                deadline, left_rank_, left_->counters.pid, "GPU ring setup",
                c_.host.comm->abort, &c_.host.labels);
    char* base = static_cast<char*>(import(left_->mem, left_->remote_base, left_->remote_size));
    return base + left_->offset;
  }

  void closeImport(size_t i) {
    cudaIpcCloseMemHandle(imports_[i].ptr);
    imports_.erase(imports_.begin() + i);
  }

  // The left's allocation [remote_base, +size) mapped here, from the cache
  // when it holds that allocation (same range, same handle).
  void* import(const cudaIpcMemHandle_t& h, uint64_t remote_base, uint64_t size) {
    ++use_;
    for (size_t i = 0; i < imports_.size();) {
      Import& im = imports_[i];
      if (im.peer == left_rank_ && im.remote_base == remote_base && im.size == size &&
          sameHandle(im.handle, h)) {
        im.last_use = use_;
        return im.ptr;
      }
      // Overlapping a new export: the allocation it maps was freed and its
      // range reused.
      if (im.peer == left_rank_ && im.remote_base < remote_base + size &&
          remote_base < im.remote_base + im.size)
        closeImport(i);
      else
        ++i;
    }
    if (imports_.size() >= kMaxImports) {
      size_t lru = 0;
      for (size_t i = 1; i < imports_.size(); ++i)
        if (imports_[i].last_use < imports_[lru].last_use) lru = i;
      closeImport(lru);
    }
    void* p = nullptr;
    cudaError_t e = cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess);
    if (e == cudaErrorAlreadyMapped) {
      cudaGetLastError();
      for (size_t i = 0; i < imports_.size();) {
        if (imports_[i].peer == left_rank_)
          closeImport(i);
        else
          ++i;
      }
      e = cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess);
    }
    if (e != cudaSuccess) {
      self_->refuse_user_buffers.store(1, std::memory_order_release);
      cudaGetLastError();
      cudaFail(e, "cudaIpcOpenMemHandle",
               strCat("mapping the buffer of rank ", label(left_rank_),
                      " (it will stage its buffers from the next collective on; "
                      "TFRING_GPU_IPC_USER_BUFFERS=0 does so from the start)"));
    }
    imports_.push_back({left_rank_, remote_base, size, h, p, use_});
    return p;
  }

  void run(std::function<PullProgram(int)> program, char* buf, size_t esize, DataType dt,
           ReduceOp op, const char* what) {
    const Deadline deadline = Deadline::in(c_.host.timeout_s);
    const char* left = leftBuffer(deadline);
    PullRun r;
    r.program = std::move(program);
    r.n = n_;
    r.pos = pos_;
    r.left_rank = left_rank_;
    r.right_rank = right_rank_;
    r.labels = &c_.host.labels;
    r.esize = esize;
    r.chunk_bytes = c_.cfg.chunk_bytes > 0 ? static_cast<size_t>(c_.cfg.chunk_bytes)
                    : c_.one_gpu            ? (size_t(1) << 40)
                                            : (size_t(4) << 20);
    r.num_events = kEvents;
    r.self = &self_->counters;
    r.left = &left_->counters;
    r.right = &right_->counters;
    r.timeout_s = c_.host.timeout_s;
    r.what = what;
    r.abort = c_.host.comm->abort;
    IpcDevice dev(c_.stream, events_, left_events_, done_, right_done_, buf, left, dt, op);
    runPull(r, dev, state_);
  }

  struct Import {
    int peer;
    uint64_t remote_base;  // the allocation in the peer's address space
    uint64_t size;
    cudaIpcMemHandle_t handle;
    void* ptr;
    uint64_t last_use;
  };

  CommContext c_;
  int n_ = 1, me_ = 0, pos_ = 0, left_rank_ = 0, right_rank_ = 0;
  std::unique_ptr<transport::ShmSegment> self_seg_, left_seg_, right_seg_;
  CtlBlock* self_ = nullptr;
  CtlBlock* left_ = nullptr;
  CtlBlock* right_ = nullptr;
  cudaEvent_t events_[kEvents] = {};
  cudaEvent_t done_ = nullptr;
  cudaEvent_t left_events_[kEvents] = {};
  cudaEvent_t right_done_ = nullptr;
  void* probe_ = nullptr;
  PullState state_;
  DeviceBuffer work_;
  std::vector<Import> imports_;
  uint64_t use_ = 0;
  std::unique_ptr<PeerAllreduce> peer_;  // one-shot/two-shot, when usable
  std::unique_ptr<GpuComm> staged_;      // time-sliced ranks: small allreduces via host
  size_t staged_max_ = 0;
};

void IpcRingComm::createOwn(const std::string& job) {
  self_seg_ = transport::ShmSegment::create(job, me_, sizeof(CtlBlock));
  self_ = new (self_seg_->data()) CtlBlock();
  self_->counters.pid = static_cast<int32_t>(::getpid());
  self_->counters.rank = me_;
  const unsigned flags = cudaEventDisableTiming | cudaEventInterprocess;
  for (int i = 0; i < kEvents; ++i) {
    TFRING_CUDA_CHECK(cudaEventCreateWithFlags(&events_[i], flags));
    TFRING_CUDA_CHECK(cudaIpcGetEventHandle(&self_->events[i], events_[i]));
  }
  TFRING_CUDA_CHECK(cudaEventCreateWithFlags(&done_, flags));
  TFRING_CUDA_CHECK(cudaIpcGetEventHandle(&self_->done_event, done_));
  TFRING_CUDA_CHECK(cudaDeviceGetPCIBusId(self_->pci_bus_id, sizeof(self_->pci_bus_id),
                                          c_.device));
  // The probe: 256 bytes of (rank % 251) + 1 that the right reads back.
  TFRING_CUDA_CHECK(cudaMalloc(&probe_, 256));
  cudaStream_t setup = setupStream(c_.device);
  TFRING_CUDA_CHECK(cudaMemsetAsync(probe_, (me_ % 251) + 1, 256, setup));
  TFRING_CUDA_CHECK(cudaStreamSynchronize(setup));
  TFRING_CUDA_CHECK(cudaIpcGetMemHandle(&self_->probe, probe_));
}

void IpcRingComm::openPeers(const std::string& job) {
  left_seg_ = transport::ShmSegment::open(job, left_rank_, false, label(left_rank_));
  left_ = reinterpret_cast<CtlBlock*>(left_seg_->data());
  if (right_rank_ == left_rank_) {
    right_ = left_;
  } else {
    right_seg_ = transport::ShmSegment::open(job, right_rank_, false, label(right_rank_));
    right_ = reinterpret_cast<CtlBlock*>(right_seg_->data());
  }
  for (int i = 0; i < kEvents; ++i)
    TFRING_CUDA_CHECK(cudaIpcOpenEventHandle(&left_events_[i], left_->events[i]),
                      "opening an event of rank ", label(left_rank_));
  TFRING_CUDA_CHECK(cudaIpcOpenEventHandle(&right_done_, right_->done_event),
                    "opening an event of rank ", label(right_rank_));
}

// Kernels read the left's memory directly: that needs the same GPU, or a GPU
// this one has peer access to.
void IpcRingComm::probeLeft() {
  int left_dev = -1;
  cudaError_t e = cudaDeviceGetByPCIBusId(&left_dev, left_->pci_bus_id);
  if (e != cudaSuccess) {
    cudaGetLastError();
    fail(Code::kUnavailable, "the GPU of rank ", label(left_rank_), " (", left_->pci_bus_id,
         ") is not visible to rank ", label(me_), " (CUDA_VISIBLE_DEVICES)");
  }
  if (left_dev != c_.device) {
    int can = 0;
    TFRING_CUDA_CHECK(cudaDeviceCanAccessPeer(&can, c_.device, left_dev));
    if (!can)
      fail(Code::kUnavailable, "GPU ", c_.device, " of rank ", label(me_),
           " has no peer access to the GPU of rank ", label(left_rank_), " (",
           left_->pci_bus_id, ")");
  }
  void* p = nullptr;
  TFRING_CUDA_CHECK(cudaIpcOpenMemHandle(&p, left_->probe, cudaIpcMemLazyEnablePeerAccess),
                    "mapping a buffer of rank ", label(left_rank_));
  unsigned char got = 0;
  cudaStream_t setup = setupStream(c_.device);
  e = cudaMemcpyAsync(&got, p, 1, cudaMemcpyDeviceToHost, setup);
  if (e == cudaSuccess) e = cudaStreamSynchronize(setup);
  cudaIpcCloseMemHandle(p);
  TFRING_CUDA_CHECK(e, "reading a buffer of rank ", label(left_rank_));
  if (got != (left_rank_ % 251) + 1)
    fail(Code::kUnavailable, "read ", int(got), " from rank ", label(left_rank_),
         "'s probe buffer, expected ", (left_rank_ % 251) + 1);
}

std::unique_ptr<GpuComm> IpcRingComm::create(const CommContext& ctx, std::string* why) {
  std::unique_ptr<IpcRingComm> r(new IpcRingComm(ctx));
  uint64_t tag = 0;
  if (r->me_ == 0) tag = (static_cast<uint64_t>(std::random_device()()) << 32) ^ std::random_device()();
  hostBroadcast(ctx.host, &tag, sizeof(tag));
  // Control blocks are named /tfring-gpu-<tag>-r<rank>; rank 0 draws the tag.
  char name[48];
  snprintf(name, sizeof(name), "gpu-%016llx", static_cast<unsigned long long>(tag));
  const std::string job = name;
  r->createOwn(job);
  char one = 1;
  hostAllgather(ctx.host, &one, 1);  // barrier: every block exists

  constexpr size_t kRec = 256;
  char rec[kRec] = {0};
  try {
    r->openPeers(job);
    r->probeLeft();
    rec[0] = 1;
  } catch (const Error& e) {
    rec[0] = 0;
    snprintf(rec + 1, kRec - 1, "%s", e.what());
  }
  std::vector<char> all = hostAllgather(ctx.host, rec, kRec);  // also: everyone has mapped
  r->self_seg_->unlink();
  // The probe stays allocated until teardown: cudaFree would synchronize
  // the whole device, a stream held by a gate included.
  for (int q = 0; q < r->n_; ++q) {
    const char* p = all.data() + q * kRec;
    if (!p[0]) {
      *why = strCat("CUDA IPC does not work for rank ", ctx.host.labels(q), ": ",
                    std::string(p + 1));
      return nullptr;
    }
  }
  // The same-host peer allreduces (collective; identical outcome everywhere).
  std::string peer_why;
  size_t staged_max = 0;
  r->peer_ = PeerAllreduce::create(ctx, &peer_why, &staged_max);
  if (staged_max > 0) {
    r->staged_ = makeHostRingComm(ctx);
    r->staged_max_ = staged_max;
  }
  if (!r->peer_ && r->me_ == 0 && ctx.cfg.allreduce_algo != "ring")
    TFRING_LOG(kInfo, "GPU allreduce: ring only (", peer_why, ")");
  return std::unique_ptr<GpuComm>(r.release());
}

IpcRingComm::~IpcRingComm() {
  peer_.reset();
  staged_.reset();
  for (auto& im : imports_) cudaIpcCloseMemHandle(im.ptr);
  for (int i = 0; i < kEvents; ++i) {
    if (events_[i]) cudaEventDestroy(events_[i]);
    if (left_events_[i]) cudaEventDestroy(left_events_[i]);
  }
  if (done_) cudaEventDestroy(done_);
  if (right_done_) cudaEventDestroy(right_done_);
  if (probe_) cudaFree(probe_);
  freeDeferred();
}

}  // namespace

std::unique_ptr<GpuComm> makeIpcRingComm(const CommContext& ctx, std::string* why) {
  return IpcRingComm::create(ctx, why);
}

}  // namespace gpu
}  // namespace tfring
