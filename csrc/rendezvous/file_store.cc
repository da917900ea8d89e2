// Layout of the store directory:
//
//   k_<encoded key>        one file per key; its contents are the value
//   l_<encoded key>        lock file taken (flock) by add() on that key
//   .tmp.<pid>.<n>.<key>   a value being written; renamed onto k_... when
//                          complete, so a key file is either absent or whole
//
// Keys are encoded byte-wise: [A-Za-z0-9_-] stay, every other byte becomes
// %XX, so '/', ':' and '.' can never escape the directory or collide. Keys
// whose encoding would exceed a file name's length keep a prefix plus a
// hash of the whole key. Counters (add) are stored as decimal text, like
// TcpStore, so get() on a counter returns e.g. b"3". Readers poll with a
// short backoff (1 ms doubling to 10 ms): there is no portable change
// notification on shared filesystems.
#include "rendezvous/file_store.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "common/clock.h"
#include "common/status.h"

namespace tfring {
namespace rendezvous {
namespace {

constexpr size_t kMaxEncoded = 180;  // file names are limited to 255 bytes
constexpr double kLockTimeout = 60.0;

std::string encodeKey(const std::string& key) {
  static const char* hex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : key) {
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
        c == '_' || c == '-') {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  if (out.size() > kMaxEncoded) {
    uint64_t h = 1469598103934665603ull;  // FNV-1a of the raw key
    for (unsigned char c : key) h = (h ^ c) * 1099511628211ull;
    char buf[20];
    std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(h));
    out = out.substr(0, kMaxEncoded - 17) + "~" + buf;
  }
  return out;
}

void mkdirs(const std::string& dir) {
  std::string cur;
  size_t pos = 0;
  while (pos != std::string::npos) {
    pos = dir.find('/', pos + 1);
    cur = dir.substr(0, pos);
    if (cur.empty()) continue;
    if (::mkdir(cur.c_str(), 0700) != 0 && errno != EEXIST)
      fail(Code::kUnavailable, "could not create the file store directory ", dir, ": ",
           std::strerror(errno));
  }
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    fail(Code::kUnavailable, "the file store path ", dir, " is not a directory");
}

// Reads a whole file. Returns false if it does not exist.
bool readFile(const std::string& path, Bytes* out) {
  int fd;
  do {
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) {
    if (errno == ENOENT) return false;
    fail(Code::kUnavailable, "could not read the file store key file ", path, ": ",
         std::strerror(errno));
  }
  out->clear();
  uint8_t buf[65536];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n > 0) {
      out->insert(out->end(), buf, buf + n);
    } else if (n == 0) {
      break;
    } else if (errno != EINTR) {
      int err = errno;
      ::close(fd);
      fail(Code::kUnavailable, "could not read ", path, ": ", std::strerror(err));
    }
  }
  ::close(fd);
  return true;
}

// Writes to a unique temporary name in the same directory, then rename()s it
// over the target: rename is atomic, so readers see the old or new value.
void writeAtomically(const std::string& dir, const std::string& target, const Bytes& value) {
  static std::atomic<uint64_t> counter{0};
  std::string tmp = dir + "/.tmp." + std::to_string(::getpid()) + "." +
                    std::to_string(counter.fetch_add(1)) + "." +
                    target.substr(target.rfind('/') + 1);
  int fd;
  do {
    fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0)
    fail(Code::kUnavailable, "could not write the file store key file ", tmp, ": ",
         std::strerror(errno));
  size_t done = 0;
  while (done < value.size()) {
    ssize_t n = ::write(fd, value.data() + done, value.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int err = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      fail(Code::kUnavailable, "could not write ", tmp, ": ", std::strerror(err));
    }
    done += static_cast<size_t>(n);
  }
  ::close(fd);
  if (::rename(tmp.c_str(), target.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    fail(Code::kUnavailable, "could not rename ", tmp, " to ", target, ": ",
         std::strerror(err));
  }
}

bool exists(const std::string& path) { return ::access(path.c_str(), F_OK) == 0; }

// Sleeps for the current backoff (never past the deadline) and grows it.
void backoffSleep(double* backoff, const Deadline& deadline) {
  double s = std::min(*backoff, std::max(0.0, deadline.remaining()));
  std::this_thread::sleep_for(std::chrono::duration<double>(s));
  *backoff = std::min(*backoff * 2, 0.01);
}

}  // namespace

FileStore::FileStore(std::string dir) : dir_(std::move(dir)) {
  while (dir_.size() > 1 && dir_.back() == '/') dir_.pop_back();
  if (dir_.empty()) fail(Code::kInvalidArgument, "FileStore needs a directory path");
  mkdirs(dir_);
}

std::string FileStore::path(const std::string& key) const {
  return dir_ + "/k_" + encodeKey(key);
}

void FileStore::set(const std::string& key, const Bytes& value) {
  writeAtomically(dir_, path(key), value);
}

Bytes FileStore::get(const std::string& key, double timeout_s) {
  Deadline deadline = Deadline::in(timeout_s);
  double backoff = 0.001;
  Bytes value;
  for (;;) {
    if (readFile(path(key), &value)) return value;
    if (deadline.expired())
      fail(Code::kTimeout, "timed out after ", fmtSeconds(timeout_s),
           " s waiting for store key [", key, "] in the file store at ", dir_);
    backoffSleep(&backoff, deadline);
  }
}

int64_t FileStore::add(const std::string& key, int64_t delta) {
  // The lock file is separate from the key file because rename() replaces
  // the key file's inode, which would silently drop an flock held on it.
  std::string lock_path = dir_ + "/l_" + encodeKey(key);
  int fd;
  do {
    fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0)
    fail(Code::kUnavailable, "could not open the file store lock file ", lock_path, ": ",
         std::strerror(errno));
  // Non-blocking attempts so a stuck holder yields an error, not a hang.
  // flock locks die with their holder, so a crashed rank never blocks us.
  Deadline deadline = Deadline::in(kLockTimeout);
  double backoff = 0.001;
  while (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    if (errno != EWOULDBLOCK && errno != EINTR) {
      int err = errno;
      ::close(fd);
      fail(Code::kUnavailable, "could not lock ", lock_path, ": ", std::strerror(err));
    }
    if (deadline.expired()) {
      ::close(fd);
      fail(Code::kTimeout, "timed out after ", fmtSeconds(kLockTimeout),
           " s locking store key [", key, "] in the file store at ", dir_,
           " (another process holds ", lock_path, ")");
    }
    backoffSleep(&backoff, deadline);
  }
  int64_t value = 0;
  try {
    Bytes old;
    if (readFile(path(key), &old)) {
      std::string s(old.begin(), old.end());
      char* end = nullptr;
      errno = 0;
      long long v = std::strtoll(s.c_str(), &end, 10);
      if (s.empty() || errno != 0 || end != s.c_str() + s.size())
        fail(Code::kInvalidArgument, "cannot add to store key [", key,
             "] in the file store at ", dir_,
             ": it holds a value that is not an integer counter");
      value = v;
    }
    value += delta;
    std::string text = std::to_string(value);
    writeAtomically(dir_, path(key), Bytes(text.begin(), text.end()));
  } catch (...) {
    ::close(fd);  // releases the flock
    throw;
  }
  ::close(fd);
  return value;
}

void FileStore::wait(const std::vector<std::string>& keys, double timeout_s) {
  Deadline deadline = Deadline::in(timeout_s);
  double backoff = 0.001;
  for (;;) {
    std::vector<std::string> missing;
    for (auto& k : keys)
      if (!exists(path(k))) missing.push_back(k);
    if (missing.empty()) return;
    if (deadline.expired())
      fail(Code::kTimeout, "timed out after ", fmtSeconds(timeout_s),
           " s waiting for store keys ", keyList(missing), " in the file store at ", dir_);
    backoffSleep(&backoff, deadline);
  }
}

bool FileStore::check(const std::vector<std::string>& keys) {
  for (auto& k : keys)
    if (!exists(path(k))) return false;
  return true;
}

}  // namespace rendezvous
}  // namespace tfring
