// gpu/executor.h with CUDA: accepts GPU tensors at enqueue, picks the
// job's GPU backend at the first GPU group, and runs each group like
// runtime/executor.cc does on host buffers (prescale into place, fusion
// buffer pack/unpack, scratch for reducescatter) around a GpuComm, on one
// stream per process, waiting once per group before the tensors are handed
// back.
#include <cuda_runtime_api.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <utility>
#include <vector>

#include "collectives/ring.h"
#include "common/logging.h"
#include "common/wire.h"
#include "gpu/backend_select.h"
#include "gpu/cuda/comm.h"
#include "gpu/cuda/cuda_util.h"
#include "gpu/cuda/peer_allreduce.h"
#include "gpu/device.h"
#include "gpu/mps.h"
#include "gpu/nccl_loader.h"
#include "kernels/cuda/kernels.h"
#include "transport/ring_links.h"

namespace tfring {
namespace gpu {

namespace {

// The one GPU this process's tensors use, whichever communicator runs them
// (one GPU per process); free again once no communicator's executor is
// left (g_live, under g_mu).
std::mutex g_mu;
int g_live = 0;
std::atomic<int> g_device{-1};

// Readiness events of submitted tensors (one per tensor with a producer
// stream), reused instead of created and destroyed per tensor. A returned
// event may still have a record pending: recording it again is allowed.
constexpr size_t kMaxPooledEvents = 4096;
struct EventPool {
  std::mutex mu;
  std::vector<std::pair<int, cudaEvent_t>> free;  // (device, event)
};
EventPool& eventPool() {
  static EventPool* p = new EventPool();  // never destroyed: tensors may outlive statics
  return *p;
}

cudaEvent_t takeEvent(int device) {
  EventPool& P = eventPool();
  {
    std::lock_guard<std::mutex> lk(P.mu);
    for (size_t i = P.free.size(); i-- > 0;)
      if (P.free[i].first == device) {
        cudaEvent_t ev = P.free[i].second;
        P.free[i] = P.free.back();
        P.free.pop_back();
        return ev;
      }
  }
  cudaEvent_t ev;
  TFRING_CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  return ev;
}

void giveEvent(int device, cudaEvent_t ev) {
  EventPool& P = eventPool();
  std::lock_guard<std::mutex> lk(P.mu);
  if (P.free.size() < kMaxPooledEvents) {
    P.free.emplace_back(device, ev);
    return;
  }
  cudaEventDestroy(ev);
}

constexpr size_t kFusionAlign = 64;  // fused tensors start 64-byte aligned

size_t alignUp(size_t x) { return (x + kFusionAlign - 1) / kFusionAlign * kFusionAlign; }

class CudaExecutor : public Executor {
 public:
  CudaExecutor(int device, const HostLink& host, cudaStream_t stream,
               std::unique_ptr<GpuComm> comm)
      : device_(device), host_(host), stream_(stream), comm_(std::move(comm)) {
    std::lock_guard<std::mutex> lk(g_mu);
    ++g_live;
  }

  ~CudaExecutor() override {
    int prev = -1;
    cudaGetDevice(&prev);
    cudaSetDevice(device_);
    // Work still queued on the stream reads peers' memory through the
    // comm's IPC mappings and writes our buffers. After a peer failure it
    // can be stuck behind a wait on the dead peer's event: freeing then
    // hangs (cudaFree synchronizes the device) and unmapping under it
    // faults. Give it a moment to drain; if it does not, leave the stream,
    // mappings and buffers to process exit.
    if (comm_) comm_->abort();
    if (stream_ && !drainStream(stream_, 5.0)) {
      TFRING_LOG(kWarning, "GPU work of a failed collective is still queued on GPU ", device_,
                 "; its buffers and IPC mappings are left in place");
      (void)comm_.release();
      for (auto& r : retired_) (void)r.release();
      (void)fusion_.release();
      stream_ = nullptr;
    }
    comm_.reset();
    retired_.clear();
    fusion_.reset();
    if (stream_) cudaStreamDestroy(stream_);
    if (prev >= 0) cudaSetDevice(prev);
    std::lock_guard<std::mutex> lk(g_mu);
    if (--g_live == 0) g_device.store(-1);
  }

  int device() const override { return device_; }
  std::string backend() const override { return comm_->name(); }
  void* stream() const override { return stream_; }
  GpuComm* comm() const { return comm_.get(); }
  // The calibration's loser is kept until teardown: destroying a comm frees
  // device memory, and cudaFree waits for every stream of the device, a
  // caller's stream held by a stream gate included (gpu/device.h).
  void replaceComm(std::unique_ptr<GpuComm> c) {
    retired_.push_back(std::move(comm_));
    comm_ = std::move(c);
  }
  void retire(std::unique_ptr<GpuComm> c) { retired_.push_back(std::move(c)); }
  char* scratch(size_t bytes) { return fusion().reserve(bytes); }

  void allreduce(const std::vector<Buffer>& bufs, DataType dt, ReduceOp op, double pre,
                 double post) override {
    DeviceGuard g(device_);
    const size_t es = dtypeSize(dt);
    const double fin = op == ReduceOp::kAverage ? post / host_.topo->size : post;
    const ReduceOp kop = op == ReduceOp::kAverage ? ReduceOp::kSum : op;
    // The parts of a grouped request share one input event: wait on it once.
    for (size_t i = 0; i < bufs.size(); ++i)
      if (i == 0 || bufs[i].ready != bufs[i - 1].ready) waitReady(bufs[i]);
    if (bufs.size() == 1) {
      const Buffer& b = bufs[0];
      if (b.count && !comm_->allreduceFrom(b.input, b.output, b.count, dt, kop, pre, fin)) {
        kernels::cuda::scale(b.output, b.input, b.count, dt, pre, stream_);
        comm_->allreduce(b.output, b.count, dt, kop, fin);
      }
    } else {
      // Fused: pack every input into one buffer (each at a 64-byte aligned
      // offset, the same layout on every rank), reduce it once, unpack. The
      // pack and unpack tables are built in one pass into vectors kept
      // across groups: no allocation per tensor once they have grown.
      size_t total = 0;
      for (auto& b : bufs) total += alignUp(b.count * es);
      char* f = fusion().reserve(total);
      pack_.resize(bufs.size());
      unpack_.resize(bufs.size());
      size_t off = 0;
      for (size_t i = 0; i < bufs.size(); ++i) {
        const size_t bytes = bufs[i].count * es;
        pack_[i] = {f + off, bufs[i].input, bytes};
        unpack_[i] = {bufs[i].output, f + off, bytes};
        off += alignUp(bytes);
      }
      kernels::cuda::batchedCopy(pack_.data(), pack_.size(), stream_);
      const size_t count = total / es;
      if (pre != 1.0) kernels::cuda::scale(f, f, count, dt, pre, stream_);
      comm_->allreduce(f, count, dt, kop, fin);
      kernels::cuda::batchedCopy(unpack_.data(), unpack_.size(), stream_);
    }
    finish("allreduce");
  }

  void allgather(const Buffer& b, const std::vector<size_t>& rank_bytes) override {
    DeviceGuard g(device_);
    waitReady(b);
    const int me = host_.topo->rank;
    size_t off = 0;
    for (int r = 0; r < me; ++r) off += rank_bytes[r];
    if (rank_bytes[me])
      TFRING_CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(b.output) + off, b.input,
                                        rank_bytes[me], cudaMemcpyDeviceToDevice, stream_));
    comm_->allgather(b.output, rank_bytes);
    finish("allgather");
  }

  void broadcast(const Buffer& b, size_t bytes, int root) override {
    DeviceGuard g(device_);
    waitReady(b);
    if (host_.topo->rank == root && b.output != b.input && bytes)
      TFRING_CUDA_CHECK(
          cudaMemcpyAsync(b.output, b.input, bytes, cudaMemcpyDeviceToDevice, stream_));
    comm_->broadcast(b.output, bytes, root);
    finish("broadcast");
  }

  void reducescatter(const Buffer& b, DataType dt, const std::vector<size_t>& counts,
                     ReduceOp op, double pre, double post) override {
    DeviceGuard g(device_);
    waitReady(b);
    const int me = host_.topo->rank;
    const size_t es = dtypeSize(dt);
    size_t total = 0, mine = 0;
    for (size_t r = 0; r < counts.size(); ++r) {
      if (static_cast<int>(r) < me) mine += counts[r];
      total += counts[r];
    }
    const double fin = op == ReduceOp::kAverage ? post / host_.topo->size : post;
    const ReduceOp kop = op == ReduceOp::kAverage ? ReduceOp::kSum : op;
    // The input must survive, so reduce in scratch.
    char* work = fusion().reserve(total * es);
    kernels::cuda::scale(work, b.input, total, dt, pre, stream_);
    comm_->reducescatter(work, counts, dt, kop, fin);
    if (counts[me])
      TFRING_CUDA_CHECK(cudaMemcpyAsync(b.output, work + mine * es, counts[me] * es,
                                        cudaMemcpyDeviceToDevice, stream_));
    finish("reducescatter");
  }

 private:
  DeviceBuffer& fusion() {
    if (!fusion_) fusion_.reset(new DeviceBuffer());
    return *fusion_;
  }
  void waitReady(const Buffer& b) {
    if (b.ready)
      TFRING_CUDA_CHECK(
          cudaStreamWaitEvent(stream_, static_cast<cudaEvent_t>(b.ready.get()), 0));
  }
  void finish(const char* what) {
    try {
      waitStream(stream_, Deadline::in(host_.timeout_s), what, host_.comm->abort,
                 [this] { comm_->poll(); });
    } catch (...) {
      comm_->abort();  // kernels waiting on peers give up, the stream drains
      throw;
    }
  }

  int device_;
  HostLink host_;
  cudaStream_t stream_;
  std::unique_ptr<GpuComm> comm_;
  std::vector<std::unique_ptr<GpuComm>> retired_;  // calibration losers, freed at teardown
  std::unique_ptr<DeviceBuffer> fusion_;
  std::vector<kernels::cuda::CopyDesc> pack_, unpack_;  // reused by every fused group
};

// For calibration: `reps` allreduces of `count` floats, waited for.
double timeAllreduce(GpuComm* comm, cudaStream_t stream, float* data, size_t count, int reps,
                     double timeout_s, AbortState* abort) {
  double t0 = nowSeconds();
  for (int i = 0; i < reps; ++i)
    comm->allreduce(data, count, DataType::kFloat32, ReduceOp::kSum, 1.0);
  waitStream(stream, Deadline::in(timeout_s), "calibration", abort, [&] { comm->poll(); });
  return nowSeconds() - t0;
}

// What every rank tells the others before the backend is chosen.
constexpr size_t kFactsBytes = 2048;

std::vector<RankGpu> gatherFacts(const HostLink& host, const RankGpu& mine) {
  wire::Writer w;
  w.putStr(mine.host.substr(0, 256));
  w.putStr(mine.gpu.substr(0, 64));
  w.put<uint8_t>(mine.nccl_ok);
  w.putStr(mine.nccl_error.substr(0, 1500));
  w.put<uint8_t>(mine.ipc_ok);
  std::vector<uint8_t> rec = w.bytes();
  rec.resize(kFactsBytes, 0);
  std::vector<char> all = hostAllgather(host, rec.data(), kFactsBytes);
  std::vector<RankGpu> out(host.topo->size);
  for (int r = 0; r < host.topo->size; ++r) {
    wire::Reader rd(reinterpret_cast<const uint8_t*>(all.data()) + r * kFactsBytes, kFactsBytes);
    out[r].host = rd.getStr();
    out[r].gpu = rd.getStr();
    out[r].nccl_ok = rd.get<uint8_t>() != 0;
    out[r].nccl_error = rd.getStr();
    out[r].ipc_ok = rd.get<uint8_t>() != 0;
  }
  return out;
}

}  // namespace

bool builtWithCuda() { return true; }

bool cudaEmulated() {
#ifdef TFRING_CUDA_EMULATION
  return true;
#else
  return false;
#endif
}

int boundDevice() { return g_device.load(); }

Status acceptTensor(const std::string& name, int device, void* stream,
                    std::shared_ptr<void>* ready) {
  const int n = deviceCount();
  if (n == 0)
    return Status(Code::kUnavailable, strCat("tensor '", name, "' is on GPU ", device,
                                             " but CUDA cannot be used in this process: ",
                                             unavailableReason()));
  if (device >= n)
    return Status(Code::kInvalidArgument, strCat("tensor '", name, "' is on GPU ", device,
                                                 " but this process sees only ", n, " GPU",
                                                 n == 1 ? "" : "s"));
  int bound = -1;
  if (!g_device.compare_exchange_strong(bound, device) && bound != device)
    return Status(Code::kInvalidArgument,
                  strCat("tensor '", name, "' is on GPU ", device, " but this process already "
                         "uses GPU ", bound, " (tfring drives one GPU per process; pick it by "
                         "local rank)"));
  if (!stream) return Status::OK();
  try {
    DeviceGuard g(device);
    cudaEvent_t ev = takeEvent(device);
    cudaError_t e = cudaEventRecord(ev, static_cast<cudaStream_t>(stream));
    if (e != cudaSuccess) {
      cudaEventDestroy(ev);
      cudaFail(e, "cudaEventRecord", strCat("on the stream of tensor '", name, "'"));
    }
    *ready = std::shared_ptr<void>(ev, [device](void* p) {
      giveEvent(device, static_cast<cudaEvent_t>(p));
    });
  } catch (const Error& e) {
    return e.status();
  }
  return Status::OK();
}

uint64_t allreduceAlgorithmCount(const collectives::CommStats& stats, const std::string& algo) {
  for (PeerAlgo a : {PeerAlgo::kRing, PeerAlgo::kOneShot, PeerAlgo::kTwoShot, PeerAlgo::kStaged})
    if (algo == peerAlgoName(a)) return stats.gpuAllreduces(static_cast<int>(a));
  return 0;
}

Status createExecutor(int device, const HostLink& host, std::unique_ptr<Executor>* out) {
  const transport::Topology& T = *host.topo;
  TFRING_CUDA_CHECK(cudaSetDevice(device), "GPU ", device);
  const GpuConfig cfg = GpuConfig::fromEnv();
  if (cfg.allreduce_algo != "auto" && cfg.allreduce_algo != "ring" &&
      cfg.allreduce_algo != "oneshot" && cfg.allreduce_algo != "twoshot")
    return Status(Code::kInvalidArgument,
                  strCat("TFRING_GPU_ALLREDUCE_ALGO='", cfg.allreduce_algo,
                         "' is not one of auto, ring, oneshot, twoshot"));

  // 1. Facts from every rank, then one decision every rank computes alike.
  RankGpu mine;
  mine.host = T.peers.empty() ? std::string("localhost") : T.peers[T.rank].host;
  mine.gpu = deviceUuid(device);
  if (cfg.backend == "nccl" || (cfg.backend == "auto" && T.size > 1)) {
    const nccl::Library& lib = nccl::load();
    mine.nccl_ok = lib.api != nullptr;
    mine.nccl_error = lib.error;
  } else {
    mine.nccl_error = "not loaded (TFRING_GPU_BACKEND=" + cfg.backend + ")";
  }
  mine.ipc_ok = cfg.ipc;
  std::vector<RankGpu> facts = T.size > 1 ? gatherFacts(host, mine) : std::vector<RankGpu>{mine};
  // Ranks time-sliced on one GPU: the lowest rank of the host says how MPS
  // avoids the context switches (gpu/mps.h).
  const std::string mps_dir = mpsPipeDirectory();
  const std::string mps_warning =
      sharedGpuMpsWarning(facts, T.rank, mpsControlPresent(mps_dir), mps_dir, host.labels);
  if (!mps_warning.empty()) TFRING_LOG(kWarning, mps_warning);
  Choice choice;
  try {
    choice = chooseBackend(cfg.backend, facts, cfg.autotune, host.labels);
  } catch (const Error& e) {
    return e.status();  // identical on every rank
  }

  // 2. Build it (collective from here on; failures are fatal).
  // The engine's stream has the highest priority: its kernels are the
  // step's critical path (XLA's stream may be held by a gate until they are
  // done), and compute kernels then yield SMs to them at block boundaries.
  cudaStream_t stream = nullptr;
  int least = 0, greatest = 0;
  TFRING_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  TFRING_CUDA_CHECK(cudaStreamCreateWithPriority(&stream, cudaStreamNonBlocking, greatest));
  CommContext ctx;
  ctx.host = host;
  ctx.device = device;
  ctx.stream = stream;
  ctx.cfg = cfg;
  ctx.one_gpu = true;
  for (auto& f : facts) ctx.one_gpu = ctx.one_gpu && f.host == facts[0].host && f.gpu == facts[0].gpu;
  auto build = [&](Backend b) -> std::unique_ptr<GpuComm> {
    switch (b) {
      case Backend::kLocal: return makeLocalComm(ctx);
      case Backend::kHostRing: return makeHostRingComm(ctx);
      case Backend::kNccl: return makeNcclComm(ctx);
      case Backend::kIpcRing: {
        std::string why;
        auto c = makeIpcRingComm(ctx, &why);
        if (c) return c;
        TFRING_LOG(kWarning, why, "; GPU tensors go through host memory instead (slower)");
        return makeHostRingComm(ctx);
      }
    }
    return nullptr;
  };
  std::unique_ptr<CudaExecutor> ex(
      new CudaExecutor(device, host, stream, build(choice.backend)));
  std::string reason = choice.reason;
  if (choice.calibrate) {
    std::unique_ptr<GpuComm> alt = build(choice.alternative);
    if (alt->name() != "ring-host") {
      // Same work, same order on every rank; rank 0's timing decides. The
      // data lives in the executor's fusion buffer, which outlives both.
      constexpr size_t kCount = 8u << 20;  // 32 MiB of float32
      float* data = reinterpret_cast<float*>(ex->scratch(kCount * sizeof(float)));
      TFRING_CUDA_CHECK(cudaMemsetAsync(data, 0, kCount * sizeof(float), stream));
      const double to = host.timeout_s;
      AbortState* ab = host.comm->abort;
      timeAllreduce(ex->comm(), stream, data, kCount, 1, to, ab);
      timeAllreduce(alt.get(), stream, data, kCount, 1, to, ab);
      double t_main = timeAllreduce(ex->comm(), stream, data, kCount, 3, to, ab);
      double t_alt = timeAllreduce(alt.get(), stream, data, kCount, 3, to, ab);
      uint8_t pick_alt = t_alt < t_main ? 1 : 0;
      hostBroadcast(host, &pick_alt, 1);
      reason += strCat(" (rank ", host.labels(0), " timed ", ex->comm()->name(), " ",
                       t_main * 1e3 / 3, " ms, ", alt->name(), " ", t_alt * 1e3 / 3,
                       " ms per 32 MiB allreduce)");
      if (pick_alt)
        ex->replaceComm(std::move(alt));
      else
        ex->retire(std::move(alt));
    }
  }
  if (T.rank == 0) TFRING_LOG(kInfo, "GPU backend: ", ex->backend(), " (", reason, ")");
  *out = std::move(ex);
  return Status::OK();
}

}  // namespace gpu
}  // namespace tfring
