// Inbox: what submitters (enqueue), the coordinator's messages (ctrl_link.h)
// and the driver of the rounds (agreement.h) share, under one mutex.
//
// Submitters add entries to `incoming` and to `inflight` (by name); the
// reader adds coordinator responses and the word that a rank shut down.
// Either bumps `news`, which the driver compares with what it last took in
// to know that a round has something new to vote on.
#pragma once

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "runtime/entry.h"
#include "runtime/messages.h"

namespace tfring {
namespace runtime {

struct Inbox {
  std::mutex mu;
  std::condition_variable cv;
  Entries incoming;                                              // not yet in a round
  std::deque<Response> responses;                                // not yet executed
  std::unordered_map<std::string, std::shared_ptr<Entry>> inflight;  // by name
  bool stopping = false;  // no new work; peers' goodbyes are expected
  std::atomic<uint64_t> news{0};      // bumped by enqueue and the reader
  std::atomic<uint64_t> recv_seq{0};  // last coordinator response received
  std::atomic<int> left_rank{-1};     // a rank that shut down (kMsgLeft)
  std::vector<int> left_ranks;        // every such rank; guarded by mu

  bool isStopping() {
    std::lock_guard<std::mutex> lk(mu);
    return stopping;
  }
  // Whether the coordinator said `rank` shut down (kMsgLeft); for -1 (a
  // failure that names no peer), whether any rank did.
  bool hasLeft(int rank) {
    if (rank < 0) return left_rank.load() >= 0;
    std::lock_guard<std::mutex> lk(mu);
    return std::find(left_ranks.begin(), left_ranks.end(), rank) != left_ranks.end();
  }
};

}  // namespace runtime
}  // namespace tfring
