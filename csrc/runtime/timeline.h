// Timeline: a Chrome / Perfetto trace (JSON array format) of what the engine
// does with each tensor: NEGOTIATE from enqueue until the coordinator
// schedules it, then the collective with its phases (fusion-buffer copies,
// a prescale into the outputs,
// the ring itself). Open it in chrome://tracing or ui.perfetto.dev.
// TFRING_TIMELINE=path writes rank 0's trace; a path containing "{rank}"
// writes one file per rank. A timeline may also be started and stopped while
// the job runs (tfring.start_timeline / stop_timeline): the engine threads
// and the caller's thread meet under one mutex, and enabled() is a relaxed
// flag the hot path reads without taking it.
#pragma once

#include <atomic>
#include <cstdio>
#include <map>
#include <mutex>
#include <string>

namespace tfring {
namespace runtime {

class Timeline {
 public:
  Timeline() = default;
  ~Timeline();
  // Starts writing to `path` (closing a trace already open); false when the
  // file cannot be created. A path without "{rank}" opens nothing on ranks
  // other than 0 (and returns true).
  bool open(const std::string& path, int rank);
  bool enabled() const { return on_.load(std::memory_order_relaxed); }
  void begin(const std::string& tensor, const std::string& phase);
  void end(const std::string& tensor);
  // An instant event on the tensor's row; `args_json` is a JSON object.
  void instant(const std::string& tensor, const std::string& name, const std::string& args_json);
  void close();

 private:
  int tid(const std::string& tensor);
  void emit(const std::string& json);
  void closeLocked();
  std::FILE* file_ = nullptr;
  std::atomic<bool> on_{false};
  std::mutex mu_;
  std::map<std::string, int> tids_;
  double t0_ = 0;
  int rank_ = 0;
  bool first_ = true;
};

}  // namespace runtime
}  // namespace tfring
