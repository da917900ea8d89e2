#include "transport/shm/shm_channel.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/status.h"
#include "kernels/cpu/copy.h"

namespace tfring {
namespace transport {

namespace {
constexpr uint64_t kMagic = 0x676e697266746675ull;  // "uftfring"
}

bool pidAlive(int pid) {
  if (pid <= 0) return true;
  return !(::kill(pid, 0) != 0 && errno == ESRCH);
}

std::string ShmSegment::nameFor(const std::string& job, int rank) {
  return strCat("/tfring-", job, "-r", rank);
}

std::unique_ptr<ShmSegment> ShmSegment::create(const std::string& job, int rank,
                                               uint64_t capacity) {
  std::unique_ptr<ShmSegment> s(new ShmSegment());
  s->name_ = nameFor(job, rank);
  s->owner_ = true;
  size_t total = kDataOffset + capacity;
  ::shm_unlink(s->name_.c_str());  // a stale one from a crashed job
  int fd = ::shm_open(s->name_.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) fail(Code::kUnavailable, "shm_open(", s->name_, "): ", strerror(errno));
  if (::ftruncate(fd, static_cast<off_t>(total)) != 0) {
    int e = errno;
    ::close(fd);
    ::shm_unlink(s->name_.c_str());
    fail(Code::kUnavailable, "could not size shared memory ", s->name_, " to ",
         total, " bytes: ", strerror(e), " (is /dev/shm large enough?)");
  }
  s->initialize(fd, total, capacity, rank);
  ::close(fd);
  return s;
}

void ShmSegment::initialize(int fd, size_t total, uint64_t capacity, int rank) {
  void* p = ::mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  if (p == MAP_FAILED) fail(Code::kUnavailable, "mmap(", name_, "): ", strerror(errno));
  mapped_ = total;
  header_ = new (p) ShmHeader();
  header_->capacity = capacity;
  header_->rank = rank;
  header_->pid = static_cast<int32_t>(::getpid());
  header_->bell.seq.store(0);
  header_->bell.sleeping.store(0);
  header_->head.store(0);
  header_->tail.store(0);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  reinterpret_cast<std::atomic<uint64_t>*>(&header_->magic)->store(kMagic, std::memory_order_release);
}

std::unique_ptr<ShmSegment> ShmSegment::createUnnamed(const std::string& job, int rank,
                                                      uint64_t capacity) {
  // shm_open's names live in /dev/shm; a file made there with O_TMPFILE
  // has no name until linkat() gives it one, and vanishes with the process.
  int fd = ::open("/dev/shm", O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) return nullptr;
  const size_t total = kDataOffset + capacity;
  if (::ftruncate(fd, static_cast<off_t>(total)) != 0) {
    ::close(fd);
    return nullptr;
  }
  std::unique_ptr<ShmSegment> s(new ShmSegment());
  s->name_ = nameFor(job, rank);
  s->unnamed_fd_ = fd;
  s->initialize(fd, total, capacity, rank);
  return s;
}

void ShmSegment::publish() {
  if (unnamed_fd_ < 0) return;
  const std::string path = "/dev/shm" + name_;
  const std::string self = "/proc/self/fd/" + std::to_string(unnamed_fd_);
  ::unlink(path.c_str());  // a stale one from a crashed job
  if (::linkat(AT_FDCWD, self.c_str(), AT_FDCWD, path.c_str(), AT_SYMLINK_FOLLOW) != 0)
    fail(Code::kUnavailable, "could not name the shared memory ", name_, ": ", strerror(errno));
  ::close(unnamed_fd_);
  unnamed_fd_ = -1;
  owner_ = true;
}

std::unique_ptr<ShmSegment> ShmSegment::open(const std::string& job, int rank,
                                             bool header_only, int label) {
  std::unique_ptr<ShmSegment> s(new ShmSegment());
  const int who = label >= 0 ? label : rank;
  s->name_ = nameFor(job, rank);
  int fd = ::shm_open(s->name_.c_str(), O_RDWR, 0600);
  if (fd < 0) fail(Code::kUnavailable, "could not open the shared memory of rank ", who,
                   " (", s->name_, "): ", strerror(errno));
  struct stat st;
  if (::fstat(fd, &st) != 0 || st.st_size < static_cast<off_t>(kDataOffset)) {
    ::close(fd);
    fail(Code::kUnavailable, "shared memory of rank ", who, " is truncated");
  }
  const size_t len = header_only ? kDataOffset : static_cast<size_t>(st.st_size);
  void* p = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) fail(Code::kUnavailable, "mmap(", s->name_, "): ", strerror(errno));
  s->mapped_ = len;
  s->header_ = static_cast<ShmHeader*>(p);
  auto magic = reinterpret_cast<std::atomic<uint64_t>*>(&s->header_->magic)->load(std::memory_order_acquire);
  if (magic != kMagic) fail(Code::kUnavailable, "shared memory of rank ", who, " is not initialized");
  return s;
}

void ShmSegment::unlink() {
  if (owner_) ::shm_unlink(name_.c_str());
  owner_ = false;
}

ShmSegment::~ShmSegment() {
  unlink();
  if (unnamed_fd_ >= 0) ::close(unnamed_fd_);
  if (header_) ::munmap(header_, mapped_);
}

// ----------------------------------------------------------------- send ----

ShmSendChannel::ShmSendChannel(ShmSegment* peer, int peer_rank, int peer_label)
    : peer_(peer),
      h_(peer->header()),
      peer_rank_(peer_rank),
      peer_label_(peer_label >= 0 ? peer_label : peer_rank) {
  head_ = published_ = h_->head.load(std::memory_order_relaxed);
  tail_seen_ = h_->tail.load(std::memory_order_acquire);
}

uint64_t ShmSendChannel::freeBytes(size_t want) {
  const uint64_t cap = h_->capacity;
  // align() pads head_ by up to 7 bytes: after a collective that ended
  // with the inbox full at an unaligned position, head_ is past tail +
  // capacity until the consumer catches up. That is no space; unchecked,
  // the subtraction wrapped and the next collective overwrote bytes the
  // consumer had not read.
  if (head_ - tail_seen_ >= cap || cap - (head_ - tail_seen_) < want)
    tail_seen_ = h_->tail.load(std::memory_order_acquire);
  const uint64_t used = head_ - tail_seen_;
  return used >= cap ? 0 : cap - used;
}

// Copies into free space without showing it to the consumer. The free
// space is computed from the last tail seen, reloaded (a cache line the
// consumer writes) only when that is not enough for all n bytes.
template <typename Copy>
size_t ShmSendChannel::sendWith(const void* data, size_t n, Copy copy) {
  const uint64_t cap = h_->capacity;
  size_t todo = static_cast<size_t>(std::min<uint64_t>(freeBytes(n), n));
  if (todo == 0) return 0;
  // Copy in at most two pieces: up to the end of the ring, then from its start.
  uint64_t pos = head_ & (cap - 1);
  size_t first = static_cast<size_t>(std::min<uint64_t>(todo, cap - pos));
  copy(peer_->data() + pos, data, first);
  if (todo > first) copy(peer_->data(), static_cast<const char*>(data) + first, todo - first);
  head_ += todo;
  return todo;
}

size_t ShmSendChannel::trySendDeferred(const void* data, size_t n) {
  return sendWith(data, n, [](void* d, const void* s, size_t k) { std::memcpy(d, s, k); });
}

size_t ShmSendChannel::trySendStreamingDeferred(const void* data, size_t n) {
  return sendWith(data, n,
                  [](void* d, const void* s, size_t k) { kernels::copyStreaming(d, s, k); });
}

// The contiguous part of the free space: up to the end of the ring.
size_t ShmSendChannel::reserve(void** data, size_t max) {
  const uint64_t cap = h_->capacity;
  const uint64_t pos = head_ & (cap - 1);
  const size_t n = static_cast<size_t>(std::min<uint64_t>({freeBytes(max), cap - pos, max}));
  *data = peer_->data() + pos;
  return n;
}

void ShmSendChannel::commitDeferred(size_t n) { head_ += n; }

void ShmSendChannel::flush() {
  if (head_ == published_) return;
  published_ = head_;
  h_->head.store(head_, std::memory_order_release);
  h_->bell.ring();
}

size_t ShmSendChannel::trySend(const void* data, size_t n) {
  size_t done = trySendDeferred(data, n);
  flush();
  return done;
}

void ShmSendChannel::align() {
  head_ = (head_ + 7) & ~uint64_t(7);
  published_ = head_;
  h_->head.store(head_, std::memory_order_release);
}

void ShmSendChannel::checkPeer() {
  if (!pidAlive(h_->pid))
    failPeer(peer_rank_, strCat("pid ", h_->pid, " on this host"), "rank ", peer_label_,
             " (pid ", h_->pid, " on this host) died");
}

std::string ShmSendChannel::describe() const { return strCat("rank ", peer_label_, " (shm)"); }

// ----------------------------------------------------------------- recv ----

ShmRecvChannel::ShmRecvChannel(ShmSegment* self, ShmSegment* left, int left_rank,
                               int left_label)
    : self_(self),
      left_(left),
      h_(self->header()),
      left_rank_(left_rank),
      left_label_(left_label >= 0 ? left_label : left_rank) {
  tail_ = published_ = h_->tail.load(std::memory_order_relaxed);
  head_seen_ = h_->head.load(std::memory_order_acquire);
}

// The head last seen is reloaded (a cache line the producer writes) only
// when it does not already show `max` bytes.
size_t ShmRecvChannel::peek(const void** data, size_t max) {
  const uint64_t cap = h_->capacity;
  if (head_seen_ <= tail_ || head_seen_ - tail_ < max)
    head_seen_ = h_->head.load(std::memory_order_acquire);
  // head < tail_ happens briefly after align(): we rounded tail_ up before
  // the producer rounded head up. Nothing is readable then.
  if (head_seen_ <= tail_) return 0;
  uint64_t avail = head_seen_ - tail_;
  uint64_t pos = tail_ & (cap - 1);
  size_t n = static_cast<size_t>(std::min<uint64_t>({avail, cap - pos, max}));
  *data = self_->data() + pos;
  return n;
}

void ShmRecvChannel::consumeDeferred(size_t n) { tail_ += n; }

void ShmRecvChannel::flush() {
  if (tail_ == published_) return;
  published_ = tail_;
  h_->tail.store(tail_, std::memory_order_release);
  left_->header()->bell.ring();
}

void ShmRecvChannel::consume(size_t n) {
  consumeDeferred(n);
  flush();
}

template <typename Copy>
size_t ShmRecvChannel::recvWith(void* data, size_t n, Copy copy) {
  size_t done = 0;
  while (done < n) {
    const void* p;
    size_t k = peek(&p, n - done);
    if (k == 0) break;
    copy(static_cast<char*>(data) + done, p, k);
    done += k;
    tail_ += k;
  }
  return done;
}

size_t ShmRecvChannel::tryRecvDeferred(void* data, size_t n) {
  return recvWith(data, n, [](void* d, const void* s, size_t k) { std::memcpy(d, s, k); });
}

size_t ShmRecvChannel::tryRecvStreamingDeferred(void* data, size_t n) {
  return recvWith(data, n,
                  [](void* d, const void* s, size_t k) { kernels::copyStreaming(d, s, k); });
}

size_t ShmRecvChannel::tryRecv(void* data, size_t n) {
  size_t done = tryRecvDeferred(data, n);
  flush();
  return done;
}

void ShmRecvChannel::align() {
  tail_ = (tail_ + 7) & ~uint64_t(7);
  published_ = tail_;
  h_->tail.store(tail_, std::memory_order_release);
}

void ShmRecvChannel::checkPeer() {
  int pid = left_->header()->pid;
  if (!pidAlive(pid))
    failPeer(left_rank_, strCat("pid ", pid, " on this host"), "rank ", left_label_, " (pid ",
             pid, " on this host) died");
}

std::string ShmRecvChannel::describe() const { return strCat("rank ", left_label_, " (shm)"); }

}  // namespace transport
}  // namespace tfring
