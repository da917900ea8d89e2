// Host-aware allreduce for jobs that span hosts with the same number L of
// ranks each: the hierarchical scheme for large buffers and the small-buffer
// scheme, which differ only in how shares cross hosts.
//
// Step s (bank b = s % 2), for each piece of at most one segment slot:
//   1. wait until every local rank is done reading bank b from step s - 2;
//      copy my input piece into my slot, publish arrive = s; wait for all.
//   2. Reduce-scatter through memory: the piece is split into L shares;
//      local rank l reduces share l over all slots, in local-rank order,
//      into the bank's result slot.
//   3. Across hosts, the ranks with local rank l (one per host, linked in a
//      TCP ring: HostLinks' cross ring) combine their hosts' share l. Every
//      local rank does this at the same time on its own connection, so all
//      cross-host links carry traffic at once.
//        hier:  a pipelined ring allreduce of the share (bandwidth optimal);
//        small: one ring allgather of the hosts' shares (H-1 steps, the
//               only latency on the wire), then every host reduces them in
//               host order.
//      Both leave bitwise identical shares on every host. The share's owner
//      applies the postscale and publishes ready = s. With a 16-bit wire
//      (float32 buffers), hier's cross-host ring carries 16-bit words and
//      accumulates in float32 (allreduce_ring.cc); small, whose few bytes
//      cost latency rather than bandwidth, and the shared memory stay at
//      float32.
//   4. Allgather through memory: wait until every local rank is ready, copy
//      the whole result slot to my output, publish done = s.
// A host with a single rank has no segment: its one rank owns the whole
// piece and only step 3 remains.
#include <algorithm>
#include <cstring>

#include "collectives/allreduce.h"
#include "kernels/cpu/reduce.h"

namespace tfring {
namespace collectives {

namespace {

// Step 3: combine `count` elements at `share` with the same share on every
// other host; the result replaces `share` on every host.
void crossHosts(RingComm& X, transport::HostLinks& H, char* share, size_t count,
                DataType dtype, ReduceOp op, double postscale, bool small, WireType wire) {
  const int nh = X.size;
  const size_t es = dtypeSize(dtype), bytes = count * es;
  if (nh == 1 || count == 0) {
    if (postscale != 1.0) kernels::scale(share, count, dtype, postscale);
    return;
  }
  if (!small) {
    ringAllreduce(X, share, share, count, dtype, op, postscale, wire);
    return;
  }
  if (H.scratch.size() < bytes * nh) H.scratch.resize(bytes * nh);
  char* all = H.scratch.data();
  std::memcpy(all + X.pos * bytes, share, bytes);
  ringAllgather(X, all, std::vector<size_t>(nh, bytes));
  kernels::reduce3(share, all, all + bytes, count, dtype, op);
  for (int h = 2; h < nh; ++h) kernels::reduce(share, all + h * bytes, count, dtype, op);
  if (postscale != 1.0) kernels::scale(share, count, dtype, postscale);
}

}  // namespace

void hierAllreduce(RingComm& c, const void* in, void* out, size_t count, DataType dtype,
                   ReduceOp op, double postscale, bool small, WireType wire) {
  transport::HostLinks& H = *c.host;
  transport::HostSegment* S = H.segment.get();
  using W = transport::HostRankWords;
  const int L = H.local_size;
  const int me = H.local_rank;
  const size_t es = dtypeSize(dtype);
  const size_t per = S ? std::max<size_t>(S->slotBytes() / es, 1) : count;
  const char* src = static_cast<const char*>(in);
  char* dst = static_cast<char*>(out);
  const Deadline deadline = Deadline::in(c.timeout_s);
  const char* what = small ? "allreduce (small, across hosts)" : "allreduce (hierarchical)";

  H.openCross();
  RingComm X;  // the cross ring: positions are host indices
  X.size = H.num_hosts;
  X.pos = H.cross_rank;
  for (int h = 0; h < X.size; ++h) X.ring.push_back(h);
  X.right = H.cross_send.get();
  X.left = H.cross_recv.get();
  X.waiter = H.cross_waiter.get();
  X.chunk_bytes = c.chunk_bytes;
  X.timeout_s = c.timeout_s;

  for (size_t off = 0; off < count; off += per) {
    const size_t n = std::min(per, count - off);
    const char* piece_in = src + off * es;
    char* piece_out = dst + off * es;
    if (!S) {  // one rank on this host: it owns the whole piece
      if (piece_out != piece_in) std::memcpy(piece_out, piece_in, n * es);
      crossHosts(X, H, piece_out, n, dtype, op, postscale, small, wire);
      continue;
    }
    const uint64_t s = ++H.step;
    const int b = static_cast<int>(s & 1);
    if (s > 2) S->waitAll(&W::done, s - 2, deadline, what, H.local_ranks);
    std::memcpy(S->slot(b, me), piece_in, n * es);
    S->publish(S->words(me).arrive, s);
    S->waitAll(&W::arrive, s, deadline, what, H.local_ranks);

    const auto shares = evenSplit(n, L);
    const size_t sh_off = shares[me] * es, sh_n = shares[me + 1] - shares[me];
    char* result = S->slot(b, L);
    if (sh_n) {
      char* mine = result + sh_off;
      kernels::reduce3(mine, S->slot(b, 0) + sh_off, S->slot(b, 1) + sh_off, sh_n, dtype, op);
      for (int q = 2; q < L; ++q) kernels::reduce(mine, S->slot(b, q) + sh_off, sh_n, dtype, op);
    }
    crossHosts(X, H, result + sh_off, sh_n, dtype, op, postscale, small, wire);
    S->publish(S->words(me).ready, s);
    S->waitAll(&W::ready, s, deadline, what, H.local_ranks);
    std::memcpy(piece_out, result, n * es);
    S->publish(S->words(me).done, s);
  }
}

}  // namespace collectives
}  // namespace tfring
