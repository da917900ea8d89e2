// HostExecutor (executor.h): how each kind of scheduled group runs on host
// buffers: fusion buffer packing for allreduce, output allocation for
// allgather and reducescatter, and the calls into the ring collectives;
// and the buffer helpers of an Entry (entry.h) both executors use.
#include <cstring>

#include "collectives/allgather.h"
#include "collectives/allreduce.h"
#include "collectives/broadcast.h"
#include "common/logging.h"
#include "kernels/cpu/reduce.h"
#include "runtime/executor.h"
#include "runtime/timeline.h"

namespace tfring {
namespace runtime {

namespace {

size_t bytesOf(const Meta& m) {
  return static_cast<size_t>(m.numElements()) * dtypeSize(m.dtype);
}

// The algorithm, critical-path hops and bytes this rank sent
// (collectives::AllreduceStats), on every tensor of the group.
void traceAllreduce(Timeline& t, const collectives::CommStats& s,
                    const std::vector<std::shared_ptr<Entry>>& es) {
  if (!t.enabled()) return;
  const collectives::AllreduceStats st = collectives::lastAllreduceStats(s);
  const std::string args =
      strCat("{\"algo\":\"", collectives::allreduceAlgoName(st.algo), "\",\"ranks\":", st.size,
             ",\"bytes\":", st.bytes, ",\"hops\":", st.hops, ",\"bytes_sent\":", st.bytes_sent,
             "}");
  for (auto& e : es) t.instant(e->meta.name, "ALLREDUCE_STATS", args);
}

}  // namespace

// The same for an allgather, a broadcast or an allreduce carried by the
// vote (collectives::CollectiveStats).
void traceCollective(Timeline& t, const collectives::CommStats& s, const Entry& e,
                     const char* event) {
  if (!t.enabled()) return;
  const collectives::CollectiveStats st = collectives::lastCollectiveStats(s);
  t.instant(e.meta.name, event,
            strCat("{\"algo\":\"", st.algo, "\",\"ranks\":", st.size, ",\"bytes\":", st.bytes,
                   ",\"hops\":", st.hops, ",\"bytes_sent\":", st.bytes_sent, "}"));
}

// Average is a sum followed by a division folded into the postscale.
double finalScale(const Meta& m, int size) {
  return m.op == ReduceOp::kAverage ? m.postscale / size : m.postscale;
}

ReduceOp kernelOp(ReduceOp op) { return op == ReduceOp::kAverage ? ReduceOp::kSum : op; }

void allocateOutput(Entry& e, const std::vector<int64_t>& shape) {
  if (e.req.output) return;
  if (!e.req.allocate)
    fail(Code::kInternal, "tensor '", e.meta.name, "' has neither an output nor an allocator");
  void* p = nullptr;
  Status s = e.req.allocate(shape, &p);
  if (!s.ok()) throw Error(s);
  int64_t n = 1;
  for (auto d : shape) n *= d;
  if (!p && n > 0) fail(Code::kInternal, "allocator returned no memory for '", e.meta.name, "'");
  e.req.output = p;
}

void entrySpans(const Entry& e, std::vector<collectives::Span>* out) {
  if (e.req.parts.empty()) {
    out->push_back({static_cast<const char*>(e.req.input), static_cast<char*>(e.req.output),
                    static_cast<size_t>(e.meta.numElements())});
    return;
  }
  for (const Request::Part& p : e.req.parts)
    out->push_back({static_cast<const char*>(p.input), static_cast<char*>(p.output),
                    static_cast<size_t>(p.count)});
}

void gatherInput(const Entry& e, void* dst) {
  const size_t es = dtypeSize(e.meta.dtype);
  if (e.req.parts.empty()) {
    if (bytesOf(e.meta)) std::memcpy(dst, e.req.input, bytesOf(e.meta));
    return;
  }
  char* d = static_cast<char*>(dst);
  for (const Request::Part& p : e.req.parts) {
    const size_t b = static_cast<size_t>(p.count) * es;
    if (b) std::memcpy(d, p.input, b);
    d += b;
  }
}

void scatterOutput(Entry& e, const void* src) {
  const size_t es = dtypeSize(e.meta.dtype);
  if (e.req.parts.empty()) {
    if (bytesOf(e.meta)) std::memcpy(e.req.output, src, bytesOf(e.meta));
    return;
  }
  const char* s = static_cast<const char*>(src);
  for (const Request::Part& p : e.req.parts) {
    const size_t b = static_cast<size_t>(p.count) * es;
    if (b) std::memcpy(p.output, s, b);
    s += b;
  }
}

Status HostExecutor::run(const Group& g, const Entries& es) {
  switch (g.type) {
    case CollectiveType::kAllreduce: allreduce(es); break;
    case CollectiveType::kAllgather: allgather(*es[0], g.dim0s[0]); break;
    case CollectiveType::kBroadcast: broadcast(*es[0]); break;
    case CollectiveType::kReducescatter: reducescatter(*es[0]); break;
    case CollectiveType::kBarrier: break;
    case CollectiveType::kAlltoall: alltoall(*es[0], g.dim0s[0]); break;
    case CollectiveType::kJoin:
      *static_cast<int32_t*>(es[0]->req.output) = static_cast<int32_t>(g.dim0s[0][0]);
      break;
  }
  return Status::OK();
}

void HostExecutor::allreduce(const Entries& es) {
  const Meta& m0 = es[0]->meta;
  const int N = comm_.size;
  const DataType dt = m0.dtype;
  const double post = finalScale(m0, N);
  if (es.size() == 1 && es[0]->req.parts.empty()) {
    Entry& e = *es[0];
    size_t n = static_cast<size_t>(m0.numElements());
    const void* in = e.req.input;
    if (m0.prescale != 1.0) {
      if (e.req.output != in && n) std::memcpy(e.req.output, in, bytesOf(m0));
      kernels::scale(e.req.output, n, dt, m0.prescale);
      in = e.req.output;
    }
    collectives::allreduce(comm_, in, e.req.output, n, dt, kernelOp(m0.op), post, m0.wire);
    traceAllreduce(timeline_, *comm_.stats, es);
    return;
  }
  // Fused (several tensors, or one grouped request's parts): the ring reads
  // every input and writes every output where they are, cutting its steps
  // at tensor boundaries; the other algorithms pack pieces of at most the
  // fusion threshold. A prescale is applied on the way into the outputs
  // (inputs are read-only), which are then reduced in place.
  std::vector<collectives::Span> spans;
  spans.reserve(es.size());
  for (auto& e : es) entrySpans(*e, &spans);
  if (m0.prescale != 1.0) {
    for (auto& e : es) timeline_.begin(e->meta.name, "PRESCALE");
    const size_t esz = dtypeSize(dt);
    for (auto& sp : spans) {
      if (sp.out != sp.in && sp.count) std::memcpy(sp.out, sp.in, sp.count * esz);
      kernels::scale(sp.out, sp.count, dt, m0.prescale);
      sp.in = sp.out;
    }
    for (auto& e : es) timeline_.end(e->meta.name);
  }
  collectives::allreduceSpans(comm_, spans, dt, kernelOp(m0.op), post, &fusion_,
                              static_cast<size_t>(fusion_threshold_), m0.wire);
  traceAllreduce(timeline_, *comm_.stats, es);
}

std::vector<size_t> allgatherBytes(const Meta& m, const std::vector<int64_t>& dim0s,
                                   std::vector<int64_t>* out_shape) {
  int64_t row = 1;
  for (size_t i = 1; i < m.shape.size(); ++i) row *= m.shape[i];
  const size_t row_bytes = static_cast<size_t>(row) * dtypeSize(m.dtype);
  std::vector<size_t> rank_bytes(dim0s.size());
  int64_t total_rows = 0;
  for (size_t r = 0; r < dim0s.size(); ++r) {
    rank_bytes[r] = static_cast<size_t>(dim0s[r]) * row_bytes;
    total_rows += dim0s[r];
  }
  *out_shape = m.shape;
  (*out_shape)[0] = total_rows;
  return rank_bytes;
}

std::vector<size_t> reducescatterCounts(const Meta& m, int n) {
  int64_t row = 1;
  for (size_t i = 1; i < m.shape.size(); ++i) row *= m.shape[i];
  std::vector<size_t> counts(n);
  for (int r = 0; r < n; ++r)
    counts[r] = static_cast<size_t>(reducescatterShape(m.shape, r, n)[0] * row);
  return counts;
}

void HostExecutor::allgather(Entry& e, const std::vector<int64_t>& dim0s) {
  const int me = rank_;
  std::vector<int64_t> out_shape;
  const std::vector<size_t> rank_bytes = allgatherBytes(e.meta, dim0s, &out_shape);
  allocateOutput(e, out_shape);
  size_t my_off = 0;
  for (int r = 0; r < me; ++r) my_off += rank_bytes[r];
  if (rank_bytes[me])
    std::memmove(static_cast<char*>(e.req.output) + my_off, e.req.input, rank_bytes[me]);
  collectives::allgather(comm_, e.req.output, rank_bytes);
  traceCollective(timeline_, *comm_.stats, e, "ALLGATHER_STATS");
}

void HostExecutor::broadcast(Entry& e) {
  const Meta& m = e.meta;
  size_t b = bytesOf(m);
  if (rank_ == m.root && e.req.output != e.req.input && b)
    std::memcpy(e.req.output, e.req.input, b);
  collectives::broadcast(comm_, e.req.output, b, m.root);
  traceCollective(timeline_, *comm_.stats, e, "BROADCAST_STATS");
}

void HostExecutor::reducescatter(Entry& e) {
  const Meta& m = e.meta;
  const int N = comm_.size;
  const int me = rank_;
  const std::vector<size_t> counts = reducescatterCounts(m, N);
  size_t total = bytesOf(m);
  // The input must survive (frameworks may reuse it), so reduce in scratch.
  if (scratch_.size() < total) scratch_.resize(total);
  if (total) std::memcpy(scratch_.data(), e.req.input, total);
  size_t count = static_cast<size_t>(m.numElements());
  if (m.prescale != 1.0) kernels::scale(scratch_.data(), count, m.dtype, m.prescale);
  collectives::ringReducescatter(comm_, scratch_.data(), counts, m.dtype, kernelOp(m.op),
                                 finalScale(m, N));
  allocateOutput(e, reducescatterShape(m.shape, me, N));
  size_t off = 0;
  for (int r = 0; r < me; ++r) off += counts[r];
  size_t es = dtypeSize(m.dtype);
  if (counts[me]) std::memcpy(e.req.output, scratch_.data() + off * es, counts[me] * es);
}

}  // namespace runtime
}  // namespace tfring
