// The non-power-of-two fold shared by the recursive allreduces
// (allreduce_recdbl.cc, allreduce_rabenseifner.cc). With p the largest power
// of two <= N and r = N - p (transport::recursiveLayout), each extra rank
// 2i (i < r) hands its whole buffer to rank 2i+1 before the recursive steps
// and gets the result back after them; rank 2i+1 reduces it in as
// op(extra rank's buffer, its own), the extra rank being the lower one.
#pragma once

#include <cstddef>

#include "collectives/allreduce.h"
#include "common/clock.h"
#include "transport/host_links.h"

namespace tfring {
namespace collectives {

// Step 0. An extra rank sends its buffer, waits for the result and returns
// false: its allreduce is complete. Every other rank returns true, its
// partner (if any) having reduced the extra rank's buffer into `buf`
// (through `tmp`, at least count elements of scratch).
inline bool recursiveFoldIn(transport::PeerLinks& P, const transport::RecursiveLayout& L,
                            char* buf, char* tmp, size_t count, DataType dtype, ReduceOp op,
                            const Deadline& deadline, const char* what, AllreduceStats* st) {
  const size_t bytes = count * dtypeSize(dtype);
  if (L.vrank < 0) {
    transport::PeerLink& f = P.to(L.fold_peer);
    transport::exchange(f, buf, bytes, nullptr, 0, deadline, what);
    transport::exchange(f, nullptr, 0, buf, bytes, deadline, what);
    st->bytes_sent = bytes;
    return false;
  }
  if (L.fold_peer >= 0) {
    transport::exchange(P.to(L.fold_peer), nullptr, 0, tmp, bytes, deadline, what);
    combineOrdered(buf, tmp, count, dtype, op, false);
  }
  return true;
}

// The last step: the partner of an extra rank sends it the result.
inline void recursiveFoldOut(transport::PeerLinks& P, const transport::RecursiveLayout& L,
                             const char* buf, size_t bytes, const Deadline& deadline,
                             const char* what, AllreduceStats* st) {
  if (L.fold_peer < 0) return;
  transport::exchange(P.to(L.fold_peer), buf, bytes, nullptr, 0, deadline, what);
  st->bytes_sent += bytes;
}

}  // namespace collectives
}  // namespace tfring
