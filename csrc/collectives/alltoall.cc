// Ring alltoall: every rank sends block (s -> d) of its input to rank d,
// with blocks of any size (zero included), over the ring's links only.
//
// Protocol, in ring positions (p = my position, N positions, distances mod
// N). The block from position s to position d travels d - s hops to the
// right. In step k (0 <= k < N-1) position p:
//   * sends the bundle that started at position p-k: the blocks for
//     destinations p+1, p+2, ..., p+N-1-k, in that order (step 0: its own
//     input blocks, every destination but itself);
//   * receives the bundle that started at position p-1-k: the blocks for
//     destinations p, p+1, ..., p+N-2-k. The first is mine and is received
//     straight into the output; the rest lands in a staging area and is the
//     bundle position p sends in step k+1, chained to this receive so it is
//     forwarded chunk by chunk as it arrives (runRing's pipelining).
// Every rank knows every block's size (the splits matrix agreed during
// negotiation), so bundle sizes need no header. The block for myself is a
// local copy. Each step carries at least the ring's alignment, so ranks
// whose blocks are all empty still move in lockstep.
//
// Cost: a block travelling h hops is sent h times, so each link carries
// about (N-1)/2 times the data of a direct pairwise exchange. The ring links
// are what every job has (shared memory or TCP to one neighbour each); the
// extra volume is the price of needing no other connection.
#include <cstring>

#include "collectives/ring.h"
#include "collectives/ring_pipeline.h"

namespace tfring {
namespace collectives {

void ringAlltoall(RingComm& c, const void* in, void* out, const std::vector<size_t>& bytes) {
  const int N = c.size;
  const int me = c.ring[c.pos];
  auto B = [&](int src_rank, int dst_rank) { return bytes[src_rank * N + dst_rank]; };
  // Input blocks in destination rank order, output blocks in source order.
  std::vector<size_t> in_off(N + 1, 0), out_off(N + 1, 0);
  for (int r = 0; r < N; ++r) {
    in_off[r + 1] = in_off[r] + B(me, r);
    out_off[r + 1] = out_off[r] + B(r, me);
  }
  const char* src = static_cast<const char*>(in);
  char* dst = static_cast<char*>(out);
  if (B(me, me)) std::memmove(dst + out_off[me], src + in_off[me], B(me, me));
  if (N == 1) return;
  auto rankAt = [&](int pos) { return c.ring[((pos % N) + N) % N]; };

  // Staging for the bundles forwarded in steps 1..N-2.
  std::vector<size_t> stage_off(N, 0);
  for (int k = 0; k < N - 1; ++k) {
    size_t b = 0;
    const int s = rankAt(c.pos - 1 - k);
    for (int j = 1; j <= N - 2 - k; ++j) b += B(s, rankAt(c.pos + j));
    stage_off[k + 1] = stage_off[k] + b;
  }
  std::vector<char> stage(stage_off[N - 1]);

  RingProgram prog;
  for (int j = 1; j <= N - 1; ++j) {
    const int d = rankAt(c.pos + j);
    prog.sends.push_back({src + in_off[d], B(me, d), -1});
  }
  for (int k = 0; k < N - 1; ++k) {
    const int s = rankAt(c.pos - 1 - k);
    prog.recvs.push_back({dst + out_off[s], B(s, me), false, 1.0, nullptr});
    const size_t fwd = stage_off[k + 1] - stage_off[k];
    prog.recvs.push_back({stage.data() + stage_off[k], fwd, false, 1.0, nullptr});
    if (k + 1 < N - 1)
      prog.sends.push_back({stage.data() + stage_off[k], fwd,
                            static_cast<int>(prog.recvs.size()) - 1});
  }
  runRing(c, prog, "alltoall");
}

}  // namespace collectives
}  // namespace tfring
