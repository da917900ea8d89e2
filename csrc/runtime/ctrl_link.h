// CtrlLink: an engine's connection to the coordinator (coordinator.h).
//
// Ranks other than 0 hold a TCP connection, read by a thread of its own
// (start()); rank 0's coordinator lives in the same process, and its
// messages arrive through onMessage() on the coordinator's thread. What
// arrives goes into the Inbox (responses, a rank that shut down) or into
// the process's abort state (an abort, a lost or silent coordinator).
#pragma once

#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "common/abort.h"
#include "common/env.h"
#include "common/rank_labels.h"
#include "common/status.h"
#include "runtime/inbox.h"

namespace tfring {
namespace runtime {

class Coordinator;

class CtrlLink {
 public:
  // fd: the connection, or -1 on rank 0, whose coordinator is `local`.
  // `wake` wakes this rank's driver (news arrived); `rank`: this rank.
  // `abort`: this communicator's abort state; `labels`: its members'
  // global ranks, for messages.
  CtrlLink(int fd, Coordinator* local, const Config& cfg, int rank, Inbox& in,
           std::function<void()> wake, AbortState* abort, const RankLabels& labels)
      : fd_(fd), local_(local), cfg_(cfg), rank_(rank), in_(in), wake_(std::move(wake)),
        abort_(abort), labels_(labels) {}
  // Starts the reader thread (ranks other than 0).
  void start();
  // Sends a message to the coordinator; timeout_s < 0: TFRING_TIMEOUT.
  void send(const std::vector<uint8_t>& payload, double timeout_s = -1);
  // A message from the coordinator (reader thread, or the coordinator's
  // own thread on rank 0).
  void onMessage(const std::vector<uint8_t>& msg);
  // Marks the job failed with `s` and, if this rank is the first to know,
  // tells the coordinator, which relays it to every rank.
  void reportFatal(const Status& s);
  // On rank 0: waits (up to timeout_s) until the coordinator relayed an
  // abort to every rank; elsewhere returns at once.
  void waitAbortRelayed(double timeout_s);
  // Says goodbye, closes the connection and joins the reader.
  void close();

 private:
  void readerLoop();
  void onLost();  // the reader lost the connection

  int fd_;
  Coordinator* local_;
  const Config& cfg_;
  const int rank_;
  Inbox& in_;
  std::function<void()> wake_;
  AbortState* abort_;
  const RankLabels& labels_;
  std::mutex send_mu_;  // the driver, the reader (pongs) and the fatal path write
  std::thread reader_;
};

}  // namespace runtime
}  // namespace tfring
