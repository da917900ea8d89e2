// Shared-memory channels between ranks on one host.
//
// Every rank creates one segment, named after the job and its rank, holding
// its doorbell, its pid and its inbox: a single-producer single-consumer
// byte ring that only its left neighbour writes. A rank maps its own segment
// (to read its inbox), its right neighbour's (to write into that inbox and
// ring that bell) and its left neighbour's (to ring that bell once it has
// freed inbox space). Once every neighbour has mapped them, segments are
// unlinked, so nothing is left in /dev/shm even if a rank is killed.
//
// Ring protocol: `head` counts bytes ever written (producer-owned), `tail`
// bytes ever consumed (consumer-owned); capacity is a power of two, a
// multiple of 8. The producer copies into free space, publishes head with a
// release store and rings the consumer's bell; the consumer reads with an
// acquire load, and after consuming publishes tail and rings the producer's
// bell. align() rounds both counters up to 8 at the end of each collective.
//
// Every mapping is made with MAP_POPULATE: its pages are resident and in the
// process's page tables from the start, so the first passes of the ring
// over its buffer take no page faults (and RSS does not creep up as the
// ring's position first goes round).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "transport/channel.h"
#include "transport/waiter.h"

namespace tfring {
namespace transport {

struct alignas(64) ShmHeader {
  uint64_t magic;
  uint64_t capacity;
  int32_t rank;
  int32_t pid;
  alignas(64) Doorbell bell;
  alignas(64) std::atomic<uint64_t> head;
  alignas(64) std::atomic<uint64_t> tail;
};

class ShmSegment {
 public:
  // Creates (owner) or opens (neighbour) the segment of `rank` in job `job`.
  // A left neighbour's segment is only rung, never written: opened with
  // `header_only` it maps the header page alone (data() is then unusable).
  static std::unique_ptr<ShmSegment> create(const std::string& job, int rank,
                                            uint64_t capacity);
  // The same segment with no name yet (an O_TMPFILE file in /dev/shm), so
  // that a process killed before publish() leaves nothing behind; null
  // where the system cannot make one. publish() gives it its name, after
  // which it is the segment create() would have made.
  static std::unique_ptr<ShmSegment> createUnnamed(const std::string& job, int rank,
                                                   uint64_t capacity);
  void publish();
  // Errors name the rank as `label` (-1: `rank` itself).
  static std::unique_ptr<ShmSegment> open(const std::string& job, int rank,
                                          bool header_only = false, int label = -1);
  ~ShmSegment();
  void unlink();

  ShmHeader* header() const { return header_; }
  char* data() const { return reinterpret_cast<char*>(header_) + kDataOffset; }
  uint64_t capacity() const { return header_->capacity; }
  static constexpr size_t kDataOffset = 256;

 private:
  ShmSegment() = default;
  static std::string nameFor(const std::string& job, int rank);
  // Maps fd's `total` bytes populated and writes a fresh header.
  void initialize(int fd, size_t total, uint64_t capacity, int rank);
  std::string name_;
  ShmHeader* header_ = nullptr;
  size_t mapped_ = 0;
  bool owner_ = false;
  int unnamed_fd_ = -1;  // createUnnamed() until publish()
};

class ShmSendChannel : public SendChannel {
 public:
  // `peer` is the right neighbour's segment; `self` is ours (unused here).
  // peer_label: how messages name the peer (its global rank; -1: peer_rank).
  ShmSendChannel(ShmSegment* peer, int peer_rank, int peer_label = -1);
  size_t trySend(const void* data, size_t n) override;
  size_t trySendDeferred(const void* data, size_t n) override;
  size_t trySendStreamingDeferred(const void* data, size_t n) override;
  size_t reserve(void** data, size_t max) override;
  void commitDeferred(size_t n) override;
  void flush() override;
  void align() override;
  void checkPeer() override;
  std::string describe() const override;

 private:
  // Free bytes by the last tail seen, reloading it when fewer than `want`.
  uint64_t freeBytes(size_t want);
  template <typename Copy>
  size_t sendWith(const void* data, size_t n, Copy copy);

  ShmSegment* peer_;
  ShmHeader* h_;
  int peer_rank_;
  int peer_label_;
  uint64_t head_;       // our copy of head; we are the only writer
  uint64_t published_;  // the head the consumer has been shown
  uint64_t tail_seen_;  // a tail the consumer has published (never ahead of it)
};

class ShmRecvChannel : public RecvChannel {
 public:
  // `self` holds the inbox; `left` is the producer's segment (its bell).
  ShmRecvChannel(ShmSegment* self, ShmSegment* left, int left_rank, int left_label = -1);
  size_t tryRecv(void* data, size_t n) override;
  size_t peek(const void** data, size_t max) override;
  void consume(size_t n) override;
  void consumeDeferred(size_t n) override;
  size_t tryRecvDeferred(void* data, size_t n) override;
  size_t tryRecvStreamingDeferred(void* data, size_t n) override;
  void flush() override;
  void align() override;
  void checkPeer() override;
  std::string describe() const override;

 private:
  template <typename Copy>
  size_t recvWith(void* data, size_t n, Copy copy);

  ShmSegment* self_;
  ShmSegment* left_;
  ShmHeader* h_;
  int left_rank_;
  int left_label_;
  uint64_t tail_;       // our copy of tail; we are the only writer
  uint64_t published_;  // the tail the producer has been shown
  uint64_t head_seen_;  // a head the producer has published (never ahead of it)
};

// Whether a process is still alive (pid on this host).
bool pidAlive(int pid);

}  // namespace transport
}  // namespace tfring
