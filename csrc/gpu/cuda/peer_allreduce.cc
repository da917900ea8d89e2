// PeerAllreduce: one-shot and two-shot allreduce by direct peer reads of
// staging areas registered once (see peer_allreduce.h for the protocol).
#include "gpu/cuda/peer_allreduce.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "collectives/ring.h"
#include "common/abort.h"
#include "common/clock.h"
#include "common/logging.h"
#include "gpu/cuda/cuda_util.h"
#include "gpu/mps.h"
#include "kernels/cuda/kernels.h"
#include "kernels/cuda/peer.h"
#include "transport/ring_links.h"
#include "transport/shm/shm_channel.h"

namespace tfring {
namespace gpu {

namespace {

constexpr size_t kHeader = 256;  // the flag word's line, then the data

size_t roundUp256(size_t x) { return (x + 255) / 256 * 256; }

// What rank 0 decides for everyone.
struct Settings {
  int32_t algo;  // -1: by size, else a PeerAlgo
  uint64_t oneshot_max, twoshot_max, staged_max;
};

// What each rank publishes at setup.
struct Record {
  cudaIpcMemHandle_t mem;
  int32_t pid;
  int32_t mps;  // an MPS control daemon is there (gpu/mps.h)
  char pci_bus_id[32];
};

}  // namespace

const char* peerAlgoName(PeerAlgo a) {
  switch (a) {
    case PeerAlgo::kRing: return "ring";
    case PeerAlgo::kOneShot: return "oneshot";
    case PeerAlgo::kTwoShot: return "twoshot";
    case PeerAlgo::kStaged: return "staged";
  }
  return "?";
}

void countPeerAlgo(collectives::CommStats* stats, PeerAlgo a) {
  if (stats) stats->countGpuAllreduce(static_cast<int>(a));
}

std::unique_ptr<PeerAllreduce> PeerAllreduce::create(const CommContext& ctx, std::string* why,
                                                     size_t* staged_max) {
  const transport::Topology& T = *ctx.host.topo;
  *staged_max = 0;
  Settings s{-1, static_cast<uint64_t>(ctx.cfg.oneshot_max),
             static_cast<uint64_t>(ctx.cfg.twoshot_max),
             static_cast<uint64_t>(ctx.cfg.staged_max)};
  const std::string& a = ctx.cfg.allreduce_algo;
  s.algo = a == "ring"      ? static_cast<int32_t>(PeerAlgo::kRing)
           : a == "oneshot" ? static_cast<int32_t>(PeerAlgo::kOneShot)
           : a == "twoshot" ? static_cast<int32_t>(PeerAlgo::kTwoShot)
                            : -1;
  hostBroadcast(ctx.host, &s, sizeof(s));
  if (s.algo == static_cast<int32_t>(PeerAlgo::kRing) ||
      (s.algo < 0 && s.oneshot_max == 0 && s.twoshot_max == 0)) {
    *why = "TFRING_GPU_ALLREDUCE_ALGO=ring";
    return nullptr;
  }
  if (T.size > kernels::cuda::kMaxPeers) {
    *why = strCat("one-shot/two-shot allreduce serve at most ", kernels::cuda::kMaxPeers,
                  " ranks, this job has ", T.size);
    return nullptr;
  }
  std::unique_ptr<PeerAllreduce> p(new PeerAllreduce(ctx));
  p->n_ = T.size;
  p->me_ = T.rank;
  p->by_size_ = s.algo < 0;
  p->forced_ = s.algo < 0 ? PeerAlgo::kRing : static_cast<PeerAlgo>(s.algo);
  p->oneshot_max_ = s.oneshot_max;
  p->twoshot_max_ = s.twoshot_max;
  size_t cap = std::max<size_t>(std::max(s.oneshot_max, s.twoshot_max), 4096);
  p->cap_ = roundUp256(cap);

  // My area, flags zeroed before anyone can map it.
  void* area = nullptr;
  TFRING_CUDA_CHECK(cudaMalloc(&area, kHeader + 2 * p->cap_), "allocating the ",
                    kHeader + 2 * p->cap_, "-byte peer allreduce staging area");
  p->area_ = static_cast<char*>(area);
  cudaStream_t setup = setupStream(ctx.device);
  TFRING_CUDA_CHECK(cudaMemsetAsync(area, 0, kHeader, setup));
  TFRING_CUDA_CHECK(cudaStreamSynchronize(setup));
  void* words = nullptr;
  TFRING_CUDA_CHECK(cudaHostAlloc(&words, 2 * sizeof(int32_t),
                                  cudaHostAllocMapped | cudaHostAllocPortable));
  p->host_words_ = static_cast<int32_t*>(words);
  p->host_words_[0] = p->host_words_[1] = 0;

  Record mine{};
  TFRING_CUDA_CHECK(cudaIpcGetMemHandle(&mine.mem, area), "exporting the staging area");
  mine.pid = static_cast<int32_t>(::getpid());
  mine.mps = mpsControlPresent(mpsPipeDirectory()) ? 1 : 0;
  TFRING_CUDA_CHECK(cudaDeviceGetPCIBusId(mine.pci_bus_id, sizeof(mine.pci_bus_id), ctx.device));
  std::vector<char> all = hostAllgather(ctx.host, &mine, sizeof(mine));
  std::vector<Record> recs(p->n_);
  for (int r = 0; r < p->n_; ++r)
    memcpy(&recs[r], all.data() + r * sizeof(Record), sizeof(Record));

  // Ranks time-sliced on one GPU (no MPS) never run kernels at the same
  // time: a barrier kernel spinning on a peer's flag holds the GPU until the
  // time slice ends (milliseconds; on an H100, 2.7 ms per 4 KiB allreduce
  // against 0.8 ms for the ring). By size, the IPC comm then stages small
  // allreduces through host memory (no GPU-side wait on a peer) and runs the
  // ring above TFRING_GPU_STAGED_MAX; a forced algorithm is still honoured.
  // Every rank decides from the same records.
  if (p->by_size_) {
    bool shared = false, all_mps = true;
    for (const Record& rec : recs) all_mps = all_mps && rec.mps;
    for (int a = 0; a < p->n_ && !shared; ++a)
      for (int b = a + 1; b < p->n_ && !shared; ++b)
        shared = strncmp(recs[a].pci_bus_id, recs[b].pci_bus_id, sizeof(recs[a].pci_bus_id)) == 0;
    if (shared && !all_mps) {
      *why = strCat("ranks share a GPU without MPS (time-sliced: peer-flag kernels cannot run "
                    "at once); allreduces up to ", s.staged_max,
                    " bytes go through host memory (TFRING_GPU_STAGED_MAX). Start "
                    "nvidia-cuda-mps-control -d, or force TFRING_GPU_ALLREDUCE_ALGO");
      *staged_max = static_cast<size_t>(s.staged_max);
      return nullptr;  // the destructor frees the area
    }
  }

  // Map every peer's area; check that this GPU can read theirs.
  const RankLabels& L = ctx.host.labels;  // messages name global ranks
  constexpr size_t kMsg = 256;
  char verdict[kMsg] = {0};
  p->peers_.assign(p->n_, nullptr);
  p->pids_.assign(p->n_, 0);
  try {
    for (int r = 0; r < p->n_; ++r) {
      const Record& rec = recs[r];
      p->pids_[r] = rec.pid;
      if (r == p->me_) {
        p->peers_[r] = p->area_;
        continue;
      }
      int dev = -1;
      if (cudaDeviceGetByPCIBusId(&dev, rec.pci_bus_id) != cudaSuccess) {
        cudaGetLastError();
        fail(Code::kUnavailable, "the GPU of rank ", L(r), " (", rec.pci_bus_id,
             ") is not visible to rank ", L(p->me_));
      }
      if (dev != ctx.device) {
        int can = 0;
        TFRING_CUDA_CHECK(cudaDeviceCanAccessPeer(&can, ctx.device, dev));
        if (!can)
          fail(Code::kUnavailable, "GPU ", ctx.device, " of rank ", L(p->me_),
               " has no peer access to the GPU of rank ", L(r));
      }
      void* m = nullptr;
      TFRING_CUDA_CHECK(cudaIpcOpenMemHandle(&m, rec.mem, cudaIpcMemLazyEnablePeerAccess),
                        "mapping the staging area of rank ", L(r));
      p->peers_[r] = static_cast<char*>(m);
    }
    verdict[0] = 1;
  } catch (const Error& e) {
    snprintf(verdict + 1, kMsg - 1, "%s", e.what());
  }
  std::vector<char> verdicts = hostAllgather(ctx.host, verdict, kMsg);
  for (int r = 0; r < p->n_; ++r)
    if (!verdicts[r * kMsg]) {
      *why = std::string(verdicts.data() + r * kMsg + 1);
      return nullptr;  // the destructor unmaps and frees
    }
  return p;
}

PeerAllreduce::~PeerAllreduce() {
  for (int r = 0; r < static_cast<int>(peers_.size()); ++r)
    if (r != me_ && peers_[r]) cudaIpcCloseMemHandle(peers_[r]);
  // Not cudaFree here: a declined set-up runs while a caller's stream may
  // be held by a gate (cuda_util.h); the GPU backend's teardown frees it.
  freeLater(area_, host_words_);
}

PeerAlgo PeerAllreduce::choose(size_t bytes) const {
  if (!by_size_) return forced_;
  if (bytes <= oneshot_max_) return PeerAlgo::kOneShot;
  // Two ranks: two-shot is the ring's own two steps with a barrier more.
  if (bytes <= twoshot_max_ && n_ > 2) return PeerAlgo::kTwoShot;
  return PeerAlgo::kRing;
}

void PeerAllreduce::barrier() {
  kernels::cuda::PeerFlags f;
  for (int r = 0; r < n_; ++r) f.flag[r] = reinterpret_cast<uint64_t*>(peers_[r]);
  f.n = n_;
  f.me = me_;
  // The kernel's own bound is a backstop: the host's deadline and its
  // dead-peer check (poll) come first.
  const double t = c_.host.timeout_s + 30;
  kernels::cuda::peerBarrier(f, ++sequence_, host_words_, host_words_ + 1,
                             static_cast<uint64_t>(t * 1e9), c_.stream);
}

void PeerAllreduce::allreduce(PeerAlgo algo, const void* in, void* out, size_t count, DataType dt,
                              ReduceOp op, double pre, double post) {
  if (count == 0) return;
  countPeerAlgo(c_.host.comm->stats.get(), algo);
  const size_t es = dtypeSize(dt);
  const size_t piece = cap_ / es;  // elements per collective
  const char* i = static_cast<const char*>(in);
  char* o = static_cast<char*>(out);
  for (size_t done = 0; done < count; done += piece)
    runOne(algo, i + done * es, o + done * es, std::min(piece, count - done), dt, op, pre, post);
}

void PeerAllreduce::runOne(PeerAlgo algo, const char* in, char* out, size_t count, DataType dt,
                           ReduceOp op, double pre, double post) {
  const size_t es = dtypeSize(dt);
  const size_t parity = (collective_++ & 1) * cap_;
  auto stage = [&](int r) { return peers_[r] + kHeader + parity; };
  kernels::cuda::PeerSrcs srcs;
  srcs.n = n_;
  for (int r = 0; r < n_; ++r) srcs.src[r] = stage(r);
  kernels::cuda::scale(stage(me_), in, count, dt, pre, c_.stream);  // a copy when pre is 1
  barrier();
  if (algo == PeerAlgo::kOneShot) {
    kernels::cuda::peerReduce(out, srcs, 0, count, dt, op, post, c_.stream);
    return;
  }
  // Two-shot: rank r owns elements [begin(r), begin(r + 1)).
  auto begin = [&](int r) { return count / n_ * r + std::min<size_t>(r, count % n_); };
  kernels::cuda::peerReduce(stage(me_), srcs, begin(me_), begin(me_ + 1) - begin(me_), dt, op, post,
                            c_.stream);
  barrier();
  kernels::cuda::CopyDesc copies[kernels::cuda::kMaxPeers];
  for (int r = 0; r < n_; ++r)
    copies[r] = {out + begin(r) * es, stage(r) + begin(r) * es, (begin(r + 1) - begin(r)) * es};
  kernels::cuda::batchedCopy(copies, n_, c_.stream);
}

void PeerAllreduce::abort() {
  if (host_words_) __atomic_store_n(&host_words_[0], 1, __ATOMIC_RELEASE);
}

void PeerAllreduce::poll() {
  const int32_t st = __atomic_load_n(&host_words_[1], __ATOMIC_ACQUIRE);
  const double now = nowSeconds();
  if (st == 0 && now < next_pid_check_) return;
  next_pid_check_ = now + 0.05;
  for (int r = 0; r < n_; ++r)
    if (r != me_ && !transport::pidAlive(pids_[r])) {
      abort();
      failPeer(r, strCat("pid ", pids_[r]), "rank ", c_.host.labels(r), " (pid ", pids_[r],
               ") died during a GPU allreduce");
    }
  if (st != 0) {
    abort();
    fail(Code::kTimeout, "GPU allreduce: rank ", c_.host.labels(me_), " gave up waiting for rank ",
         c_.host.labels(st - 1),
         " (TFRING_TIMEOUT; a peer may be stuck)");
  }
}

}  // namespace gpu
}  // namespace tfring
