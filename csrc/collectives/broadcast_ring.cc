// Pipelined ring broadcast: the root sends the buffer to its right
// neighbour chunk by chunk; every other position receives and forwards each
// chunk as soon as it lands (its send step is chained to its receive step),
// except the root's left neighbour, where the ring ends. Time is about
// S/B + (N-2) * chunk/B, close to one transfer of the buffer.
#include "collectives/ring.h"
#include "collectives/ring_pipeline.h"

namespace tfring {
namespace collectives {

void ringBroadcast(RingComm& c, void* data, size_t bytes, int root_rank) {
  const int N = c.size;
  if (N == 1 || bytes == 0) {
    if (N > 1) {  // keep both channel ends aligned in lockstep
      c.right->align();
      c.left->align();
    }
    return;
  }
  int root_pos = 0;
  for (int i = 0; i < N; ++i)
    if (c.ring[i] == root_rank) root_pos = i;
  const int dist = ((c.pos - root_pos) % N + N) % N;  // hops from the root
  char* p = static_cast<char*>(data);
  RingProgram prog;
  if (dist > 0) prog.recvs.push_back({p, bytes, false, 1.0});
  if (dist < N - 1) prog.sends.push_back({p, bytes, dist == 0 ? -1 : 0});
  runRing(c, prog, "broadcast");
}

}  // namespace collectives
}  // namespace tfring
