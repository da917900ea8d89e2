#include "common/abort.h"

#include <vector>

#include "common/clock.h"

namespace tfring {

bool AbortState::abort(const Status& s) {
  std::vector<std::function<void()>> wakers;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (aborted_.load()) return false;
    status_ = s;
    aborted_.store(true, std::memory_order_release);
    for (auto& kv : wakers_) wakers.push_back(kv.second);
  }
  for (auto& w : wakers) w();
  return true;
}

void AbortState::checkWaiting() {
  double until = waits_until_.load(std::memory_order_relaxed);
  if (until > 0 && nowSeconds() > until) {
    Status s;
    {
      std::lock_guard<std::mutex> lk(mu_);
      s = waits_status_;
    }
    abort(s);
  }
  check();
}

void AbortState::abortWaitsAfter(const Status& s, double seconds) {
  std::lock_guard<std::mutex> lk(mu_);
  if (waits_until_.load() > 0) return;
  waits_status_ = s;
  waits_until_.store(nowSeconds() + seconds);
}

Status AbortState::status() const {
  std::lock_guard<std::mutex> lk(mu_);
  return status_;
}

void AbortState::addWaker(const void* key, std::function<void()> waker) {
  std::lock_guard<std::mutex> lk(mu_);
  wakers_[key] = std::move(waker);
}

void AbortState::removeWaker(const void* key) {
  std::lock_guard<std::mutex> lk(mu_);
  wakers_.erase(key);
}

void AbortState::reset() {
  std::lock_guard<std::mutex> lk(mu_);
  aborted_.store(false);
  status_ = Status();
  waits_until_.store(0);
  waits_status_ = Status();
  wakers_.clear();
}

}  // namespace tfring
