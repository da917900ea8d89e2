// Ring allreduce: reduce-scatter, then allgather, each N-1 steps.
//
// The buffer is cut into N segments. In reduce-scatter step k, position p
// sends segment (p-k) to the right and receives segment (p-k-1) from the
// left, folding it into its own copy; after N-1 steps position p holds the
// complete reduction of segment (p+1). In allgather step k it sends segment
// (p+1-k) and receives segment (p-k), overwriting its copy.
//
// Seen as two streams, what p sends in step j+1 is exactly what it received
// in step j (the transition included: the last reduce-scatter receive is
// the first allgather send), so every send step after the first is chained
// to the previous receive step and the whole 2(N-1)-step exchange runs as
// one pipeline. Each rank moves 2(N-1)/N of the buffer in and out, which is
// the bandwidth lower bound for allreduce.
#include <cstring>

#include "collectives/ring.h"
#include "collectives/ring_pipeline.h"
#include "kernels/cpu/reduce.h"

namespace tfring {
namespace collectives {

std::vector<size_t> evenSplit(size_t count, int parts) {
  std::vector<size_t> off(parts + 1, 0);
  size_t base = count / parts, extra = count % parts;
  for (int i = 0; i < parts; ++i) off[i + 1] = off[i] + base + (static_cast<size_t>(i) < extra ? 1 : 0);
  return off;
}

void ringAllreduce(RingComm& c, const void* in, void* out, size_t count, DataType dtype,
                   ReduceOp op, double postscale) {
  const int N = c.size;
  const size_t es = dtypeSize(dtype);
  char* base = static_cast<char*>(out);
  const char* src = static_cast<const char*>(in);
  if (N == 1 || count == 0) {
    if (out != in && count) std::memcpy(out, in, count * es);
    if (postscale != 1.0) kernels::scale(out, count, dtype, postscale);
    return;
  }
  auto off = evenSplit(count, N);
  auto seg = [&](int i) {
    i = ((i % N) + N) % N;
    return std::make_pair(base + off[i] * es, (off[i + 1] - off[i]) * es);
  };
  auto inSeg = [&](int i) { return src + off[((i % N) + N) % N] * es; };
  const int p = c.pos;
  RingProgram prog;
  prog.dtype = dtype;
  prog.op = op;
  for (int k = 0; k < N - 1; ++k) {  // reduce-scatter
    // Step 0 sends straight from the input; each receive folds the input's
    // copy of its segment with what arrived, writing the output.
    auto s = seg(p - k), r = seg(p - k - 1);
    prog.sends.push_back({k == 0 ? inSeg(p) : s.first, s.second, k == 0 ? -1 : k - 1});
    prog.recvs.push_back({r.first, r.second, true, k == N - 2 ? postscale : 1.0, inSeg(p - k - 1)});
  }
  for (int k = 0; k < N - 1; ++k) {  // allgather
    auto s = seg(p + 1 - k), r = seg(p - k);
    int j = N - 1 + k;
    prog.sends.push_back({s.first, s.second, j - 1});
    prog.recvs.push_back({r.first, r.second, false, 1.0});
  }
  runRing(c, prog, "allreduce");
}

}  // namespace collectives
}  // namespace tfring
