// One-shot allreduce on one host, through the host segment
// (transport/shm/host_segment.h).
//
// Step s (bank b = s % 2), for each piece of at most one slot:
//   1. wait until every local rank is done reading bank b from step s - 2;
//   2. copy my input piece into my slot of bank b, publish arrive = s;
//   3. wait until every local rank has arrived at s;
//   4. reduce all slots, in local-rank order, into my output (so every rank
//      computes the same operations in the same order: bitwise identical
//      results), publish done = s, then apply the postscale.
// One synchronisation per piece instead of the ring's 2(N-1) dependent
// steps; each rank reads N slots, which is cheap while buffers are small.
#include <algorithm>
#include <cstring>

#include "collectives/allreduce.h"
#include "kernels/cpu/reduce.h"

namespace tfring {
namespace collectives {

void oneshotAllreduce(RingComm& c, const void* in, void* out, size_t count, DataType dtype,
                      ReduceOp op, double postscale) {
  transport::HostLinks& H = *c.host;
  transport::HostSegment& S = *H.segment;
  using W = transport::HostRankWords;
  const int L = S.localSize();
  const int me = H.local_rank;
  const size_t es = dtypeSize(dtype);
  const size_t per = std::max<size_t>(S.slotBytes() / es, 1);
  const char* src = static_cast<const char*>(in);
  char* dst = static_cast<char*>(out);
  const Deadline deadline = Deadline::in(c.timeout_s);
  const char* what = "allreduce (one-shot, shared memory)";

  for (size_t off = 0; off < count; off += per) {
    const size_t n = std::min(per, count - off);
    const uint64_t s = ++H.step;
    const int b = static_cast<int>(s & 1);
    if (s > 2) S.waitAll(&W::done, s - 2, deadline, what, H.local_ranks);
    std::memcpy(S.slot(b, me), src + off * es, n * es);
    S.publish(S.words(me).arrive, s);
    S.waitAll(&W::arrive, s, deadline, what, H.local_ranks);
    char* o = dst + off * es;
    kernels::reduce3(o, S.slot(b, 0), S.slot(b, 1), n, dtype, op);
    for (int q = 2; q < L; ++q) kernels::reduce(o, S.slot(b, q), n, dtype, op);
    S.publish(S.words(me).done, s);
    if (postscale != 1.0) kernels::scale(o, n, dtype, postscale);
  }
}

}  // namespace collectives
}  // namespace tfring
