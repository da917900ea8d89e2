#include "common/abort.h"

namespace tfring {

AbortState& AbortState::get() {
  static AbortState* s = new AbortState();  // never destroyed: used at exit
  return *s;
}

bool AbortState::abort(const Status& s) {
  std::function<void()> waker;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (aborted_.load()) return false;
    status_ = s;
    aborted_.store(true, std::memory_order_release);
    waker = waker_;
  }
  if (waker) waker();
  return true;
}

Status AbortState::status() const {
  std::lock_guard<std::mutex> lk(mu_);
  return status_;
}

void AbortState::setWaker(std::function<void()> waker) {
  std::lock_guard<std::mutex> lk(mu_);
  waker_ = std::move(waker);
}

void AbortState::reset() {
  std::lock_guard<std::mutex> lk(mu_);
  aborted_.store(false);
  status_ = Status();
  waker_ = nullptr;
}

}  // namespace tfring
