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
// cost (seconds per byte, averaged), then take the cheaper one and try
// the other every kExploreEvery calls so a change of placement is noticed
// within a few. Ranks run the same collectives in the same order, so their
// trials coincide. The choice is local to each rank (a reader does not
// care how its bytes were written), and changes only speed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>

namespace tfring {
namespace collectives {

class StoreTuner {
 public:
  static constexpr uint64_t kExploreEvery = 8;

  // Whether the next collective streams into the link.
  bool begin() {
    std::lock_guard<std::mutex> lk(mu_);
    const uint64_t call = calls_++;
    if (cost_[0] == 0 || cost_[1] == 0) return call % 2 == 1;
    const bool best = cost_[1] < cost_[0];
    return call % kExploreEvery == 0 ? !best : best;
  }

  // What that collective cost: `bytes` written into place in `seconds`.
  void end(bool streamed, double seconds, size_t bytes) {
    if (bytes == 0 || seconds <= 0) return;
    const double c = seconds / static_cast<double>(bytes);
    std::lock_guard<std::mutex> lk(mu_);
    double& e = cost_[streamed ? 1 : 0];
    e = e == 0 ? c : 0.5 * e + 0.5 * c;
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
  std::mutex mu_;
  double cost_[2] = {0, 0};
  uint64_t calls_ = 0;
};

}  // namespace collectives
}  // namespace tfring
