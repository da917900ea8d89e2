// Engine: the per-process progress engine that owns the ring links.
//
// Callers (TF kernels, the Python binding) enqueue named Requests from any
// thread. Work only moves when some thread "drives" the engine: the
// background engine thread by default, or a caller that blocks on its own
// result (drive()), which then runs the protocol itself so that its result
// arrives without a thread switch. One driver at a time (drive_mu_).
//
// The Engine is the driver loop only; the parts it drives are objects of
// their own:
//   Inbox (inbox.h)          what submitters, the coordinator's messages
//                            and the driver share;
//   CtrlLink (ctrl_link.h)   the connection to the coordinator on rank 0;
//   Agreement (agreement.h)  the rounds in which all ranks agree on what
//                            runs next, with the vote (vote_words.h,
//                            vote_channel.h), the fresh names
//                            (fresh_names.h) and the rider (rider.h);
//   Executor (executor.h)    runs an agreed group on host or GPU buffers;
//   IdleWait (idle_wait.h)   waits for the next round without a fixed sleep.
// A rank starts a round when it has news (new tensors, a new response, an
// aged tensor) and joins one when bytes of a peer's vote arrive.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "collectives/ring.h"
#include "runtime/agreement.h"
#include "runtime/ctrl_link.h"
#include "runtime/entry.h"
#include "runtime/executor.h"
#include "runtime/idle_wait.h"
#include "runtime/inbox.h"
#include "runtime/messages.h"
#include "runtime/runtime.h"
#include "runtime/timeline.h"
#include "transport/ring_links.h"

namespace tfring {
namespace runtime {

class Coordinator;

class Engine {
 public:
  // ctrl_fd: the connection to the coordinator, or -1 on rank 0, whose
  // coordinator lives in this process (`local`).
  Engine(std::unique_ptr<transport::RingLinks> links, int ctrl_fd, Coordinator* local,
         const Config& cfg);
  ~Engine();
  void start();
  // Queues the requests as one batch: all are accepted or none is (then
  // the error is returned and no callback runs).
  Status enqueue(std::vector<Request> reqs, std::vector<DoneCallback> dones);
  // Drives the engine on the calling thread until done() is true (or, when
  // another thread drives, waits for it). `wait` is called to sleep a little
  // while another thread drives; it returns early once done.
  void drive(const std::function<bool()>& done, const std::function<void()>& wait);
  // Runs the protocol on the calling thread while there is something to do
  // right now, if no other thread drives; never waits for work. Submitters
  // call it after enqueue so a ready tensor starts without waking the
  // engine thread.
  void tryDrive();
  // Says goodbye to the coordinator, fails what is still queued, joins.
  void stop();
  // Every rank of this ring is about to stop (a process set is removed):
  // refuses new work, and a peer's goodbye that arrives before stop() is
  // expected rather than a reason to fail waits.
  void expectStop();
  // A message from the coordinator on rank 0 (its own thread).
  void onCtrlMessage(const std::vector<uint8_t>& msg) { ctrl_->onMessage(msg); }

  const transport::Topology& topology() const { return links_->topology(); }
  // Starts (or restarts, in a new file) and stops the timeline at run time.
  bool startTimeline(const std::string& path) { return timeline_.open(path, topology().rank); }
  void stopTimeline() { timeline_.close(); }
  std::string transportName() const { return links_->transportName(); }
  // The right link's store tuners (collectives/store_tuner.h): for
  // collectives from 8 MiB of output, and from 256 KiB.
  collectives::StoreTuner* storeTuner(bool large) const {
    return large ? comm_.tuner.get() : comm_.tuner_mid.get();
  }
  // Fails this communicator from this rank, as a collective's fatal error
  // does (runtime.h's failCommunicator, for tests).
  void injectFailure(const Status& s) { ctrl_->reportFatal(s); }
  // This communicator's statistics (collectives/collective_stats.h).
  std::shared_ptr<collectives::CommStats> stats() const { return comm_.stats; }
  // The stream this communicator's GPU work is queued on (null before its
  // first GPU collective).
  void* gpuStream() const { return gpu_exec_ ? gpu_exec_->stream() : nullptr; }

 private:
  void loop();  // the engine thread
  Status runInline(Entry& e);  // size-1 jobs: no negotiation, no thread
  // One step of progress: a round when there is news or a peer started
  // one, else an idle wait (when `block`). Returns true if a round ran.
  bool pump(bool block);
  bool pumpGuarded(bool block);  // pump() with fatal errors reported
  // Fails every queued entry (Agreement::failAll).
  void failAll(const Status& s, const std::function<Status(const Entry&)>& per_entry = nullptr) {
    agreement_->failAll(s, per_entry);
  }

  std::unique_ptr<transport::RingLinks> links_;
  Config cfg_;
  std::unique_ptr<transport::Waiter> waiter_;
  collectives::RingComm comm_;
  Timeline timeline_;
  Inbox in_;
  std::unique_ptr<CtrlLink> ctrl_;
  std::unique_ptr<HostExecutor> host_exec_;
  std::unique_ptr<GpuExecutor> gpu_exec_;
  std::unique_ptr<Agreement> agreement_;
  std::unique_ptr<IdleWait> idle_;

  bool stopped_ = false;                     // stop() ran (in_.mu)
  std::atomic<bool> stop_requested_{false};  // stop() was called
  std::atomic<int> sync_drivers_{0};         // callers blocked in drive()
  std::atomic<double> last_drive_end_{0};    // when a caller last stopped driving
  // The engine thread sleeps without a timer while a caller drives; the
  // last caller to leave wakes it (drive()).
  std::atomic<bool> parked_long_{false};
  std::atomic<bool> gpu_seen_{false};  // tryDrive leaves GPU groups to the engine thread

  // The driver's seat.
  std::mutex drive_mu_;
  std::unique_lock<std::mutex>* engine_lock_ = nullptr;  // the engine thread's seat

  std::mutex inline_mu_;  // size-1 jobs
  std::thread thread_;
};

}  // namespace runtime
}  // namespace tfring
