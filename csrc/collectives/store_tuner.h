// How a large collective writes into its right link: with ordinary stores,
// so the bytes wait in this core's cache for the neighbour to pull them,
// or with streaming stores, so the neighbour reads them from memory.
//
// Which is faster depends on where the two cores sit, and that can change
// while a job runs. Cores sharing a last-level cache hand lines over
// cheaply, and streaming only adds a trip to memory (on the 2-core VM, a
// 16 MiB allreduce at 2 ranks took 2.2 ms with ordinary stores and about
// 3.2 ms streaming). Cores far apart (other CCDs or sockets; on the VM, in
// phases of seconds to minutes) pull each cached line across the fabric at
// half the bandwidth or less (6-7.7 ms ordinary, 2.2-2.4 ms streaming).
//
// So each link measures: the collectives that stream their output
// (ring_pipeline.cc) alternate between the two modes until both have a
// cost (seconds per byte, averaged), then take the cheaper one. A trial of
// the other mode costs (up to 3x a call in the slow phase), so trials come
// every kMinInterval calls, doubling up to kMaxInterval each time a trial
// confirms the choice, back to kMinInterval when it flips; and at once
// when the chosen mode's cost jumps, as it does when placement changes (16
// to 51 ms per 128 MiB for ordinary stores, 18 to 25 ms for streaming).
// Calls of a few hundred KiB vary more from call to call, and a trial
// after every 1.3x step cost 10-15% in a fused step of 100 x 16 KiB; they
// take 2x (ordinary stores there rise 4-5x when placement changes). Ranks
// run the same collectives in the same order, so their trials mostly
// coincide. The choice is local to each rank (a reader does
// not care how its bytes were written), and changes only speed.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <mutex>

namespace tfring {
namespace collectives {

class StoreTuner {
 public:
  static constexpr uint64_t kMinInterval = 8, kMaxInterval = 128;

  // `jump`: the rise in the chosen mode's cost that calls a trial at once;
  // above the noise of the calls tuned (smaller collectives vary more).
  explicit StoreTuner(double jump) : jump_(jump) {}

  // Whether the next collective streams into the link.
  bool begin() {
    std::lock_guard<std::mutex> lk(mu_);
    const uint64_t call = calls_++;
    if (cost_[0] == 0 || cost_[1] == 0) return call % 2 == 1;
    const bool best = cost_[1] < cost_[0];
    if (call >= next_trial_ || jumped_) {
      jumped_ = false;
      next_trial_ = call + interval_;
      return !best;
    }
    return best;
  }

  // What that collective cost: `bytes` written into place in `seconds`.
  void end(bool streamed, double seconds, size_t bytes) {
    if (bytes == 0 || seconds <= 0) return;
    const double c = seconds / static_cast<double>(bytes);
    std::lock_guard<std::mutex> lk(mu_);
    const int m = streamed ? 1 : 0;
    if (cost_[0] == 0 || cost_[1] == 0) {
      cost_[m] = cost_[m] == 0 ? c : 0.5 * (cost_[m] + c);
      return;
    }
    const bool best_before = cost_[1] < cost_[0];
    if (streamed == best_before) {
      if (c > jump_ * cost_[m]) jumped_ = true;
      cost_[m] = 0.5 * (cost_[m] + c);
      return;
    }
    // A trial: a measured cost replaces the old one, which may be stale.
    cost_[m] = c;
    const bool best_after = cost_[1] < cost_[0];
    interval_ = best_after == best_before ? std::min(2 * interval_, kMaxInterval) : kMinInterval;
    next_trial_ = calls_ + interval_;
  }

  // For tests and the benchmarks: the averaged cost of each mode (0 while
  // unmeasured), and how many collectives asked.
  void snapshot(double* ordinary, double* streaming, uint64_t* calls) {
    std::lock_guard<std::mutex> lk(mu_);
    *ordinary = cost_[0];
    *streaming = cost_[1];
    *calls = calls_;
  }

 private:
  const double jump_;
  std::mutex mu_;
  double cost_[2] = {0, 0};
  uint64_t calls_ = 0;
  uint64_t interval_ = kMinInterval;
  uint64_t next_trial_ = kMinInterval;
  bool jumped_ = false;
};

}  // namespace collectives
}  // namespace tfring
