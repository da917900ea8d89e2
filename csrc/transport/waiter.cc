#include "transport/waiter.h"

#include <linux/futex.h>
#include <poll.h>
#include <sched.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <climits>

#include "common/abort.h"
#include "common/status.h"

namespace tfring {
namespace transport {

void futexWait(std::atomic<uint32_t>* addr, uint32_t expected, double seconds) {
  struct timespec ts;
  ts.tv_sec = static_cast<time_t>(seconds);
  ts.tv_nsec = static_cast<long>((seconds - ts.tv_sec) * 1e9);
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(addr), FUTEX_WAIT, expected, &ts,
          nullptr, 0);
}

void futexWake(std::atomic<uint32_t>* addr) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(addr), FUTEX_WAKE, INT_MAX,
          nullptr, nullptr, 0);
}

namespace {

constexpr uint64_t kSpinRounds = 256;
constexpr uint64_t kYieldRounds = 64;
// The yield phase also ends after this long. With many more runnable ranks
// than cores a sched_yield() hands the core round every one of them, so a
// count of yields alone can cost milliseconds per wait; past this budget a
// rank sleeps in poll() or on its doorbell and leaves the cores to the ranks
// that have work.
constexpr double kYieldSeconds = 100e-6;
constexpr double kMaxSleep = 0.05;       // seconds between health checks
constexpr double kHealthInterval = 0.2;  // seconds

std::atomic<bool> g_spinning{true};

}  // namespace

int usableCores() {
  cpu_set_t cpus;
  return sched_getaffinity(0, sizeof(cpus), &cpus) == 0 ? std::max(1, CPU_COUNT(&cpus)) : 1;
}

void setSpinning(bool on) { g_spinning.store(on); }
bool spinning() { return g_spinning.load(std::memory_order_relaxed); }

void Doorbell::ring() {
  seq.fetch_add(1, std::memory_order_seq_cst);
  if (sleeping.load(std::memory_order_seq_cst)) futexWake(&seq);
}

void Waiter::begin(const Deadline& deadline, const std::string& what) {
  deadline_ = deadline;
  what_ = what;
  idle_rounds_ = 0;
  sleep_at_once_ = false;
  next_health_check_ = nowSeconds() + kHealthInterval;
}

void Waiter::sleepAtOnceIfBulk(size_t bytes) {
  if (bytes >= kBulkBytes && send_ && recv_ && send_->pollFd() >= 0 && recv_->pollFd() >= 0)
    sleep_at_once_ = true;
}

void Waiter::checkHealth() {
  abort_->checkWaiting();
  double now = nowSeconds();
  if (now < next_health_check_) return;
  next_health_check_ = now + kHealthInterval;
  if (send_) send_->checkPeer();
  if (recv_) recv_->checkPeer();
  if (deadline_.expired())
    fail(Code::kTimeout, "timed out in ", what_, " waiting for ",
         recv_ ? recv_->describe() : std::string("peer"),
         " (TFRING_TIMEOUT; a peer may be stuck or much slower)");
}

void Waiter::idle(uint32_t ticket, bool want_send, bool want_recv) {
  ++idle_rounds_;
  if (idle_rounds_ == 1 && sleep_at_once_) idle_rounds_ = kSpinRounds + kYieldRounds;
  if (idle_rounds_ == 1 && !spinning()) idle_rounds_ = kSpinRounds;
  if (idle_rounds_ < kSpinRounds) {
    cpuRelax();
    if ((idle_rounds_ & 31) == 0) checkHealth();
    return;
  }
  checkHealth();
  if (idle_rounds_ == kSpinRounds) yield_start_ = nowSeconds();
  if (idle_rounds_ < kSpinRounds + kYieldRounds &&
      nowSeconds() - yield_start_ < kYieldSeconds) {
    sched_yield();
    return;
  }
  int sfd = (want_send && send_) ? send_->pollFd() : -1;
  int rfd = (want_recv && recv_) ? recv_->pollFd() : -1;
  bool shm_involved = (want_send && send_ && sfd < 0) || (want_recv && recv_ && rfd < 0);
  if (sfd >= 0 || rfd >= 0) {
    struct pollfd fds[2];
    int n = 0;
    if (sfd >= 0) fds[n++] = {sfd, POLLOUT, 0};
    if (rfd >= 0) fds[n++] = {rfd, POLLIN, 0};
    // With a shared-memory side too, poll briefly so the doorbell is seen.
    int ms = shm_involved ? 1 : static_cast<int>(kMaxSleep * 1000);
    ::poll(fds, n, ms);
    return;
  }
  if (!bell_) {
    usleep(1000);
    return;
  }
  // Dekker-style handshake with Doorbell::ring(): announce sleeping, then
  // re-check the sequence; a ring in between is either seen here or sees us.
  bell_->sleeping.store(1, std::memory_order_seq_cst);
  if (bell_->seq.load(std::memory_order_seq_cst) == ticket) {
    double remaining = deadline_.remaining();
    double t = remaining < kMaxSleep ? (remaining > 0 ? remaining : 0.001) : kMaxSleep;
    futexWait(&bell_->seq, ticket, t);
  }
  bell_->sleeping.store(0, std::memory_order_seq_cst);
}

}  // namespace transport
}  // namespace tfring
