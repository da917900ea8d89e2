// Ring reduce-scatter: the first half of the ring allreduce. Segments are
// assigned so that the segment position p ends up owning — (p+1) in the
// allreduce numbering — is the block of the rank at position p.
#include "collectives/ring.h"
#include "collectives/ring_pipeline.h"
#include "kernels/cpu/reduce.h"

namespace tfring {
namespace collectives {

void ringReducescatter(RingComm& c, void* work, const std::vector<size_t>& rank_counts,
                       DataType dtype, ReduceOp op, double postscale) {
  const int N = c.size;
  const size_t es = dtypeSize(dtype);
  char* base = static_cast<char*>(work);
  std::vector<size_t> off(N + 1, 0);
  for (int r = 0; r < N; ++r) off[r + 1] = off[r] + rank_counts[r];
  if (N == 1) {
    if (postscale != 1.0) kernels::scale(work, off[N], dtype, postscale);
    return;
  }
  // Allreduce segment i (owned at the end by position i-1) is the block of
  // the rank at position i-1.
  auto seg = [&](int i) {
    int rank = c.ring[(((i - 1) % N) + N) % N];
    return std::make_pair(base + off[rank] * es, rank_counts[rank] * es);
  };
  const int p = c.pos;
  RingProgram prog;
  prog.dtype = dtype;
  prog.op = op;
  for (int k = 0; k < N - 1; ++k) {
    auto s = seg(p - k), r = seg(p - k - 1);
    prog.sends.push_back({s.first, s.second, k == 0 ? -1 : k - 1});
    prog.recvs.push_back({r.first, r.second, true, k == N - 2 ? postscale : 1.0});
  }
  runRing(c, prog, "reducescatter");
}

}  // namespace collectives
}  // namespace tfring
