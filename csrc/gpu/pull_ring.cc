#include "gpu/pull_ring.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <thread>

#include "collectives/ring.h"
#include "common/abort.h"
#include "common/tunables.h"
#include "common/status.h"
#include "kernels/cpu/reduce.h"
#include "transport/shm/shm_channel.h"

namespace tfring {
namespace gpu {

namespace {

int mod(int a, int n) { return ((a % n) + n) % n; }

}  // namespace

// Same segment walk as collectives/allreduce_ring.cc: reduce-scatter step k
// receives segment (p-k-1), allgather step k receives segment (p-k).
PullProgram pullAllreduce(int n, int pos, size_t count, size_t esize, double postscale) {
  PullProgram prog;
  if (n == 1) return prog;
  auto off = collectives::evenSplit(count, n);
  auto seg = [&](int i, PullStep s) {
    i = mod(i, n);
    s.offset = off[i] * esize;
    s.bytes = (off[i + 1] - off[i]) * esize;
    return s;
  };
  for (int k = 0; k < n - 1; ++k) {
    PullStep s;
    s.reduce = true;
    s.scale = k == n - 2 ? postscale : 1.0;
    s.src_step = k == 0 ? -1 : k - 1;
    prog.steps.push_back(seg(pos - k - 1, s));
  }
  for (int k = 0; k < n - 1; ++k) {
    PullStep s;
    s.src_step = n - 1 + k - 1;
    prog.steps.push_back(seg(pos - k, s));
  }
  return prog;
}

// collectives/reducescatter_ring.cc: segment i is the block of the rank at
// position i-1, so position p ends owning its own rank's block.
PullProgram pullReducescatter(int n, int pos, const std::vector<int>& ring,
                              const std::vector<size_t>& rank_counts, size_t esize,
                              double postscale) {
  PullProgram prog;
  if (n == 1) return prog;
  std::vector<size_t> off(n + 1, 0);
  for (int r = 0; r < n; ++r) off[r + 1] = off[r] + rank_counts[r];
  for (int k = 0; k < n - 1; ++k) {
    int rank = ring[mod(pos - k - 1 - 1, n)];
    PullStep s;
    s.offset = off[rank] * esize;
    s.bytes = rank_counts[rank] * esize;
    s.reduce = true;
    s.scale = k == n - 2 ? postscale : 1.0;
    s.src_step = k == 0 ? -1 : k - 1;
    prog.steps.push_back(s);
  }
  return prog;
}

// collectives/allgather_ring.cc: step k receives the block of position
// (p-1-k).
PullProgram pullAllgather(int n, int pos, const std::vector<int>& ring,
                          const std::vector<size_t>& rank_bytes) {
  PullProgram prog;
  if (n == 1) return prog;
  std::vector<size_t> off(n + 1, 0);
  for (int r = 0; r < n; ++r) off[r + 1] = off[r] + rank_bytes[r];
  for (int k = 0; k < n - 1; ++k) {
    int rank = ring[mod(pos - 1 - k, n)];
    PullStep s;
    s.offset = off[rank];
    s.bytes = rank_bytes[rank];
    s.src_step = k == 0 ? -1 : k - 1;
    prog.steps.push_back(s);
  }
  return prog;
}

// Every position but the root copies the whole buffer from its left, chunk
// by chunk, as soon as the left has it.
PullProgram pullBroadcast(int n, int pos, int root_pos, size_t bytes) {
  PullProgram prog;
  int dist = mod(pos - root_pos, n);
  if (n == 1 || dist == 0) return prog;
  PullStep s;
  s.bytes = bytes;
  s.src_step = dist == 1 ? -1 : 0;
  prog.steps.push_back(s);
  return prog;
}

void waitForPeer(const std::function<bool()>& ready, const Deadline& deadline, int peer_rank,
                 int peer_pid, const std::string& what, AbortState* abort,
                 const RankLabels* labels) {
  if (ready()) return;
  uint64_t rounds = 0;
  double next_check = nowSeconds() + 0.2;
  for (;;) {
    if (ready()) return;
    ++rounds;
    if (rounds < 512) {
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#endif
      continue;
    }
    if (abort) abort->check();
    if (rounds < 1024) {
      sched_yield();
    } else {
      usleep(rounds < 4096 ? 20 : 200);
    }
    double now = nowSeconds();
    if (now >= next_check) {
      next_check = now + 0.2;
      const int label = labels ? (*labels)(peer_rank) : peer_rank;
      if (!transport::pidAlive(peer_pid))
        failPeer(peer_rank, strCat("pid ", peer_pid), "rank ", label, " (pid ", peer_pid,
                 ") died during ", what);
      if (deadline.expired())
        fail(Code::kTimeout, "timed out in ", what, " waiting for rank ", label,
             " (TFRING_TIMEOUT; a peer may be stuck or much slower)");
    }
  }
}

void runPull(const PullRun& run, PullDevice& dev, PullState& st) {
  const int n = run.n;
  const size_t es = std::max<size_t>(run.esize, 1);
  const uint64_t E = static_cast<uint64_t>(std::max(run.num_events, 2));
  if (st.slot_unit.size() != E) st.slot_unit.assign(E, kNoUnit);

  const PullProgram me = run.program(run.pos);
  const PullProgram left = run.program(mod(run.pos - 1, n));
  const PullProgram right = run.program(mod(run.pos + 1, n));
  std::vector<PullProgram> all(n);
  size_t max_step = 0;
  for (int p = 0; p < n; ++p) {
    all[p] = p == run.pos ? me : run.program(p);
    for (auto& s : all[p].steps) max_step = std::max(max_step, s.bytes);
  }
  // No step may have more than E/2 chunks (see the header: event slots),
  // so large buffers get larger chunks. Every rank computes the same size.
  size_t ch = std::max(run.chunk_bytes, (max_step + E / 2 - 1) / (E / 2));
  ch = std::max(es, ch - ch % es);
  auto nchunks = [&](size_t bytes) { return (bytes + ch - 1) / ch; };
  auto unitStarts = [&](const PullProgram& p) {
    std::vector<uint64_t> start(p.steps.size() + 1, 1);
    for (size_t j = 0; j < p.steps.size(); ++j) start[j + 1] = start[j] + nchunks(p.steps[j].bytes);
    return start;
  };

  const auto my_start = unitStarts(me), left_start = unitStarts(left);
  // Which of my units the right neighbour reads, hence needs events.
  bool fwd_input = false;
  std::vector<bool> fwd(me.steps.size(), false);
  for (auto& s : right.steps) {
    if (s.src_step < 0) fwd_input = true;
    else if (s.src_step < static_cast<int>(fwd.size())) fwd[s.src_step] = true;
  }
  // Units per collective: the same on every rank.
  uint64_t units = 1;
  for (int p = 0; p < n; ++p) {
    uint64_t t = 1;
    for (auto& s : all[p].steps) t += nchunks(s.bytes);
    units = std::max(units, t);
  }

  const uint64_t base = st.unit_base;
  const Deadline deadline = Deadline::in(run.timeout_s);
  const std::string what = strCat(run.what, " (GPU ring)");
  PullCounters* self = run.self;
  const PullCounters* L = run.left;
  const PullCounters* R = run.right;

  auto recordUnit = [&](uint64_t u) {
    const uint64_t g = base + u;
    uint64_t& prev = st.slot_unit[g % E];
    if (prev != kNoUnit)  // the right must have waited on the slot's last use
      waitForPeer([&] { return R->waited.load(std::memory_order_acquire) >= prev + 1; },
                  deadline, run.right_rank, R->pid, what, run.abort, run.labels);
    dev.record(g);
    prev = g;
  };
  auto publish = [&](uint64_t u) { self->progress.store(base + u + 1, std::memory_order_release); };

  if (fwd_input) recordUnit(0);
  publish(0);
  for (size_t j = 0; j < me.steps.size(); ++j) {
    const PullStep& s = me.steps[j];
    if (s.src_step >= 0 && left.steps[s.src_step].bytes != s.bytes)
      fail(Code::kInternal, "GPU ring schedule: step ", j, " is ", s.bytes,
           " bytes but the left's step ", s.src_step, " is ", left.steps[s.src_step].bytes);
    const uint64_t n_ch = nchunks(s.bytes);
    for (uint64_t c = 0; c < n_ch; ++c) {
      const size_t off = s.offset + c * ch;
      const size_t b = std::min(ch, s.bytes - c * ch);
      const uint64_t dep = base + (s.src_step < 0 ? 0 : left_start[s.src_step] + c);
      waitForPeer([&] { return L->progress.load(std::memory_order_acquire) >= dep + 1; },
                  deadline, run.left_rank, L->pid, what, run.abort, run.labels);
      dev.waitLeft(dep);
      if (self->waited.load(std::memory_order_relaxed) < dep + 1)
        self->waited.store(dep + 1, std::memory_order_release);
      if (s.reduce) dev.reduce(off, b, s.scale);
      else dev.copy(off, b);
      const uint64_t u = my_start[j] + c;
      if (fwd[j]) recordUnit(u);
      publish(u);
    }
  }

  dev.recordDone();
  self->done_epoch.store(st.epoch + 1, std::memory_order_release);
  waitForPeer([&] { return R->done_epoch.load(std::memory_order_acquire) >= st.epoch + 1; },
              deadline, run.right_rank, R->pid, what, run.abort, run.labels);
  dev.waitRightDone();
  // Nothing more of this collective will be waited on or published.
  if (self->waited.load(std::memory_order_relaxed) < base + units)
    self->waited.store(base + units, std::memory_order_release);
  self->progress.store(base + units, std::memory_order_release);
  st.unit_base = base + units;
  st.epoch += 1;
}

// ------------------------------------------------------------ emulation ----

namespace {

// Host "device": operations run at once, so a unit is complete when it is
// recorded and events need no state.
class HostDevice : public PullDevice {
 public:
  HostDevice(char* mine, const char* left, DataType dt, ReduceOp op)
      : mine_(mine), left_(left), dt_(dt), op_(op) {}
  void waitLeft(uint64_t) override {}
  void record(uint64_t) override {}
  void reduce(size_t off, size_t bytes, double scale) override {
    size_t n = bytes / dtypeSize(dt_);
    kernels::reduce(mine_ + off, left_ + off, n, dt_, op_);
    if (scale != 1.0) kernels::scale(mine_ + off, n, dt_, scale);
  }
  void copy(size_t off, size_t bytes) override { std::memcpy(mine_ + off, left_ + off, bytes); }
  void recordDone() override {}
  void waitRightDone() override {}

 private:
  char* mine_;
  const char* left_;
  DataType dt_;
  ReduceOp op_;
};

}  // namespace

std::vector<std::vector<char>> emulatePullRing(const std::string& kind,
                                               const std::vector<int>& ring,
                                               const std::vector<std::vector<char>>& inputs,
                                               DataType dtype, ReduceOp op, double postscale,
                                               int root, const std::vector<size_t>& rank_counts,
                                               size_t chunk_bytes, int num_events, int repeats) {
  const int n = static_cast<int>(ring.size());
  if (static_cast<int>(inputs.size()) != n)
    fail(Code::kInvalidArgument, "need one input per rank: ", inputs.size(), " vs ", n);
  std::vector<int> pos_of(n);
  for (int p = 0; p < n; ++p) pos_of[ring[p]] = p;
  const size_t es = dtypeSize(dtype);
  std::vector<size_t> block_off(n + 1, 0);
  if (kind == "allgather" || kind == "reducescatter")
    for (int r = 0; r < n; ++r) block_off[r + 1] = block_off[r] + rank_counts[r];

  std::function<PullProgram(int)> program;
  size_t buf_bytes = 0;
  if (kind == "allreduce") {
    buf_bytes = inputs[0].size();
    program = [=](int p) { return pullAllreduce(n, p, buf_bytes / es, es, postscale); };
  } else if (kind == "reducescatter") {
    buf_bytes = block_off[n] * es;
    program = [=](int p) { return pullReducescatter(n, p, ring, rank_counts, es, postscale); };
  } else if (kind == "allgather") {
    buf_bytes = block_off[n];
    program = [=](int p) { return pullAllgather(n, p, ring, rank_counts); };
  } else if (kind == "broadcast") {
    buf_bytes = inputs[0].size();
    program = [=](int p) { return pullBroadcast(n, p, pos_of[root], buf_bytes); };
  } else {
    fail(Code::kInvalidArgument, "unknown collective '", kind, "'");
  }

  std::vector<PullCounters> counters(n);
  for (int r = 0; r < n; ++r) {
    counters[r].pid = static_cast<int32_t>(getpid());
    counters[r].rank = r;
  }
  std::vector<std::vector<char>> bufs(n, std::vector<char>(buf_bytes));
  std::vector<Status> errors(n);
  // The emulated ranks' communicator: one failing ends the others' waits.
  AbortState emu_abort;
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        const int p = pos_of[r];
        const int lr = ring[mod(p - 1, n)], rr = ring[mod(p + 1, n)];
        PullState st;
        for (int rep = 0; rep < repeats; ++rep) {
          // Each repetition starts from the inputs again, like a new tensor.
          std::vector<char>& b = bufs[r];
          if (kind == "allgather") {
            if (rank_counts[r]) std::memcpy(b.data() + block_off[r], inputs[r].data(), rank_counts[r]);
          } else if (kind == "broadcast") {
            if (r == root && buf_bytes) std::memcpy(b.data(), inputs[r].data(), buf_bytes);
          } else if (buf_bytes) {
            std::memcpy(b.data(), inputs[r].data(), buf_bytes);
          }
          // Reloading is safe: the previous round ended with the right's
          // done, so nobody reads b any more.
          if (n == 1) continue;
          PullRun run;
          run.program = program;
          run.n = n;
          run.pos = p;
          run.left_rank = lr;
          run.right_rank = rr;
          run.esize = kind == "allgather" || kind == "broadcast" ? 1 : es;
          run.chunk_bytes = chunk_bytes;
          run.num_events = num_events;
          run.self = &counters[r];
          run.left = &counters[lr];
          run.right = &counters[rr];
          // The emulation's own bound unless TFRING_TIMEOUT is set.
          run.timeout_s = tunables::isSet("TFRING_TIMEOUT")
                              ? tunables::getDouble("TFRING_TIMEOUT")
                              : 60;
          run.what = "emulated collective";
          run.abort = &emu_abort;
          HostDevice dev(b.data(), bufs[lr].data(), dtype, op);
          runPull(run, dev, st);
        }
      } catch (const Error& e) {
        errors[r] = e.status();
        emu_abort.abort(e.status());
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& s : errors)
    if (!s.ok()) throw Error(s);
  return bufs;
}

}  // namespace gpu
}  // namespace tfring
