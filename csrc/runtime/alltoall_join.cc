// The engine's side of alltoall and join.
//
// Alltoall: the coordinator checks every rank's splits (alltoallSplits) and
// sends the whole size x size matrix with the group (Group.dim0s[0]), so
// every rank knows every block's size; the fast path reuses the matrix it
// last ran with while no rank's splits change (a change alters that rank's
// Meta, which sends the tensor back to the coordinator).
//
// Join: a rank that calls join() submits a kJoin request and keeps serving
// rounds. Until every rank has joined, the coordinator completes a name
// once every rank that has not joined submitted it, and attaches the
// agreed Metas to the group (Group.fill); a joined rank runs such a group
// with zero-filled stand-ins (joinFillEntry) for the names it never
// submitted. Only allreduce and barrier accept joined ranks (as in Horovod);
// the coordinator refuses the others with an error naming the tensor.
#include <cstring>

#include "collectives/ring.h"
#include "runtime/executor.h"

namespace tfring {
namespace runtime {

std::string alltoallSplits(const Meta& m, int size, std::vector<int64_t>* rows) {
  if (m.shape.empty())
    return "scalars cannot be scattered (give them a first dimension)";
  const int64_t dim0 = m.shape[0];
  rows->clear();
  if (m.splits.empty()) {
    if (dim0 % size != 0)
      return strCat("without splits the first dimension (", dim0,
                    ") must divide evenly among the ", size, " ranks");
    rows->assign(size, dim0 / size);
    return "";
  }
  if (static_cast<int>(m.splits.size()) != size)
    return strCat("splits has ", m.splits.size(), " entries but there are ", size,
                  " ranks (one entry per rank)");
  int64_t sum = 0;
  for (size_t i = 0; i < m.splits.size(); ++i) {
    if (m.splits[i] < 0)
      return strCat("splits[", i, "] is negative (", m.splits[i], ")");
    sum += m.splits[i];
  }
  if (sum != dim0)
    return strCat("splits sum to ", sum, " but the first dimension is ", dim0);
  *rows = m.splits;
  return "";
}

std::shared_ptr<Entry> joinFillEntry(const Meta& m) {
  auto e = std::make_shared<Entry>();
  e->meta = m;
  e->meta.device = -1;
  Request& r = e->req;
  r.name = m.name;
  r.type = m.type;
  r.dtype = m.dtype;
  r.shape = m.shape;
  r.op = m.op;
  r.root = m.root;
  r.prescale = m.prescale;
  r.postscale = m.postscale;
  r.wire = m.wire;
  // One zeroed buffer is both input and output (allreduce may run in place).
  auto buf = std::make_shared<std::vector<char>>(
      static_cast<size_t>(m.numElements()) * dtypeSize(m.dtype) + 1, 0);
  r.input = buf->data();
  r.output = buf->data();
  e->done = [buf](const Status&) {};
  return e;
}

void HostExecutor::alltoall(Entry& e, const std::vector<int64_t>& splits) {
  const Meta& m = e.meta;
  const int N = comm_.size;
  const int me = rank_;
  int64_t row = 1;
  for (size_t i = 1; i < m.shape.size(); ++i) row *= m.shape[i];
  const size_t row_bytes = static_cast<size_t>(row) * dtypeSize(m.dtype);
  std::vector<size_t> bytes(static_cast<size_t>(N) * N);
  std::vector<int64_t> received(N);
  int64_t rows_in = 0;
  for (int s = 0; s < N; ++s) {
    for (int d = 0; d < N; ++d) bytes[s * N + d] = static_cast<size_t>(splits[s * N + d]) * row_bytes;
    received[s] = splits[s * N + me];
    rows_in += received[s];
  }
  std::vector<int64_t> out_shape = m.shape;
  out_shape[0] = rows_in;
  allocateOutput(e, out_shape);
  collectives::ringAlltoall(comm_, e.req.input, e.req.output, bytes);
  if (e.req.received_splits) *e.req.received_splits = received;
}

}  // namespace runtime
}  // namespace tfring
