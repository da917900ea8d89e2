// GpuExecutor (executor.h): groups of GPU tensors (Request.device >= 0), with
// the same shapes and allocation rules as executor.cc and the data path
// delegated to the gpu::Executor (csrc/gpu).
#include "runtime/executor.h"

namespace tfring {
namespace runtime {

namespace {

gpu::Buffer bufferOf(const Entry& e) {
  gpu::Buffer b;
  b.input = e.req.input;
  b.output = e.req.output;
  b.count = static_cast<size_t>(e.meta.numElements());
  b.ready = e.gpu_ready;
  return b;
}

}  // namespace

Status GpuExecutor::accept(Entry& e) {
  return gpu::acceptTensor(e.meta.name, e.req.device, e.req.stream, &e.gpu_ready);
}

Status GpuExecutor::run(const Group& g, const Entries& es) {
  std::lock_guard<std::mutex> lk(mu_);
  if (!gpu_) {
    gpu::HostLink h;
    h.comm = &comm_;
    h.topo = &topo_;
    h.timeout_s = timeout_s_;
    h.labels = labels_;
    Status s = gpu::createExecutor(es[0]->req.device, h, &gpu_);
    if (!s.ok()) return s;
    if (comm_.stats) comm_.stats->setGpuBackend(gpu_->backend());
    stream_.store(gpu_->stream());
  }
  const Meta& m = es[0]->meta;
  const int N = comm_.size;
  const int me = topo_.rank;
  switch (g.type) {
    case CollectiveType::kAllreduce: {
      // Each entry's parts (a grouped request), else its one buffer, all
      // behind the entry's one input event.
      std::vector<gpu::Buffer> bufs;
      std::vector<collectives::Span> spans;
      for (auto& e : es) {
        spans.clear();
        entrySpans(*e, &spans);
        for (const collectives::Span& s : spans)
          bufs.push_back({s.in, s.out, s.count, e->gpu_ready});
      }
      gpu_->allreduce(bufs, m.dtype, m.op, m.prescale, m.postscale);
      break;
    }
    case CollectiveType::kAllgather: {
      Entry& e = *es[0];
      std::vector<int64_t> out_shape;
      const std::vector<size_t> rank_bytes = allgatherBytes(m, g.dim0s[0], &out_shape);
      allocateOutput(e, out_shape);
      gpu_->allgather(bufferOf(e), rank_bytes);
      break;
    }
    case CollectiveType::kBroadcast:
      gpu_->broadcast(bufferOf(*es[0]),
                      static_cast<size_t>(m.numElements()) * dtypeSize(m.dtype), m.root);
      break;
    case CollectiveType::kReducescatter: {
      Entry& e = *es[0];
      const std::vector<size_t> counts = reducescatterCounts(m, N);
      allocateOutput(e, reducescatterShape(m.shape, me, N));
      gpu_->reducescatter(bufferOf(e), m.dtype, counts, m.op, m.prescale, m.postscale);
      break;
    }
    case CollectiveType::kBarrier: break;
    case CollectiveType::kAlltoall:
    case CollectiveType::kJoin:
      return Status(Code::kInvalidArgument,
                    strCat(collectiveName(g.type), " of tensor '", m.name,
                           "' takes host memory only (GPU tensors go through the host)"));
  }
  return Status::OK();
}

}  // namespace runtime
}  // namespace tfring
