// IdleWait (idle_wait.h): the driver's wait for the next round.
#include "runtime/idle_wait.h"

#include <linux/futex.h>
#include <poll.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <thread>
#include <vector>

#include "common/abort.h"
#include "common/clock.h"
#include "transport/waiter.h"

namespace tfring {
namespace runtime {

namespace {

constexpr int kSpinChecks = 2000;    // idle checks before yielding
constexpr int kYieldChecks = 50;     // then yields before blocking
constexpr double kYieldSeconds = 100e-6;  // and for no longer than this
constexpr double kMaxBlock = 0.1;    // seconds per block (stop/abort/aging checks)

}  // namespace

IdleWait::IdleWait(transport::RingLinks& links, const Config& cfg, Inbox& in,
                   Agreement& agreement)
    : links_(links), in_(in), agreement_(agreement), size_(links.topology().size) {
  const auto& T = links_.topology();
  const int ncpu = transport::usableCores();
  const int procs = cfg.host_procs > 0 ? cfg.host_procs : T.local_size;
  // TFRING_SPIN=auto busy-waits only where every local rank can have a
  // core; 0 never (a framework's own threads want every core), 1 always.
  const bool spin_auto = cfg.spin != "0" && cfg.spin != "1";
  transport::setSpinning(spin_auto ? procs <= ncpu : cfg.spin == "1");
  engine_spins_ = spin_auto ? 2 * procs <= ncpu : cfg.spin == "1";
  // Without a doorbell to ring (the left link is TCP, or there is no link,
  // or idle ranks watch the point-to-point links), local wake-ups go
  // through an eventfd the idle wait polls.
  if (T.size > 1 &&
      (agreement_.channel().recdbl() || links_.left()->pollFd() >= 0 || !links_.bell()))
    wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
}

IdleWait::~IdleWait() {
  if (wake_fd_ >= 0) ::close(wake_fd_);
}

void IdleWait::wake() {
  if (links_.bell()) links_.bell()->ring();
  if (agreement_.channel().host()) {
    // An idle rank under the host vote sleeps on its doorbell in the
    // segment (wait()); news is stored before this is read.
    const transport::HostLinks* H = links_.host();
    if (H->segment) {
      transport::Doorbell& b = H->segment->words(H->local_rank).idle;
      std::atomic_thread_fence(std::memory_order_seq_cst);
      if (b.sleeping.load(std::memory_order_seq_cst)) b.ring();
    }
  }
  if (wake_fd_ >= 0 && blocked_.load(std::memory_order_seq_cst)) {
    uint64_t one = 1;
    ssize_t rc = ::write(wake_fd_, &one, sizeof(one));
    (void)rc;
  }
}

void IdleWait::wait(bool on_engine_thread, std::unique_lock<std::mutex>* seat,
                    const std::atomic<int>& drivers) {
  if (size_ == 1) {  // only GPU work reaches the engine thread
    std::unique_lock<std::mutex> lk(in_.mu);
    in_.cv.wait_for(lk, std::chrono::duration<double>(kMaxBlock), [&] {
      return in_.news.load() != agreement_.seenNews() || in_.stopping ||
             links_.abortState()->aborted();
    });
    return;
  }
  const bool vote_host = agreement_.channel().host();
  const bool vote_recdbl = agreement_.channel().recdbl();
  transport::Doorbell* bell = links_.bell();
  // Under the host vote a rank other than local rank 0 sleeps on its own
  // doorbell in the host segment, which a local rank starting a round
  // rings (runtime/vote_host.cc), and so does wake(). Local rank 0
  // polls its links to the other hosts and its wake-up socket instead.
  const transport::HostLinks* H = links_.host();
  transport::HostSegment* seg = vote_host ? H->segment.get() : nullptr;
  const bool host_leader = vote_host && (!seg || H->local_rank == 0);
  if (seg && !host_leader) bell = &seg->words(H->local_rank).idle;
  // Spin: a peer or a local caller usually shows up within microseconds.
  // A caller driving for its own result spins (its thread only waits
  // anyway). The engine thread spins only where each local rank has a core
  // to spare for it: otherwise its spinning takes the core the framework's
  // own threads need to reach the next collective.
  const bool spin = transport::spinning() && (!on_engine_thread || engine_spins_);
  double yield_start = 0;
  for (int i = spin ? 0 : kSpinChecks; i < kSpinChecks + kYieldChecks; ++i) {
    if (i >= kSpinChecks) {
      // Yields end after kYieldSeconds as well: with many ranks per core
      // each yield waits a turn of every runnable rank.
      double now = nowSeconds();
      if (i == kSpinChecks) yield_start = now;
      else if (now - yield_start > kYieldSeconds) break;
      sched_yield();
    } else {
      transport::cpuRelax();
    }
    if (roundDue()) return;
    if (drivers.load(std::memory_order_relaxed) > 0 && on_engine_thread)
      return;  // hand over to the caller that wants to drive
    if ((i & 255) == 0 && links_.abortState()->aborted()) return;
  }
  // Block until woken, or until an aging tensor or kMaxBlock is due.
  double timeout = kMaxBlock;
  const double aging = agreement_.agingDue();
  if (aging < 1e300) timeout = std::min(timeout, std::max(0.0005, aging - nowSeconds()));
  // The engine thread gives up the driver's seat while it sleeps, so a
  // submitting or waiting caller can drive without waking it.
  const bool release = seat != nullptr;
  struct Reseat {
    std::unique_lock<std::mutex>* l;
    ~Reseat() {
      if (l) l->lock();
    }
  };
  const int lfd = links_.left()->pollFd();
  if (host_leader || (!vote_host && (vote_recdbl || lfd >= 0 || !bell))) {
    blocked_.store(true, std::memory_order_seq_cst);
    // Raised before the last look, so a local rank that votes after it
    // sees it and rings the wake-up socket.
    if (host_leader && seg) seg->leaderPolling().store(1, std::memory_order_seq_cst);
    if (!roundDue()) {
      Reseat reseat{seat};
      if (release) seat->unlock();
      std::vector<struct pollfd> fds;
      fds.reserve(8);
      if (vote_recdbl) {
        agreement_.addPollFds(&fds);
      } else if (lfd >= 0) {
        fds.push_back({lfd, POLLIN, 0});
      }
      if (wake_fd_ >= 0) fds.push_back({wake_fd_, POLLIN, 0});
      if (host_leader && H->wake) fds.push_back({H->wake->fd(), POLLIN, 0});
      ::poll(fds.data(), fds.size(), static_cast<int>(timeout * 1000) + 1);
      uint64_t v;
      if (wake_fd_ >= 0) {
        ssize_t rc = ::read(wake_fd_, &v, sizeof(v));
        (void)rc;
      }
      if (host_leader && H->wake) H->wake->drain();
    }
    if (host_leader && seg) seg->leaderPolling().store(0, std::memory_order_seq_cst);
    blocked_.store(false, std::memory_order_seq_cst);
    return;
  }
  // Same handshake as transport::Waiter: announce sleeping, re-check, sleep.
  // The re-check comes after `sleeping` is raised: the host vote's wakers
  // ring only a sleeper, after storing what the re-check reads.
  uint32_t ticket = bell->seq.load(std::memory_order_seq_cst);
  if (roundDue()) return;
  bell->sleeping.store(1, std::memory_order_seq_cst);
  if (!roundDue() && bell->seq.load(std::memory_order_seq_cst) == ticket) {
    Reseat reseat{seat};
    if (release) seat->unlock();
    transport::futexWait(&bell->seq, ticket, timeout);
  }
  bell->sleeping.store(0, std::memory_order_seq_cst);
}

}  // namespace runtime
}  // namespace tfring
