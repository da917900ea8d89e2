// The pull ring: tfring's ring collectives between GPUs of one host (or
// several ranks sharing one GPU), through CUDA IPC.
//
// Data. For each collective every rank exposes one device buffer (the tensor
// itself when CUDA IPC can export it, else a staging copy) and maps its left
// neighbour's. Nobody writes into another rank's memory: a receive step is a
// kernel on the receiver that reads the sender's bytes where they lie
// (reduce: mine = op(mine, left) [* scale]; copy: mine = left). Segments sit
// at the same offsets on every rank, so "what the left sent in its step j"
// is simply the left's buffer at my step's offset once the left has
// finished its step j-1. The step structure is exactly the CPU ring's
// (collectives/*_ring.cc): reduce-scatter then allgather, 2(N-1) steps, each
// rank reading 2(N-1)/N of the buffer from its neighbour.
//
// Order. Each rank numbers its work in units: unit 0 is "my input is in
// place", then every chunk of every step, in program order. After a unit
// that its right neighbour will read, a rank records one of its IPC events
// on its stream and then publishes progress = unit + 1 in its control block
// (host shared memory). Before a chunk, the receiver waits on the host until
// the left's progress covers the unit it depends on, makes its stream wait
// on the left's event for that unit (the host never blocks on the GPU), and
// publishes `waited`. Events are reused round-robin: a rank re-records event
// slot s only once its right neighbour has waited on the previous use of s.
// Unit numbers start from a base that every rank advances by the same amount
// after each collective, so counters never reset.
//
// Why it cannot deadlock. Order the places a rank can block by (collective,
// step, chunk). A chunk of step j waits for the left's step j-1 (or unit 0):
// an earlier step. Recording unit g in slot g % E waits until the right has
// waited on the slot's previous unit, at most g - E; with at most E/2 chunks
// per step (runPull enlarges chunks to ensure it) that unit lies in an
// earlier step at a smaller chunk index, which the right reads in its step j
// at that smaller index. Either way the rank we wait for is blocked, if at
// all, strictly earlier in that order, so following waits around the ring
// can never come back to us. (The first version reused slots after "the
// right waited on unit g - E" with unbounded chunks per step; two neighbours
// could then each wait for the other to consume its events.)
//
// End. A rank records its done event and publishes done_epoch, then waits
// (host, then stream) for its right neighbour's done: only then has the right
// finished reading this rank's buffer, so the tensor can be handed back.
//
// This file has no CUDA: the device side is the PullDevice interface
// (gpu/cuda/ipc_ring.cc implements it with streams and IPC events), so the
// schedule and the counter protocol also run on the CPU with threads
// (emulatePullRing, used by tests/gpu/test_gpu.py on machines without a GPU).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/abort.h"
#include "common/clock.h"
#include "common/rank_labels.h"
#include "common/types.h"

namespace tfring {
namespace gpu {

struct PullStep {
  size_t offset = 0;  // byte range of the buffer, identical on every rank
  size_t bytes = 0;
  bool reduce = false;  // mine = op(mine, left) else mine = left
  double scale = 1.0;   // applied after reducing (last reduce-scatter step)
  int src_step = -1;    // the left's step that produced these bytes; -1: its input
};

struct PullProgram {
  std::vector<PullStep> steps;
};

// Programs for ring position `pos` of `n`; `ring` maps positions to ranks.
PullProgram pullAllreduce(int n, int pos, size_t count, size_t esize, double postscale);
PullProgram pullReducescatter(int n, int pos, const std::vector<int>& ring,
                              const std::vector<size_t>& rank_counts, size_t esize,
                              double postscale);
PullProgram pullAllgather(int n, int pos, const std::vector<int>& ring,
                          const std::vector<size_t>& rank_bytes);
PullProgram pullBroadcast(int n, int pos, int root_pos, size_t bytes);

// One rank's counters, in memory its neighbours map (64-byte lines apart:
// each is written by one process only).
struct alignas(64) PullCounters {
  std::atomic<uint64_t> progress{0};               // my units done (+1)
  alignas(64) std::atomic<uint64_t> waited{0};     // left's units I waited on (+1)
  alignas(64) std::atomic<uint64_t> done_epoch{0};  // collectives I recorded done
  alignas(64) std::atomic<uint64_t> desc_epoch{0};  // collective my buffer desc is for
  alignas(64) int32_t pid = 0;
  int32_t rank = 0;
};

// What the pull loop asks of the device; every call is queued in order on
// one stream.
class PullDevice {
 public:
  virtual ~PullDevice() = default;
  virtual void waitLeft(uint64_t unit) = 0;  // the left has published `unit`
  virtual void record(uint64_t unit) = 0;    // my unit `unit` is complete
  virtual void reduce(size_t offset, size_t bytes, double scale) = 0;
  virtual void copy(size_t offset, size_t bytes) = 0;
  virtual void recordDone() = 0;
  virtual void waitRightDone() = 0;  // the right has published done
};

struct PullRun {
  std::function<PullProgram(int pos)> program;  // any position's program
  int n = 1, pos = 0;
  int left_rank = 0, right_rank = 0;
  size_t esize = 1;       // element size: chunks hold whole elements
  size_t chunk_bytes = 4 << 20;
  int num_events = 64;    // event slots per rank
  PullCounters* self = nullptr;
  const PullCounters* left = nullptr;
  const PullCounters* right = nullptr;
  double timeout_s = 300;
  const char* what = "collective";
  AbortState* abort = nullptr;  // the communicator's failure state
  const RankLabels* labels = nullptr;  // how messages name ranks; null: as they are
};

// Kept across collectives. unit_base and epoch are identical on every rank
// between collectives; slot_unit[s] is the last unit recorded in event slot s.
constexpr uint64_t kNoUnit = ~0ull;
struct PullState {
  uint64_t unit_base = 0;
  uint64_t epoch = 0;
  std::vector<uint64_t> slot_unit;
};

void runPull(const PullRun& run, PullDevice& dev, PullState& st);

// Host wait for a neighbour: spins, then yields, then sleeps briefly,
// checking the deadline, the communicator's abort state (`abort`, may be
// null) and that `peer_pid` lives. `peer_rank` is the peer's place in the
// communicator; its errors name it as `labels` does (null: the place).
void waitForPeer(const std::function<bool()>& ready, const Deadline& deadline, int peer_rank,
                 int peer_pid, const std::string& what, AbortState* abort,
                 const RankLabels* labels);

// Test hook: runs `repeats` collectives of `kind` ("allreduce", "allgather",
// "broadcast", "reducescatter") on one thread per rank over host memory,
// with the same programs, counters and event-slot rules as the GPU, and
// returns each rank's final buffer. `ring` is the ring order of ranks;
// allgather takes each rank's block in inputs[r] and `rank_counts` in
// bytes; reducescatter takes rank_counts in elements and returns the whole
// work buffer.
std::vector<std::vector<char>> emulatePullRing(const std::string& kind,
                                               const std::vector<int>& ring,
                                               const std::vector<std::vector<char>>& inputs,
                                               DataType dtype, ReduceOp op, double postscale,
                                               int root, const std::vector<size_t>& rank_counts,
                                               size_t chunk_bytes, int num_events, int repeats);

}  // namespace gpu
}  // namespace tfring
