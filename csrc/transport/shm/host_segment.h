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
#include "transport/waiter.h"

namespace tfring {
namespace transport {

struct alignas(64) HostRankWords {
  std::atomic<uint64_t> arrive;
  std::atomic<uint64_t> ready;
  std::atomic<uint64_t> done;
  int32_t pid;
};

struct alignas(64) HostHeader {
  uint64_t magic;
  uint64_t slot_bytes;
  int32_t local_size;
  alignas(64) Doorbell bell;
};

class HostSegment {
 public:
  static std::unique_ptr<HostSegment> create(const std::string& name, int local_size,
                                             uint64_t slot_bytes);
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
  // Publishes a progress word and wakes sleepers.
  void publish(std::atomic<uint64_t>& word, uint64_t step);
  void wake() { header_->bell.ring(); }

  // Waits until words(q).*field >= step for every local rank q. `what` names
  // the collective; `ranks` maps local ranks to global ranks for errors.
  // Throws kPeerFailure if a rank still awaited died, kTimeout past the
  // deadline, and the recorded error if the job aborted.
  void waitAll(std::atomic<uint64_t> HostRankWords::*field, uint64_t step,
               const Deadline& deadline, const char* what, const std::vector<int>& ranks);

 private:
  HostSegment() = default;
  std::string name_;
  HostHeader* header_ = nullptr;
  HostRankWords* words_ = nullptr;
  char* data_ = nullptr;
  int local_size_ = 0;
  size_t mapped_ = 0;
  bool owner_ = false;
};

}  // namespace transport
}  // namespace tfring
