// Ring allgather: N-1 steps. Position p first sends its own block; in step k
// it receives the block of position (p-1-k) and, in step k+1, forwards that
// same block to the right (chained, so forwarding starts with the first
// chunk that arrives). Blocks may differ in size per rank.
#include "collectives/ring.h"
#include "collectives/ring_pipeline.h"

namespace tfring {
namespace collectives {

void ringAllgather(RingComm& c, void* out, const std::vector<size_t>& rank_bytes) {
  const int N = c.size;
  if (N == 1) return;
  std::vector<size_t> off(N + 1, 0);  // byte offsets in rank order
  for (int r = 0; r < N; ++r) off[r + 1] = off[r] + rank_bytes[r];
  char* base = static_cast<char*>(out);
  auto block = [&](int pos) {
    int rank = c.ring[((pos % N) + N) % N];
    return std::make_pair(base + off[rank], rank_bytes[rank]);
  };
  RingProgram prog;
  for (int k = 0; k < N - 1; ++k) {
    auto s = block(c.pos - k), r = block(c.pos - 1 - k);
    prog.sends.push_back({s.first, s.second, k == 0 ? -1 : k - 1});
    prog.recvs.push_back({r.first, r.second, false, 1.0});
  }
  runRing(c, prog, "allgather");
}

}  // namespace collectives
}  // namespace tfring
