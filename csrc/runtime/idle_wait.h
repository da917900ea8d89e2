// IdleWait: how the driver waits, without a fixed sleep, until a round is
// due, and how other threads wake it.
//
// A round is due when this rank has news (agreement.h: hasNews) or a peer
// started one (peerStartedRound). The wait spins first (a peer or a local
// caller usually shows up within microseconds), then yields, then blocks:
// on the shared-memory doorbell of the left link, on this rank's doorbell
// in the host segment under the host vote, or, where no doorbell rings
// (the left link is TCP, or idle ranks watch the point-to-point vote
// links), in poll() on the links' sockets and a local eventfd.
#pragma once

#include <atomic>
#include <mutex>

#include "common/env.h"
#include "runtime/agreement.h"
#include "runtime/inbox.h"
#include "transport/ring_links.h"

namespace tfring {
namespace runtime {

class IdleWait {
 public:
  // Also sets whether this process's waits spin (TFRING_SPIN).
  IdleWait(transport::RingLinks& links, const Config& cfg, Inbox& in, Agreement& agreement);
  ~IdleWait();
  // Wakes a driver blocked in wait() (any thread; news is stored first).
  void wake();
  // Waits until a round may be due, or kMaxBlock. `engine_thread`: the
  // caller is the engine's own thread, which spins only where each local
  // rank has a core to spare and hands over to a caller that wants to drive
  // (drivers > 0); `seat`, if set, is released while blocked, so a caller
  // can drive without waking it.
  void wait(bool engine_thread, std::unique_lock<std::mutex>* seat,
            const std::atomic<int>& drivers);

 private:
  bool roundDue() { return agreement_.hasNews() || agreement_.peerStartedRound(); }

  transport::RingLinks& links_;
  Inbox& in_;
  Agreement& agreement_;
  const int size_;
  bool engine_spins_ = true;  // the engine thread may spin (a core per rank to spare)
  int wake_fd_ = -1;          // eventfd for local wake-ups where no doorbell rings
  std::atomic<bool> blocked_{false};  // in poll(): wake() writes wake_fd_
};

}  // namespace runtime
}  // namespace tfring
