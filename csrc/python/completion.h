// Completion of one queued collective, shared by the engine thread (which
// finishes it) and the Python handle (which waits on it). Host and CUDA
// handles (runtime_binding.cc, gpu_binding.cc) both build on it.
#pragma once

#include <pybind11/pybind11.h>

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "common/status.h"
#include "python/errors.h"

namespace tfring {
namespace python {

struct Completion {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  Status status;

  // Engine thread: records the outcome and wakes the waiter.
  void finish(const Status& s) {
    std::lock_guard<std::mutex> lk(mu);
    status = s;
    done = true;
    cv.notify_all();
  }

  bool poll() {
    std::lock_guard<std::mutex> lk(mu);
    return done;
  }

  // Waits with the GIL released (timeout < 0: forever); raises the
  // collective's error, or a timeout, as a Python exception.
  void wait(double timeout) {
    bool finished;
    {
      pybind11::gil_scoped_release nogil;
      std::unique_lock<std::mutex> lk(mu);
      auto pred = [&] { return done; };
      if (timeout < 0) {
        cv.wait(lk, pred);
        finished = true;
      } else {
        finished = cv.wait_for(lk, std::chrono::duration<double>(timeout), pred);
      }
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
