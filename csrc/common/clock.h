// Deadlines: every blocking wait in the core takes one.
#pragma once

#include <chrono>

namespace tfring {

using Clock = std::chrono::steady_clock;

inline double nowSeconds() {
  return std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
}

struct Deadline {
  Clock::time_point at;
  static Deadline in(double seconds) {
    return Deadline{Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                       std::chrono::duration<double>(seconds))};
  }
  bool expired() const { return Clock::now() >= at; }
  double remaining() const {
    return std::chrono::duration<double>(at - Clock::now()).count();
  }
};

}  // namespace tfring
