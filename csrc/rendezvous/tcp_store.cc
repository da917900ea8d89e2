// Wire format (all integers little-endian):
//
//   frame    := u32 length, then `length` payload bytes
//   request  := u8 op, then the op's fields
//   string   := u32 length, then bytes (keys, values and the secret alike)
//
//   SET    string key, string value     -> u8 OK
//   GET    string key, i64 timeout_us   -> u8 OK, string value | u8 TIMEOUT
//   ADD    string key, i64 delta        -> u8 OK, i64 new value | u8 ERROR, string why
//   WAIT   u32 n, n strings, i64 timeout_us
//                                       -> u8 OK | u8 TIMEOUT, u32 n, n missing keys
//   CHECK  u32 n, n strings             -> u8 OK, u8 all_present
//   GETN   u32 n, n strings, i64 timeout_us
//                                       -> u8 OK, u32 n, n values | u8 TIMEOUT, u32 n,
//                                          n missing keys
//
// Every connection opens with the mutual HMAC handshake of common/wire.h
// (purpose kPurposeStore): the secret itself never travels, and nothing is
// answered to a peer that has not proved it knows it. Handshake frames are
// capped at 256 bytes, requests at kMaxFrame (checked before allocating), and
// a request's body must arrive within kHelloTimeout of its length; a
// malformed request (unknown op, truncated or trailing bytes, counts larger
// than the frame) closes that one connection only.
// GET, WAIT and GETN block on the server until the keys exist or the timeout the
// client sent passes; the server then answers TIMEOUT and the client raises
// the error, so both sides agree about what timed out. Counters (ADD) are
// stored as decimal text, so get() on a counter returns e.g. b"3".
#include "rendezvous/tcp_store.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "common/logging.h"
#include "common/net.h"
#include "common/status.h"
#include "common/wire.h"

namespace tfring {
namespace rendezvous {
namespace {

enum Op : uint8_t { kSet = 2, kGet = 3, kAdd = 4, kWait = 5, kCheck = 6, kGetMany = 7 };
enum Reply : uint8_t { kOk = 0, kTimedOut = 1, kFailed = 2 };

constexpr uint32_t kMaxFrame = 256u << 20;
constexpr double kHelloTimeout = wire::kHelloTimeout;  // also bounds a request's body
constexpr double kForever = 100.0 * 365 * 24 * 3600;  // idle clients wait this long

class Writer {
 public:
  Writer& u8(uint8_t v) { buf_.push_back(v); return *this; }
  Writer& u32(uint32_t v) { return raw(v, 4); }
  Writer& i64(int64_t v) { return raw(static_cast<uint64_t>(v), 8); }
  Writer& str(const void* p, size_t n) {
    u32(static_cast<uint32_t>(n));
    auto* b = static_cast<const uint8_t*>(p);
    buf_.insert(buf_.end(), b, b + n);
    return *this;
  }
  Writer& str(const std::string& s) { return str(s.data(), s.size()); }
  Writer& bytes(const Bytes& b) { return str(b.data(), b.size()); }
  Writer& strs(const std::vector<std::string>& v) {
    u32(static_cast<uint32_t>(v.size()));
    for (auto& s : v) str(s);
    return *this;
  }
  Bytes take() { return std::move(buf_); }

 private:
  Writer& raw(uint64_t v, int n) {
    for (int i = 0; i < n; ++i) buf_.push_back(static_cast<uint8_t>(v >> (8 * i)));
    return *this;
  }
  Bytes buf_;
};

// Bounds-checked reader: a malformed frame throws instead of reading past it.
class Reader {
 public:
  Reader(const Bytes& b, const std::string& who) : b_(b), who_(who) {}
  uint8_t u8() { need(1); return b_[pos_++]; }
  uint32_t u32() { return static_cast<uint32_t>(raw(4)); }
  int64_t i64() { return static_cast<int64_t>(raw(8)); }
  Bytes bytes() {
    uint32_t n = u32();
    need(n);
    Bytes r(b_.begin() + pos_, b_.begin() + pos_ + n);
    pos_ += n;
    return r;
  }
  std::string str() {
    Bytes b = bytes();
    return std::string(b.begin(), b.end());
  }
  std::vector<std::string> strs() {
    uint32_t n = u32();
    if (n > (b_.size() - pos_) / 4)  // every string takes at least its length
      fail(Code::kInternal, "malformed store frame from ", who_, " (count ", n,
           " exceeds the frame)");
    std::vector<std::string> r;
    for (uint32_t i = 0; i < n; ++i) r.push_back(str());
    return r;
  }

  bool done() const { return pos_ == b_.size(); }

 private:
  uint64_t raw(int n) {
    need(n);
    uint64_t v = 0;
    for (int i = 0; i < n; ++i) v |= static_cast<uint64_t>(b_[pos_++]) << (8 * i);
    return v;
  }
  void need(size_t n) {
    if (b_.size() - pos_ < n)
      fail(Code::kInternal, "malformed store frame from ", who_, " (truncated)");
  }
  const Bytes& b_;
  std::string who_;
  size_t pos_ = 0;
};

void sendFrame(int fd, const Bytes& payload, const Deadline& d, const std::string& peer) {
  Bytes frame = Writer().u32(static_cast<uint32_t>(payload.size())).take();
  frame.insert(frame.end(), payload.begin(), payload.end());
  net::sendAll(fd, frame.data(), frame.size(), d, peer);
}

// Waits for a frame header until `header_deadline` (which may be far away:
// idle clients), then reads the body within `body_timeout_s`.
Bytes recvFrame(int fd, const Deadline& header_deadline, double body_timeout_s,
                uint32_t max_len, const std::string& peer) {
  uint8_t hdr[4];
  net::recvAll(fd, hdr, 4, header_deadline, peer);
  uint32_t n = hdr[0] | (hdr[1] << 8) | (hdr[2] << 16) | (static_cast<uint32_t>(hdr[3]) << 24);
  if (n > max_len)
    fail(Code::kInternal, "store frame of ", n, " bytes from ", peer, " exceeds the ",
         max_len, "-byte limit");
  Bytes body(n);
  net::recvAll(fd, body.data(), n, Deadline::in(body_timeout_s), peer);
  return body;
}

int64_t toMicros(double s) {
  if (!(s > 0)) return 0;
  return s > kForever ? static_cast<int64_t>(kForever * 1e6) : static_cast<int64_t>(s * 1e6);
}

// Counters are decimal text. Returns false if `v` is not an integer.
bool parseCounter(const Bytes& v, int64_t* out) {
  std::string s(v.begin(), v.end());
  if (s.empty()) return false;
  char* end = nullptr;
  errno = 0;
  long long r = std::strtoll(s.c_str(), &end, 10);
  if (errno != 0 || end != s.c_str() + s.size()) return false;
  *out = r;
  return true;
}

// One decoded request; parseRequest rejects anything but exactly one
// well-formed request of a known op.
struct Request {
  uint8_t op = 0;
  std::string key;
  Bytes value;
  int64_t num = 0;  // GET/WAIT timeout_us, ADD delta
  std::vector<std::string> keys;
};

Request parseRequest(const Bytes& frame, const std::string& peer) {
  Reader r(frame, peer);
  Request q;
  q.op = r.u8();
  switch (q.op) {
    case kSet: q.key = r.str(); q.value = r.bytes(); break;
    case kGet: q.key = r.str(); q.num = r.i64(); break;
    case kAdd: q.key = r.str(); q.num = r.i64(); break;
    case kWait: q.keys = r.strs(); q.num = r.i64(); break;
    case kGetMany: q.keys = r.strs(); q.num = r.i64(); break;
    case kCheck: q.keys = r.strs(); break;
    default: fail(Code::kInternal, "unknown store request ", unsigned(q.op), " from ", peer);
  }
  if (!r.done()) fail(Code::kInternal, "malformed store frame from ", peer, " (trailing bytes)");
  // A hostile timeout must not overflow the clock arithmetic below.
  if ((q.op == kGet || q.op == kWait || q.op == kGetMany) &&
      (q.num < 0 || q.num > toMicros(kForever)))
    q.num = q.num < 0 ? 0 : toMicros(kForever);
  return q;
}

}  // namespace

void checkStoreRequest(const Bytes& frame) { parseRequest(frame, "the caller"); }

// ------------------------------------------------------------- server ----

TcpStoreServer::TcpStoreServer(const std::string& host, int port, std::string secret)
    : secret_(std::move(secret)) {
  net::raiseFdLimit(1L << 16);  // one connection per client: a job's every rank
  listen_fd_ = net::listenOn(host, port, &port_);
  if (::pipe2(wake_fds_, O_CLOEXEC | O_NONBLOCK) != 0) {
    int err = errno;
    net::closeFd(listen_fd_);
    fail(Code::kInternal, "pipe2 failed: ", std::strerror(err));
  }
  thread_ = std::thread([this] { serve(); });
}

TcpStoreServer::~TcpStoreServer() { stop(); }

void TcpStoreServer::stop() {
  std::lock_guard<std::mutex> stop_lock(stop_mu_);
  if (!thread_.joinable()) return;  // already stopped
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    // shutdown() (not close) wakes threads blocked in recv/send on these fds
    // without letting the fd numbers be reused while they still run.
    for (int fd : client_fds_) ::shutdown(fd, SHUT_RDWR);
    cv_.notify_all();  // wakes GET/WAIT handlers
  }
  char c = 1;
  while (::write(wake_fds_[1], &c, 1) < 0 && errno == EINTR) {
  }
  thread_.join();
  // serve() has returned, so clients_ no longer changes.
  for (auto& t : clients_) t.join();
  clients_.clear();
  net::closeFd(listen_fd_);
  net::closeFd(wake_fds_[0]);
  net::closeFd(wake_fds_[1]);
  listen_fd_ = wake_fds_[0] = wake_fds_[1] = -1;
}

void TcpStoreServer::reapFinished() {
  std::vector<std::thread::id> done;
  {
    std::lock_guard<std::mutex> lock(mu_);
    done.swap(finished_);
  }
  for (auto id : done) {
    auto it = std::find_if(clients_.begin(), clients_.end(),
                           [&](const std::thread& t) { return t.get_id() == id; });
    if (it != clients_.end()) {
      it->join();  // returns at once: the thread is past its last lock
      clients_.erase(it);
    }
  }
}

void TcpStoreServer::serve() {
  while (!stop_) {
    struct pollfd p[2] = {{listen_fd_, POLLIN, 0}, {wake_fds_[0], POLLIN, 0}};
    int rc = ::poll(p, 2, -1);
    if (rc < 0 && errno != EINTR) break;
    if (stop_ || (rc > 0 && p[1].revents)) break;
    reapFinished();
    int fd;
    try {
      fd = net::acceptWithDeadline(listen_fd_, Deadline::in(0));
    } catch (const Error&) {
      // e.g. EMFILE: keep serving the clients we have, without spinning.
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      continue;
    }
    if (fd < 0) continue;
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) {
      net::closeFd(fd);
      break;
    }
    client_fds_.push_back(fd);
    clients_.emplace_back([this, fd] { handleClient(fd); });
  }
}

void TcpStoreServer::handleClient(int fd) {
  std::string peer = "a tfring store client";
  auto reply = [&](const Bytes& payload) {
    sendFrame(fd, payload, Deadline::in(kHelloTimeout), peer);
  };
  try {
    net::setNonBlocking(fd, false);
    net::setNoDelay(fd);
    int rank = -1;
    std::string why;
    if (!wire::acceptHello(fd, wire::kPurposeStore, secret_, Deadline::in(kHelloTimeout), &rank,
                           &why)) {
      logRejection(why);
      cleanupClient(fd);
      return;
    }
    peer = "the tfring store client at " + wire::peerAddress(fd);
    for (;;) {
      Request q = parseRequest(
          recvFrame(fd, Deadline::in(kForever), kHelloTimeout, kMaxFrame, peer), peer);
      Writer w;
      switch (q.op) {
        case kSet: {
          {
            std::lock_guard<std::mutex> lock(mu_);
            data_[q.key] = std::move(q.value);
          }
          cv_.notify_all();
          w.u8(kOk);
          break;
        }
        case kGet: {
          auto until = Clock::now() + std::chrono::microseconds(q.num);
          std::unique_lock<std::mutex> lock(mu_);
          bool found = cv_.wait_until(lock, until, [&] { return stop_ || data_.count(q.key); });
          if (stop_) fail(Code::kAborted, "the store server is stopping");
          if (found) {
            w.u8(kOk).bytes(data_[q.key]);
          } else {
            w.u8(kTimedOut);
          }
          break;
        }
        case kAdd: {
          int64_t value = 0;
          bool bad = false;
          {
            std::lock_guard<std::mutex> lock(mu_);
            auto it = data_.find(q.key);
            if (it != data_.end() && !parseCounter(it->second, &value)) {
              bad = true;
            } else {
              value = static_cast<int64_t>(static_cast<uint64_t>(value) +
                                           static_cast<uint64_t>(q.num));
              std::string text = std::to_string(value);
              data_[q.key] = Bytes(text.begin(), text.end());
            }
          }
          if (bad) {
            w.u8(kFailed).str("it holds a value that is not an integer counter");
          } else {
            cv_.notify_all();
            w.u8(kOk).i64(value);
          }
          break;
        }
        case kWait:
        case kGetMany: {
          auto until = Clock::now() + std::chrono::microseconds(q.num);
          std::vector<std::string> missing;
          std::unique_lock<std::mutex> lock(mu_);
          auto all = [&] {
            for (auto& k : q.keys)
              if (!data_.count(k)) return false;
            return true;
          };
          bool found = cv_.wait_until(lock, until, [&] { return stop_ || all(); });
          if (stop_) fail(Code::kAborted, "the store server is stopping");
          if (found && q.op == kGetMany) {
            w.u8(kOk).u32(static_cast<uint32_t>(q.keys.size()));
            for (auto& k : q.keys) w.bytes(data_[k]);
          } else if (found) {
            w.u8(kOk);
          } else {
            for (auto& k : q.keys)
              if (!data_.count(k)) missing.push_back(k);
            w.u8(kTimedOut).strs(missing);
          }
          break;
        }
        case kCheck: {
          bool all = true;
          {
            std::lock_guard<std::mutex> lock(mu_);
            for (auto& k : q.keys) all = all && data_.count(k);
          }
          w.u8(kOk).u8(all ? 1 : 0);
          break;
        }
      }
      reply(w.take());
    }
  } catch (const std::exception&) {
    // A client that disconnects, misbehaves or is shut down by stop() ends
    // only its own connection; the server and the other clients go on.
  }
  cleanupClient(fd);
}

void TcpStoreServer::logRejection(const std::string& why) {
  // Strangers may knock often: log the 1st, 10th, 100th... rejection.
  std::lock_guard<std::mutex> lock(mu_);
  ++rejections_;
  for (int64_t n = 1; n <= rejections_; n *= 10) {
    if (n == rejections_) {
      TFRING_LOG(kWarning, "store server on port ", port_, ": ", why, " (", n,
                 n == 1 ? " connection" : " connections", " refused so far)");
      return;
    }
  }
}

void TcpStoreServer::cleanupClient(int fd) {
  std::lock_guard<std::mutex> lock(mu_);
  client_fds_.erase(std::remove(client_fds_.begin(), client_fds_.end(), fd), client_fds_.end());
  net::closeFd(fd);  // under mu_, so stop() never shuts down a reused fd number
  finished_.push_back(std::this_thread::get_id());
}

// ------------------------------------------------------------- client ----

TcpStore::TcpStore(const std::string& host, int port, std::string secret,
                   double connect_timeout_s)
    : host_(host),
      port_(port),
      secret_(std::move(secret)),
      addr_(host.find(':') != std::string::npos ? "[" + host + "]:" + std::to_string(port)
                                                : host + ":" + std::to_string(port)),
      connect_timeout_s_(connect_timeout_s),
      io_timeout_s_(std::max(connect_timeout_s, 30.0)) {
  idle_fds_.push_back(openConnection(connect_timeout_s));
}

TcpStore::~TcpStore() {
  for (int fd : idle_fds_) net::closeFd(fd);
}

int TcpStore::openConnection(double timeout_s) {
  const std::string who = "the tfring store at " + addr_;
  int fd;
  try {
    fd = net::connectTo(host_, port_, Deadline::in(timeout_s));
  } catch (const Error& e) {
    // net says "could not connect to <addr> within T s: <reason>"; keep the
    // detail and say what <addr> is.
    std::string detail = e.what();
    const std::string prefix = "could not connect to " + addr_;
    if (detail.compare(0, prefix.size(), prefix) == 0) {
      detail = detail.substr(prefix.size());
    } else {
      detail = ": " + detail;
    }
    fail(e.status().code(), "could not connect to the tfring store at ", addr_, detail,
         " (is rank 0 running?)");
  }
  try {
    wire::clientHandshake(fd, wire::kPurposeStore, -1, secret_,
                          Deadline::in(std::max(timeout_s, kHelloTimeout)), who);
  } catch (...) {
    net::closeFd(fd);
    throw;
  }
  return fd;
}

Bytes TcpStore::roundTrip(const Bytes& request, double wait_s) {
  const std::string who = "the tfring store at " + addr_;
  int fd = -1;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!broken_.empty())
      fail(Code::kPeerFailure, "the connection to ", who, " was lost earlier (", broken_,
           "); the job cannot continue without its store");
    if (!idle_fds_.empty()) {
      fd = idle_fds_.back();
      idle_fds_.pop_back();
    }
  }
  if (fd < 0) fd = openConnection(connect_timeout_s_);
  Bytes reply;
  try {
    sendFrame(fd, request, Deadline::in(io_timeout_s_), who);
    reply = recvFrame(fd, Deadline::in(std::max(wait_s, 0.0) + io_timeout_s_),
                      io_timeout_s_, kMaxFrame, who);
  } catch (const Error& e) {
    // A half-finished exchange leaves the stream out of sync: drop it. A lost
    // server (its keys are gone with it) fails every later call as well.
    net::closeFd(fd);
    if (e.status().code() == Code::kPeerFailure) {
      std::lock_guard<std::mutex> lock(mu_);
      broken_ = e.what();
    }
    throw;
  }
  std::lock_guard<std::mutex> lock(mu_);
  idle_fds_.push_back(fd);
  return reply;
}

void TcpStore::set(const std::string& key, const Bytes& value) {
  roundTrip(Writer().u8(kSet).str(key).bytes(value).take(), 0);
}

Bytes TcpStore::get(const std::string& key, double timeout_s) {
  Bytes ans = roundTrip(Writer().u8(kGet).str(key).i64(toMicros(timeout_s)).take(), timeout_s);
  Reader r(ans, addr_);
  if (r.u8() != kOk)
    fail(Code::kTimeout, "timed out after ", fmtSeconds(timeout_s),
         " s waiting for store key [", key, "] at ", addr_);
  return r.bytes();
}

int64_t TcpStore::add(const std::string& key, int64_t delta) {
  Bytes ans = roundTrip(Writer().u8(kAdd).str(key).i64(delta).take(), 0);
  Reader r(ans, addr_);
  if (r.u8() != kOk)
    fail(Code::kInvalidArgument, "cannot add to store key [", key, "] at ", addr_, ": ",
         r.str());
  return r.i64();
}

void TcpStore::wait(const std::vector<std::string>& keys, double timeout_s) {
  Bytes ans = roundTrip(Writer().u8(kWait).strs(keys).i64(toMicros(timeout_s)).take(),
                        timeout_s);
  Reader r(ans, addr_);
  if (r.u8() != kOk)
    fail(Code::kTimeout, "timed out after ", fmtSeconds(timeout_s),
         " s waiting for store keys ", keyList(r.strs()), " at ", addr_);
}

std::vector<Bytes> TcpStore::getMany(const std::vector<std::string>& keys, double timeout_s) {
  Bytes ans = roundTrip(Writer().u8(kGetMany).strs(keys).i64(toMicros(timeout_s)).take(),
                        timeout_s);
  Reader r(ans, addr_);
  if (r.u8() != kOk)
    fail(Code::kTimeout, "timed out after ", fmtSeconds(timeout_s),
         " s waiting for store keys ", keyList(r.strs()), " at ", addr_);
  const uint32_t n = r.u32();
  if (n != keys.size()) fail(Code::kInternal, "store at ", addr_, " answered ", n, " values for ",
                             keys.size(), " keys");
  std::vector<Bytes> out;
  out.reserve(n);
  for (uint32_t i = 0; i < n; ++i) out.push_back(r.bytes());
  return out;
}

bool TcpStore::check(const std::vector<std::string>& keys) {
  Bytes ans = roundTrip(Writer().u8(kCheck).strs(keys).take(), 0);
  Reader r(ans, addr_);
  r.u8();
  return r.u8() != 0;
}

}  // namespace rendezvous
}  // namespace tfring
