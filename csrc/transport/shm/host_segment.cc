#include "transport/shm/host_segment.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/abort.h"
#include "common/status.h"
#include "transport/shm/shm_channel.h"
#include "transport/waiter.h"

namespace tfring {
namespace transport {

namespace {

constexpr uint64_t kMagic = 0x74736f68676e6972ull;  // "ringhost"
// Waits poll for kSpinSeconds, then poll and sched_yield() (which hands the
// core to a runnable peer when ranks outnumber cores) until kYieldSeconds,
// then sleep on the doorbell's futex.
constexpr double kSpinSeconds = 10e-6;
constexpr double kYieldSeconds = 300e-6;
constexpr double kMaxSleep = 0.05;   // seconds: abort is seen at least this often
constexpr double kHealthInterval = 0.2;

size_t dataOffset(int local_size) {
  size_t off = sizeof(HostHeader) + static_cast<size_t>(local_size) * sizeof(HostRankWords);
  return (off + 63) & ~size_t(63);
}

size_t voteOffset(int local_size, uint64_t slot_bytes) {
  return dataOffset(local_size) + 2 * (local_size + 1) * slot_bytes;
}

}  // namespace

std::unique_ptr<HostSegment> HostSegment::create(const std::string& name, int local_size,
                                                 uint64_t slot_bytes, uint64_t vote_slot_bytes) {
  std::unique_ptr<HostSegment> s(new HostSegment());
  s->name_ = name;
  s->owner_ = true;
  s->local_size_ = local_size;
  slot_bytes = (slot_bytes + 63) & ~uint64_t(63);
  vote_slot_bytes = (vote_slot_bytes + 63) & ~uint64_t(63);
  size_t total = voteOffset(local_size, slot_bytes) + (local_size + 1) * vote_slot_bytes;
  ::shm_unlink(name.c_str());  // a stale one from a crashed job
  int fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) fail(Code::kUnavailable, "shm_open(", name, "): ", strerror(errno));
  if (::ftruncate(fd, static_cast<off_t>(total)) != 0) {
    int e = errno;
    ::close(fd);
    ::shm_unlink(name.c_str());
    fail(Code::kUnavailable, "could not size the host's shared memory ", name, " to ", total,
         " bytes: ", strerror(e), " (is /dev/shm large enough? TFRING_SMALL_THRESHOLD sizes it)");
  }
  void* p = ::mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) fail(Code::kUnavailable, "mmap(", name, "): ", strerror(errno));
  s->mapped_ = total;
  s->header_ = new (p) HostHeader();
  s->header_->slot_bytes = slot_bytes;
  s->header_->vote_slot_bytes = vote_slot_bytes;
  s->header_->local_size = local_size;
  s->header_->leader_polling.store(0);
  s->header_->bell.seq.store(0);
  s->header_->bell.sleeping.store(0);
  s->words_ = reinterpret_cast<HostRankWords*>(static_cast<char*>(p) + sizeof(HostHeader));
  for (int q = 0; q < local_size; ++q) {
    HostRankWords* w = new (&s->words_[q]) HostRankWords();
    w->arrive.store(0);
    w->ready.store(0);
    w->done.store(0);
    w->vote_arrive.store(0);
    w->vote_ready.store(0);
    w->idle.seq.store(0);
    w->idle.sleeping.store(0);
    w->pid = 0;
  }
  s->words_[0].pid = static_cast<int32_t>(::getpid());
  s->data_ = static_cast<char*>(p) + dataOffset(local_size);
  s->votes_ = static_cast<char*>(p) + voteOffset(local_size, slot_bytes);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  reinterpret_cast<std::atomic<uint64_t>*>(&s->header_->magic)->store(kMagic, std::memory_order_release);
  return s;
}

std::unique_ptr<HostSegment> HostSegment::open(const std::string& name, int local_size) {
  std::unique_ptr<HostSegment> s(new HostSegment());
  s->name_ = name;
  s->local_size_ = local_size;
  int fd = ::shm_open(name.c_str(), O_RDWR, 0600);
  if (fd < 0) fail(Code::kUnavailable, "could not open the host's shared memory ", name, ": ",
                   strerror(errno));
  struct stat st;
  if (::fstat(fd, &st) != 0 || st.st_size < static_cast<off_t>(dataOffset(local_size))) {
    ::close(fd);
    fail(Code::kUnavailable, "the host's shared memory ", name, " is truncated");
  }
  void* p = ::mmap(nullptr, st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) fail(Code::kUnavailable, "mmap(", name, "): ", strerror(errno));
  s->mapped_ = st.st_size;
  s->header_ = static_cast<HostHeader*>(p);
  auto magic = reinterpret_cast<std::atomic<uint64_t>*>(&s->header_->magic)->load(std::memory_order_acquire);
  if (magic != kMagic || s->header_->local_size != local_size)
    fail(Code::kUnavailable, "the host's shared memory ", name, " is not initialized for ",
         local_size, " local ranks");
  size_t need = voteOffset(local_size, s->header_->slot_bytes) +
                (local_size + 1) * s->header_->vote_slot_bytes;
  if (static_cast<size_t>(st.st_size) < need)
    fail(Code::kUnavailable, "the host's shared memory ", name, " is truncated");
  s->words_ = reinterpret_cast<HostRankWords*>(static_cast<char*>(p) + sizeof(HostHeader));
  s->data_ = static_cast<char*>(p) + dataOffset(local_size);
  s->votes_ = static_cast<char*>(p) + voteOffset(local_size, s->header_->slot_bytes);
  return s;
}

void HostSegment::unlink() {
  if (owner_) ::shm_unlink(name_.c_str());
  owner_ = false;
}

HostSegment::~HostSegment() {
  unlink();
  if (header_) ::munmap(header_, mapped_);
}

// Publishing costs no read-modify-write while nobody sleeps: the word is
// stored, then `sleeping` read (both seq_cst). A waiter raises `sleeping`
// and then re-reads the words before it sleeps, so either it sees the word
// or this sees the sleeper and rings (which changes the futex word and wakes).
void HostSegment::publish(std::atomic<uint64_t>& word, uint64_t step) {
  word.store(step, std::memory_order_seq_cst);
  if (header_->bell.sleeping.load(std::memory_order_seq_cst)) header_->bell.ring();
}

void HostSegment::waitAll(std::atomic<uint64_t> HostRankWords::*field, uint64_t step,
                          const Deadline& deadline, const char* what,
                          const std::vector<int>& ranks) {
  // Returns the first local rank not yet at `step`, or -1.
  auto lagging = [&]() {
    for (int q = 0; q < local_size_; ++q)
      if ((words_[q].*field).load(std::memory_order_acquire) < step) return q;
    return -1;
  };
  if (lagging() < 0) return;
  const double start = nowSeconds();
  for (int i = 1;; ++i) {
    if (lagging() < 0) return;
    cpuRelax();
    if ((i & 63) == 0 && nowSeconds() - start > kSpinSeconds) break;
  }
  Doorbell& bell = header_->bell;
  double next_health = start + kHealthInterval;
  for (;;) {
    uint32_t ticket = bell.seq.load(std::memory_order_seq_cst);
    int q = lagging();
    if (q < 0) return;
    if (abort_) abort_->checkWaiting();
    double now = nowSeconds();
    if (now >= next_health) {
      next_health = now + kHealthInterval;
      // A rank that is gone can never publish; say so instead of waiting out
      // the deadline.
      for (int r = 0; r < local_size_; ++r) {
        if ((words_[r].*field).load(std::memory_order_acquire) >= step) continue;
        int pid = words_[r].pid;
        if (!pidAlive(pid))
          failPeer(ranks[r], strCat("pid ", pid, " on this host"), "rank ", label_(ranks[r]),
                   " (pid ", pid, " on this host) died during ", what);
      }
      if (deadline.expired())
        fail(Code::kTimeout, "timed out in ", what, " waiting for rank ", label_(ranks[q]),
             " (shared memory; TFRING_TIMEOUT; a peer may be stuck or much slower)");
    }
    if (now - start < kYieldSeconds) {
      sched_yield();
      continue;
    }
    // Announce the sleeper, then re-check the words and the ticket: a
    // publish in between is either seen here or sees the sleeper (publish()).
    bell.sleeping.fetch_add(1, std::memory_order_seq_cst);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (lagging() >= 0 && bell.seq.load(std::memory_order_seq_cst) == ticket) {
      double rem = deadline.remaining();
      double t = rem < kMaxSleep ? (rem > 0.001 ? rem : 0.001) : kMaxSleep;
      futexWait(&bell.seq, ticket, t);
    }
    bell.sleeping.fetch_sub(1, std::memory_order_seq_cst);
  }
}

}  // namespace transport
}  // namespace tfring
