// HostSegment: one shared-memory segment per host, mapped by every local
// rank, for the collectives that exchange whole buffers through memory
// instead of along the ring (collectives/allreduce_oneshot.cc,
// collectives/allreduce_hier.cc).
//
// Layout: a header (doorbell, slot size), one cache line of progress words
// per local rank, then two banks of data, one per step parity. A bank holds
// one input slot per local rank and one result slot, each slot_bytes long.
//
// Progress words count steps (every use of the segment is one step, numbered
// 1, 2, ... identically on every local rank because ranks run collectives in
// the same order):
//   arrive  - the last step whose input this rank has written into its slot;
//   ready   - the last step whose share this rank has written into the result;
//   done    - the last step this rank has finished reading from the bank.
// Step s uses bank s % 2. Before writing anything into bank s % 2 a rank
// waits until every local rank's `done` is at least s - 2, so a fast rank
// never overwrites a bank a slow rank still reads. Every store of a progress
// word is a store that rings the segment's doorbell only when a waiter
// sleeps; waiters spin briefly, yield, and then sleep on the doorbell's futex.
//
// After the banks, the agreement round's vote area (runtime/vote.h, the
// host vote): one vote slot per local rank and one for the tally, each
// vote_slot_bytes long, with its own progress words, numbered by vote round:
//   vote_arrive - the last round whose vote this rank has written;
//   vote_ready  - local rank 0: the last round whose tally it has written;
//                 the others: the last round they voted in (so waiting for
//                 every rank's vote_ready waits for local rank 0's tally).
// One bank is enough: local rank 0 reads the votes of round v, and writes
// its tally, only once every local rank has written its vote of round v,
// which each does only after it has copied out the tally of round v-1.
// `idle` is each rank's own doorbell for its idle wait: a rank that starts
// a round rings the idle local ranks' bells, so only they wake.
//
// The segment is mapped without MAP_POPULATE (unlike the ring's inboxes,
// transport/shm/shm_channel.h): every slot is written from its start, so
// only the pages a job's largest message reaches are ever faulted in, once,
// and RSS cannot creep; populating all of it (5 MiB at 4 local ranks on
// several hosts) was most of a rank's start-up work at scale.
//
// Local rank 0 creates the segment at init; the others open it by name once
// it is published through the store, and it is unlinked as soon as every
// local rank has mapped it, so nothing is left in /dev/shm after a crash.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/rank_labels.h"
#include "transport/waiter.h"

namespace tfring {
namespace transport {

struct alignas(64) HostRankWords {
  std::atomic<uint64_t> arrive;
  std::atomic<uint64_t> ready;
  std::atomic<uint64_t> done;
  std::atomic<uint64_t> vote_arrive;
  std::atomic<uint64_t> vote_ready;
  Doorbell idle;
  int32_t pid;
};

struct alignas(64) HostHeader {
  uint64_t magic;
  uint64_t slot_bytes;
  uint64_t vote_slot_bytes;
  int32_t local_size;
  // Local rank 0 sleeps in poll() on its sockets when idle and raises this
  // first; a rank starting a round then wakes it through its wake socket.
  std::atomic<uint32_t> leader_polling;
  alignas(64) Doorbell bell;
};

class HostSegment {
 public:
  static std::unique_ptr<HostSegment> create(const std::string& name, int local_size,
                                             uint64_t slot_bytes, uint64_t vote_slot_bytes = 0);
  static std::unique_ptr<HostSegment> open(const std::string& name, int local_size);
  ~HostSegment();
  void unlink();

  int localSize() const { return local_size_; }
  uint64_t slotBytes() const { return header_->slot_bytes; }
  HostRankWords& words(int local_rank) const { return words_[local_rank]; }
  // Input slot of local rank q in bank `bank`; q == localSize() is the result.
  char* slot(int bank, int q) const {
    return data_ + (static_cast<size_t>(bank) * (local_size_ + 1) + q) * header_->slot_bytes;
  }
  uint64_t voteSlotBytes() const { return header_->vote_slot_bytes; }
  // Vote slot of local rank q; q == localSize() holds the tally.
  int32_t* voteSlot(int q) const {
    return reinterpret_cast<int32_t*>(votes_ + static_cast<size_t>(q) * header_->vote_slot_bytes);
  }
  std::atomic<uint32_t>& leaderPolling() const { return header_->leader_polling; }
  // Publishes a progress word and wakes sleepers.
  void publish(std::atomic<uint64_t>& word, uint64_t step);
  void wake() { header_->bell.ring(); }
  // The failure state of the communicator this segment serves (set once,
  // before the first wait; it outlives the segment).
  void setAbort(AbortState* abort) { abort_ = abort; }
  // How its messages name ranks (a process set's: global).
  void setLabels(RankLabels labels) { label_ = std::move(labels); }

  // Waits until words(q).*field >= step for every local rank q. `what` names
  // the collective; `ranks` maps local ranks to places in the communicator
  // (HostLinks::local_ranks), which errors print as the labels do.
  // Throws kPeerFailure if a rank still awaited died, kTimeout past the
  // deadline, and the recorded error if the communicator aborted.
  void waitAll(std::atomic<uint64_t> HostRankWords::*field, uint64_t step,
               const Deadline& deadline, const char* what, const std::vector<int>& ranks);

 private:
  HostSegment() = default;
  std::string name_;
  HostHeader* header_ = nullptr;
  HostRankWords* words_ = nullptr;
  char* data_ = nullptr;
  char* votes_ = nullptr;
  int local_size_ = 0;
  size_t mapped_ = 0;
  bool owner_ = false;
  AbortState* abort_ = nullptr;
  RankLabels label_;
};

}  // namespace transport
}  // namespace tfring
