// Completion of one queued collective, shared by the engine thread (which
// finishes it) and the Python handle (which waits on it). Host and CUDA
// handles (runtime_binding.cc, gpu_arrays.cc) both build on it.
#pragma once

#include <pybind11/pybind11.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>

#include "common/clock.h"
#include "common/status.h"
#include "python/errors.h"
#include "runtime/runtime.h"

namespace tfring {
namespace python {

struct Completion {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::atomic<bool> flag{false};  // `done`, readable without the lock
  Status status;
  int process_set = 0;  // whose engine wait() drives

  // Whoever drives the engine: records the outcome and wakes the waiter.
  void finish(const Status& s) {
    std::lock_guard<std::mutex> lk(mu);
    status = s;
    done = true;
    flag.store(true, std::memory_order_release);
    cv.notify_all();
  }

  bool poll() { return flag.load(std::memory_order_acquire); }

  // Waits with the GIL released (timeout < 0: forever); raises the
  // collective's error, or a timeout, as a Python exception. The waiting
  // thread drives the engine itself when no other thread does, so the
  // result reaches it without a thread switch.
  void wait(double timeout) {
    // Finished already (the usual case for all but the first handle of a
    // batch): no GIL hand-off, no clock, no engine hand-over.
    if (flag.load(std::memory_order_acquire)) {
      if (!status.ok()) throwStatus(status);
      return;
    }
    bool finished;
    {
      pybind11::gil_scoped_release nogil;
      Deadline deadline = Deadline::in(timeout < 0 ? 1e9 : timeout);
      runtime::drive(
          [&] { return flag.load(std::memory_order_acquire) || deadline.expired(); },
          [&] {
            std::unique_lock<std::mutex> lk(mu);
            cv.wait_for(lk, std::chrono::microseconds(500), [&] { return done; });
          },
          process_set);
      finished = flag.load(std::memory_order_acquire);
    }
    if (!finished)
      throwStatus(Status(Code::kTimeout, strCat("collective did not finish within ", timeout, " s")));
    if (!status.ok()) throwStatus(status);
  }

  // Destructor path: the engine may still be reading the caller's buffers.
  void waitQuietly() {
    pybind11::gil_scoped_release nogil;
    std::unique_lock<std::mutex> lk(mu);
    cv.wait(lk, [&] { return done; });
  }
};

}  // namespace python
}  // namespace tfring
