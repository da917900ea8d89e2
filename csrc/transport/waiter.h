// Waiter: how a rank sleeps when its channels cannot move.
//
// Each rank owns a doorbell: a 32-bit sequence word in shared memory that
// neighbours on the same host bump (and futex-wake, if the owner sleeps)
// after they put bytes in its inbox or take bytes out of the inbox it writes
// to. The protocol is ticket based: a progress loop takes a ticket (the
// current sequence) *before* trying its channels; if nothing moved it calls
// idle(ticket), which returns at once if the bell rang since the ticket.
// Spinning first, then yielding, then sleeping keeps latency low when each
// rank has a core and keeps oversubscribed runs (more ranks than cores) from
// collapsing. TCP channels are waited on with poll().
//
// Every idle() also enforces the collective's deadline, its communicator's
// abort state, and periodically asks the channels whether their peers are
// still alive.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

#include "common/abort.h"
#include "common/clock.h"
#include "transport/channel.h"

namespace tfring {
namespace transport {

// Shared (not PRIVATE) futex operations on a word that several processes
// map, and the CPU's spin-wait hint: every wait in the core uses these.
void futexWait(std::atomic<uint32_t>* addr, uint32_t expected, double seconds);
void futexWake(std::atomic<uint32_t>* addr);
inline void cpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Whether waits spin before yielding: only when every local rank can have
// a core of its own (set once at init). With more ranks than cores a spin
// only burns the time slice the awaited peer needs.
void setSpinning(bool on);
bool spinning();
// The CPUs this process may run on (sched_getaffinity), at least 1.
int usableCores();

struct Doorbell {
  std::atomic<uint32_t> seq;
  std::atomic<uint32_t> sleeping;
  void ring();
};

class Waiter {
 public:
  // `abort`: the failure state of the communicator these channels belong
  // to (outlives the Waiter).
  Waiter(Doorbell* bell, SendChannel* send, RecvChannel* recv, AbortState* abort)
      : bell_(bell), send_(send), recv_(recv), abort_(abort) {}

  // Starts a wait episode for one operation (resets the backoff).
  void begin(const Deadline& deadline, const std::string& what);
  uint32_t ticket() const {
    return bell_ ? bell_->seq.load(std::memory_order_seq_cst) : 0;
  }
  void progressed() { idle_rounds_ = 0; }
  // For the rest of this episode (until the next begin()), idle() sleeps in
  // poll() at once, with no spin or yield rounds, even where waits spin,
  // when the episode moves at least kBulkBytes either way and both of this
  // waiter's channels are sockets. A bulk transfer's loop retries send()
  // and recv() every round, so spinning costs two system calls a round
  // rather than a pause (half of a rank's CPU time in a 64 MiB Rabenseifner
  // allreduce, a quarter of a ring's), while poll() wakes it when the
  // socket can move more, a delay the socket buffers hide. Shared memory
  // keeps spinning.
  static constexpr size_t kBulkBytes = 1 << 20;
  void sleepAtOnceIfBulk(size_t bytes);
  // want_send/want_recv: which channel directions this loop is blocked on.
  void idle(uint32_t ticket, bool want_send, bool want_recv);

 private:
  void checkHealth();

  Doorbell* bell_;
  SendChannel* send_;
  RecvChannel* recv_;
  AbortState* abort_;
  Deadline deadline_{};
  std::string what_;
  uint64_t idle_rounds_ = 0;
  bool sleep_at_once_ = false;
  double yield_start_ = 0;
  double next_health_check_ = 0;
};

}  // namespace transport
}  // namespace tfring
