// A communicator's failure state. The first error that dooms the
// communicator (a dead peer, a peer's report, a timeout inside one of its
// collectives) is recorded here with its message; every wait of its engine
// and links polls it, so one rank's failure reaches every member as the same
// error instead of a hang.
//
// Each communicator (the world, every process set) owns one, and its links
// and engine consult only theirs: a set that fails leaves the world and the
// other sets working. A dead process aborts each communicator it belongs
// to, because each notices the loss on its own connections (its
// coordinator's control links, its data links).
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <mutex>

#include "common/status.h"

namespace tfring {

class AbortState {
 public:
  bool aborted() const { return aborted_.load(std::memory_order_acquire); }
  // Records the first failure; later ones are ignored. Returns true if this
  // call was the first.
  bool abort(const Status& s);
  Status status() const;
  // Throws the recorded error if aborted.
  void check() const {
    if (aborted()) throw Error(status());
  }
  // Waits on peers (Waiter, host segment) call this instead of check(): it
  // also fails a wait that is still blocked after a deadline set by
  // abortWaitsAfter(). A rank that shut down cannot join collectives any
  // more, but bytes it sent before leaving may still be in flight, so the
  // waits that need it fail only after a grace period.
  void checkWaiting();
  void abortWaitsAfter(const Status& s, double seconds);
  // Called (once per abort) so sleeping waits wake up promptly; each
  // waiter (the engine) registers under its own key.
  void addWaker(const void* key, std::function<void()> waker);
  void removeWaker(const void* key);
  void reset();

 private:
  std::atomic<bool> aborted_{false};
  mutable std::mutex mu_;
  Status status_;
  std::map<const void*, std::function<void()>> wakers_;
  std::atomic<double> waits_until_{0};  // 0: no deadline
  Status waits_status_;
};

}  // namespace tfring
