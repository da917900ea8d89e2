// NcclComm: the collectives through NCCL (loaded at run time), one
// communicator per job whose unique id rank 0 draws and sends to every rank
// over the job's authenticated CPU ring (itself bootstrapped through the
// store), so NCCL needs no store of its own.
//
// NCCL collectives need equal counts per rank; allgather and reducescatter
// with uneven blocks become grouped broadcasts / reduces, one per rank.
// Averages are sums followed by tfring's scale kernel, applied to the
// already identical result on every rank.
#include "collectives/ring.h"
#include "common/abort.h"
#include "common/logging.h"
#include "gpu/cuda/comm.h"
#include "gpu/cuda/cuda_util.h"
#include "gpu/nccl_loader.h"
#include "kernels/cuda/kernels.h"
#include "transport/ring_links.h"

namespace tfring {
namespace gpu {

namespace {

class NcclComm : public GpuComm {
 public:
  explicit NcclComm(const CommContext& c) : c_(c) {
    const nccl::Library& lib = nccl::load();
    if (!lib.api) fail(Code::kUnavailable, lib.error);
    api_ = lib.api;
    const int n = c.host.topo->size, me = c.host.topo->rank;
    nccl::UniqueId id{};
    if (me == 0) check(api_->getUniqueId(&id), "ncclGetUniqueId");
    hostBroadcast(c.host, &id, sizeof(id));
    check(api_->commInitRank(&comm_, n, id, me), "ncclCommInitRank");
    TFRING_LOG(kDebug, "NCCL ", lib.version, " communicator ready (", lib.path, ")");
  }

  ~NcclComm() override {
    if (!comm_) return;
    if (c_.host.comm->abort && c_.host.comm->abort->aborted()) api_->commAbort(comm_);
    else api_->commDestroy(comm_);
  }

  std::string name() const override { return "nccl"; }

  void allreduce(void* data, size_t count, DataType dt, ReduceOp op, double post) override {
    if (count == 0) return;
    check(api_->allReduce(data, data, count, nccl::dtypeOf(dt), nccl::opOf(op, dt), comm_,
                          stream()),
          "ncclAllReduce");
    if (post != 1.0) kernels::cuda::scale(data, data, count, dt, post, c_.stream);
  }

  void allgather(void* out, const std::vector<size_t>& rank_bytes) override {
    const int n = static_cast<int>(rank_bytes.size()), me = c_.host.topo->rank;
    char* base = static_cast<char*>(out);
    bool equal = true;
    for (auto b : rank_bytes) equal = equal && b == rank_bytes[0];
    if (equal) {
      if (rank_bytes[0] == 0) return;
      check(api_->allGather(base + rank_bytes[0] * me, base, rank_bytes[0], nccl::byteType(),
                            comm_, stream()),
            "ncclAllGather");
      return;
    }
    check(api_->groupStart(), "ncclGroupStart");
    size_t off = 0;
    for (int r = 0; r < n; ++r) {
      if (rank_bytes[r])
        check(api_->broadcast(base + off, base + off, rank_bytes[r], nccl::byteType(), r, comm_,
                              stream()),
              "ncclBroadcast");
      off += rank_bytes[r];
    }
    check(api_->groupEnd(), "ncclGroupEnd");
  }

  void broadcast(void* data, size_t bytes, int root) override {
    if (bytes == 0) return;
    check(api_->broadcast(data, data, bytes, nccl::byteType(), root, comm_, stream()),
          "ncclBroadcast");
  }

  void reducescatter(void* work, const std::vector<size_t>& counts, DataType dt, ReduceOp op,
                     double post) override {
    const int n = static_cast<int>(counts.size()), me = c_.host.topo->rank;
    const size_t es = dtypeSize(dt);
    char* base = static_cast<char*>(work);
    bool equal = true;
    size_t mine = 0;
    for (int r = 0; r < n; ++r) {
      equal = equal && counts[r] == counts[0];
      if (r < me) mine += counts[r];
    }
    const int dtype = nccl::dtypeOf(dt), nop = nccl::opOf(op, dt);
    if (equal) {
      if (counts[0])
        check(api_->reduceScatter(base, base + mine * es, counts[0], dtype, nop, comm_, stream()),
              "ncclReduceScatter");
    } else {
      check(api_->groupStart(), "ncclGroupStart");
      size_t off = 0;
      for (int r = 0; r < n; ++r) {
        if (counts[r])
          check(api_->reduce(base + off * es, base + off * es, counts[r], dtype, nop, r, comm_,
                             stream()),
                "ncclReduce");
        off += counts[r];
      }
      check(api_->groupEnd(), "ncclGroupEnd");
    }
    if (post != 1.0 && counts[me])
      kernels::cuda::scale(base + mine * es, base + mine * es, counts[me], dt, post, c_.stream);
  }

  void poll() override {
    nccl::Result async = nccl::kSuccess;
    if (api_->commGetAsyncError(comm_, &async) == nccl::kSuccess && async != nccl::kSuccess &&
        async != nccl::kInProgress)
      fail(Code::kPeerFailure, "NCCL failed asynchronously: ",
           nccl::describe(api_, async, comm_));
  }

 private:
  nccl::Stream stream() const { return reinterpret_cast<nccl::Stream>(c_.stream); }
  void check(nccl::Result r, const char* what) {
    if (r != nccl::kSuccess && r != nccl::kInProgress)
      fail(Code::kInternal, what, " failed: ", nccl::describe(api_, r, comm_));
  }

  CommContext c_;
  const nccl::Api* api_ = nullptr;
  nccl::Comm comm_ = nullptr;
};

}  // namespace

std::unique_ptr<GpuComm> makeNcclComm(const CommContext& ctx) {
  return std::unique_ptr<GpuComm>(new NcclComm(ctx));
}

}  // namespace gpu
}  // namespace tfring
