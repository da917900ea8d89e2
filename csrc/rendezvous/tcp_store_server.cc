// TcpStoreServer: one thread serves every connection of the store, however
// many ranks connect (the wire format is documented in tcp_store.cc).
//
// Each connection is a small state machine driven by poll():
//   kHello    waiting for message 1 of the HMAC handshake (common/wire.h)
//   kProof    waiting for message 3, then sending message 4
//   kServing  waiting for a request frame (an idle client waits unbounded)
//   kParked   a GET, WAIT or GETN whose keys do not all exist yet
// A parked request holds no thread: the connection is answered when a SET
// or ADD makes its keys exist, or with TIMEOUT when the deadline the client
// sent passes. A parked request waits on its first missing key (waiters_);
// setting that key re-examines only those connections, which then wait on
// their next missing key or are answered, so every key costs each waiter
// one look.
//
// Replies go to a per-connection output buffer that is sent at once and, if
// the socket is full, drained as poll() reports it writable. While a reply
// is unsent or a request parked, the connection's next request is not read:
// a client has one request in flight per connection. A connection that
// misbehaves ends alone: the handshake must complete within the handshake
// timeout (TFRING_HANDSHAKE_TIMEOUT, default 10 s: wire::helloTimeout(), read
// when the server is made) of the connect, a request's body within it of its
// length, and a reply must be taken within it; a malformed request, garbage
// or a disconnect closes it.
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <map>
#include <unordered_map>

#include "common/logging.h"
#include "common/net.h"
#include "common/status.h"
#include "common/wire.h"
#include "rendezvous/store_codec.h"
#include "rendezvous/tcp_store.h"

namespace tfring {
namespace rendezvous {
using namespace storewire;  // NOLINT: the codec is this file's vocabulary

namespace {

enum class State { kHello, kProof, kServing, kParked };

constexpr Clock::time_point kNever = Clock::time_point::max();

struct Conn {
  int fd = -1;
  uint64_t id = 0;
  State state = State::kHello;
  std::string who;   // names the peer: the handshake's words until it is done
  std::string addr;  // ip:port
  std::unique_ptr<wire::HelloAcceptor> hello;
  Bytes in;  // the frame being read: its 4-byte length, then its body
  Bytes out;  // the frame being sent
  size_t sent = 0;
  std::string refusal;  // a refused handshake: logged and closed once `out` is sent
  bool dead = false;    // closed at the end of this round
  // The handshake's, a request body's or a reply's deadline; kNever while
  // idle or parked.
  Clock::time_point io_deadline = kNever;
  // kParked: the request, its keys (GET: its one key), the first of them not
  // yet set, and when it times out.
  uint8_t op = 0;
  std::vector<std::string> keys;
  size_t missing = 0;
  Clock::time_point wait_until = kNever;

  bool handshaking() const { return state == State::kHello || state == State::kProof; }
  bool sending() const { return sent < out.size(); }
};

uint32_t frameLength(const Bytes& in) {
  return in[0] | (in[1] << 8) | (in[2] << 16) | (static_cast<uint32_t>(in[3]) << 24);
}

}  // namespace

class TcpStoreServer::Loop {
 public:
  explicit Loop(TcpStoreServer* server) : s_(server) {}
  ~Loop() {
    // stop(): every client sees its connection close, a parked one too.
    for (auto& kv : conns_) net::closeFd(kv.second->fd);
  }
  void run();

 private:
  void acceptAll();
  void readFrom(Conn& c);
  void handleFrame(Conn& c, Bytes frame);
  void serve(Conn& c, Request q);
  void keySet(const std::string& key);
  void answer(Conn& c, bool timed_out);
  void send(Conn& c, const Bytes& payload);
  void flush(Conn& c);
  void lost(Conn& c, const std::string& why);
  void expire(Clock::time_point now);
  void park(Conn& c);
  void unpark(Conn& c);
  bool advance(Conn& c);  // moves c.missing past set keys; true once all are set
  // Now plus the handshake timeout: the bound on a handshake, a request's
  // body or the taking of a reply.
  Clock::time_point ioDeadline() const {
    return Clock::now() + std::chrono::duration_cast<Clock::duration>(
                              std::chrono::duration<double>(s_->hello_timeout_s_));
  }

  TcpStoreServer* s_;
  std::unordered_map<uint64_t, std::unique_ptr<Conn>> conns_;
  std::map<std::string, Bytes> data_;
  // key -> the parked connections whose first missing key it is
  std::unordered_map<std::string, std::vector<uint64_t>> waiters_;
  uint64_t next_id_ = 1;
  Clock::time_point accept_paused_until_{};
};

void TcpStoreServer::Loop::run() {
  std::vector<struct pollfd> fds;
  std::vector<Conn*> polled;
  while (!s_->stop_) {
    const auto now = Clock::now();
    fds.clear();
    polled.clear();
    fds.push_back({s_->wake_fds_[0], POLLIN, 0});
    const bool accepting = now >= accept_paused_until_;
    fds.push_back({accepting ? s_->listen_fd_ : -1, POLLIN, 0});
    Clock::time_point next = accepting ? kNever : accept_paused_until_;
    for (auto& kv : conns_) {
      Conn& c = *kv.second;
      // A parked connection is watched only for its peer going away.
      short events = c.sending() ? POLLOUT : c.state == State::kParked ? POLLRDHUP : POLLIN;
      fds.push_back({c.fd, events, 0});
      polled.push_back(&c);
      next = std::min({next, c.io_deadline, c.wait_until});
    }
    int timeout_ms = -1;
    if (next != kNever) {
      auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(next - now).count() + 1;
      timeout_ms = static_cast<int>(std::max<int64_t>(0, std::min<int64_t>(ms, INT_MAX / 2)));
    }
    int rc = ::poll(fds.data(), fds.size(), timeout_ms);
    if (rc < 0 && errno != EINTR) {
      TFRING_LOG(kError, "store server on port ", s_->port_, ": poll failed: ",
                 std::strerror(errno), "; the store stops serving");
      break;
    }
    if (s_->stop_ || (rc > 0 && fds[0].revents)) break;
    if (rc > 0) {
      for (size_t i = 0; i < polled.size(); ++i) {
        const short re = fds[i + 2].revents;
        Conn& c = *polled[i];
        if (!re || c.dead) continue;
        if (c.sending()) {
          if (re & (POLLOUT | POLLERR | POLLHUP)) flush(c);
        } else if (c.state == State::kParked) {
          if (re & (POLLRDHUP | POLLERR | POLLHUP | POLLNVAL)) c.dead = true;
        } else {
          readFrom(c);
        }
      }
      if (fds[1].revents) acceptAll();
    }
    expire(Clock::now());
    for (auto it = conns_.begin(); it != conns_.end();) {
      Conn& c = *it->second;
      if (!c.dead) {
        ++it;
        continue;
      }
      if (c.state == State::kParked) unpark(c);
      net::closeFd(c.fd);
      it = conns_.erase(it);
    }
  }
}

void TcpStoreServer::Loop::acceptAll() {
  for (;;) {
    int fd = ::accept4(s_->listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      // The pending connection may have gone away between poll and accept.
      if (errno == EINTR || errno == ECONNABORTED || errno == EPROTO) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      // e.g. EMFILE: keep serving the clients we have, and try again shortly
      // rather than spin on a listening socket that stays readable.
      accept_paused_until_ = Clock::now() + std::chrono::milliseconds(10);
      return;
    }
    auto c = std::make_unique<Conn>();
    c->fd = fd;
    c->id = next_id_++;
    try {
      net::setDefaultLiveness(fd);
      net::setNoDelay(fd);
    } catch (const Error&) {
      net::closeFd(fd);
      continue;
    }
    c->addr = wire::peerAddress(fd);
    c->who = "a process connecting from " + c->addr;
    c->hello = std::make_unique<wire::HelloAcceptor>(wire::kPurposeStore, s_->secret_, c->who);
    c->io_deadline = ioDeadline();
    conns_.emplace(c->id, std::move(c));
  }
}

// Reads what has arrived of the current frame, and handles every frame that
// completes while the connection may take requests.
void TcpStoreServer::Loop::readFrom(Conn& c) {
  constexpr size_t kStep = 1u << 20;  // a length alone cannot make us allocate
  while (!c.dead && !c.sending() && c.state != State::kParked) {
    size_t want = c.in.size() < 4 ? 4 - c.in.size() : 4 + frameLength(c.in) - c.in.size();
    if (want > 0) {
      const size_t have = c.in.size();
      const size_t take = std::min(want, kStep);
      c.in.resize(have + take);
      ssize_t rc = ::recv(c.fd, c.in.data() + have, take, MSG_DONTWAIT);
      c.in.resize(have + (rc > 0 ? static_cast<size_t>(rc) : 0));
      if (rc == 0) {
        lost(c, strCat("the connection to ", c.who,
                       " was closed by the peer (it may have exited)"));
        return;
      }
      if (rc < 0) {
        const int err = errno;
        if (err == EINTR) continue;
        if (err == EAGAIN || err == EWOULDBLOCK) return;
        lost(c, strCat("lost the connection to ", c.who, " while receiving: ",
                       std::strerror(err)));
        return;
      }
      if (have < 4 && c.in.size() == 4) {  // the length is in
        const uint32_t n = frameLength(c.in);
        const uint32_t limit = c.handshaking() ? wire::kMaxHelloFrame : kMaxFrame;
        if (n > limit) {
          lost(c, strCat("frame of ", n, " bytes from ", c.who, " exceeds the ", limit,
                         "-byte limit (a corrupt stream or not a tfring peer)"));
          return;
        }
        if (!c.handshaking())
          c.io_deadline = ioDeadline();
      }
      if (c.in.size() < 4 || c.in.size() < 4 + size_t{frameLength(c.in)}) continue;
    }
    Bytes frame(c.in.begin() + 4, c.in.end());
    c.in.clear();
    c.in.shrink_to_fit();  // an idle connection keeps no large buffer
    if (!c.handshaking()) c.io_deadline = kNever;
    handleFrame(c, std::move(frame));
  }
}

void TcpStoreServer::Loop::handleFrame(Conn& c, Bytes frame) {
  switch (c.state) {
    case State::kHello: {
      Bytes m2;
      try {
        m2 = c.hello->answerHello(frame);
      } catch (const Error& e) {
        lost(c, e.what());
        return;
      }
      c.state = State::kProof;
      if (c.hello->refused()) c.refusal = c.hello->refusal();
      send(c, m2);
      return;
    }
    case State::kProof: {
      Bytes m4;
      try {
        m4 = c.hello->answerProof(frame);
      } catch (const Error& e) {
        lost(c, e.what());
        return;
      }
      if (!c.hello->accepted()) c.refusal = c.hello->refusal();
      send(c, m4);
      return;
    }
    case State::kServing: {
      Request q;
      try {
        q = parseRequest(frame, c.who);
      } catch (const Error&) {
        c.dead = true;  // a malformed request ends its connection only
        return;
      }
      serve(c, std::move(q));
      return;
    }
    case State::kParked:
      return;  // not reached: a parked connection's requests are not read
  }
}

void TcpStoreServer::Loop::serve(Conn& c, Request q) {
  Writer w;
  switch (q.op) {
    case kSet:
      data_[q.key] = std::move(q.value);
      send(c, w.u8(kOk).take());
      keySet(q.key);
      return;
    case kAdd: {
      int64_t value = 0;
      auto it = data_.find(q.key);
      if (it != data_.end() && !parseCounter(it->second, &value)) {
        send(c, w.u8(kFailed).str("it holds a value that is not an integer counter").take());
        return;
      }
      value = static_cast<int64_t>(static_cast<uint64_t>(value) + static_cast<uint64_t>(q.num));
      std::string text = std::to_string(value);
      data_[q.key] = Bytes(text.begin(), text.end());
      send(c, w.u8(kOk).i64(value).take());
      keySet(q.key);
      return;
    }
    case kCheck: {
      bool all = true;
      for (auto& k : q.keys) all = all && data_.count(k);
      send(c, w.u8(kOk).u8(all ? 1 : 0).take());
      return;
    }
    case kGet:
    case kWait:
    case kGetMany: {
      c.op = q.op;
      c.keys = q.op == kGet ? std::vector<std::string>{q.key} : std::move(q.keys);
      c.missing = 0;
      c.wait_until = Clock::now() + std::chrono::microseconds(q.num);
      if (advance(c)) {
        answer(c, false);
      } else if (Clock::now() >= c.wait_until) {
        answer(c, true);
      } else {
        park(c);
      }
      return;
    }
  }
}

bool TcpStoreServer::Loop::advance(Conn& c) {
  while (c.missing < c.keys.size() && data_.count(c.keys[c.missing])) ++c.missing;
  return c.missing == c.keys.size();
}

void TcpStoreServer::Loop::park(Conn& c) {
  c.state = State::kParked;
  waiters_[c.keys[c.missing]].push_back(c.id);
}

void TcpStoreServer::Loop::unpark(Conn& c) {
  auto it = waiters_.find(c.keys[c.missing]);
  if (it != waiters_.end()) {
    auto& ids = it->second;
    ids.erase(std::remove(ids.begin(), ids.end(), c.id), ids.end());
    if (ids.empty()) waiters_.erase(it);
  }
  c.state = State::kServing;
}

// `key` now exists: the connections parked on it move on to their next
// missing key, or are answered.
void TcpStoreServer::Loop::keySet(const std::string& key) {
  auto it = waiters_.find(key);
  if (it == waiters_.end()) return;
  std::vector<uint64_t> ids = std::move(it->second);
  waiters_.erase(it);
  for (uint64_t id : ids) {
    auto ci = conns_.find(id);
    if (ci == conns_.end()) continue;
    Conn& c = *ci->second;
    if (c.state != State::kParked) continue;
    if (advance(c)) {
      c.state = State::kServing;
      answer(c, false);
    } else {
      waiters_[c.keys[c.missing]].push_back(c.id);
    }
  }
}

// The reply to a GET, WAIT or GETN whose keys all exist (or whose deadline
// has passed); the connection goes back to reading requests.
void TcpStoreServer::Loop::answer(Conn& c, bool timed_out) {
  Writer w;
  c.wait_until = kNever;
  if (timed_out) {
    w.u8(kTimedOut);
    if (c.op != kGet) {
      std::vector<std::string> missing;
      for (auto& k : c.keys)
        if (!data_.count(k)) missing.push_back(k);
      w.strs(missing);
    }
  } else if (c.op == kGet) {
    w.u8(kOk).bytes(data_[c.keys[0]]);
  } else if (c.op == kGetMany) {
    w.u8(kOk).u32(static_cast<uint32_t>(c.keys.size()));
    for (auto& k : c.keys) w.bytes(data_[k]);
  } else {
    w.u8(kOk);
  }
  c.keys.clear();
  c.missing = 0;
  send(c, w.take());
}

void TcpStoreServer::Loop::send(Conn& c, const Bytes& payload) {
  c.out = Writer().u32(static_cast<uint32_t>(payload.size())).take();
  c.out.insert(c.out.end(), payload.begin(), payload.end());
  c.sent = 0;
  if (!c.handshaking())  // the handshake keeps its own overall deadline
    c.io_deadline = ioDeadline();
  flush(c);
}

void TcpStoreServer::Loop::flush(Conn& c) {
  while (c.sending()) {
    ssize_t rc = ::send(c.fd, c.out.data() + c.sent, c.out.size() - c.sent,
                        MSG_NOSIGNAL | MSG_DONTWAIT);
    if (rc > 0) {
      c.sent += static_cast<size_t>(rc);
      continue;
    }
    const int err = rc < 0 ? errno : EPIPE;
    if (err == EINTR) continue;
    if (err == EAGAIN || err == EWOULDBLOCK) return;  // poll() says when to go on
    lost(c, strCat("lost the connection to ", c.who, " while sending: ", std::strerror(err)));
    return;
  }
  c.out.clear();
  c.out.shrink_to_fit();
  c.sent = 0;
  if (!c.refusal.empty()) {  // the refusal is answered: log it and close
    s_->logRejection(c.refusal);
    c.dead = true;
    return;
  }
  if (c.state == State::kProof && c.hello->accepted()) {  // message 4 is out: the client is in
    c.state = State::kServing;
    c.who = "the tfring store client at " + c.addr;
    c.hello.reset();
  }
  if (!c.handshaking()) c.io_deadline = kNever;
}

// Ends a connection that failed. A failed handshake is logged (rate
// limited) as acceptHello words it; a served client that goes away or
// misbehaves ends only its own connection, silently.
void TcpStoreServer::Loop::lost(Conn& c, const std::string& why) {
  if (c.state == State::kHello) {
    s_->logRejection(strCat("ignored ", c.who, ": ", why));
  } else if (c.state == State::kProof) {
    s_->logRejection(why);
  }
  c.dead = true;
}

void TcpStoreServer::Loop::expire(Clock::time_point now) {
  for (auto& kv : conns_) {
    Conn& c = *kv.second;
    if (c.dead) continue;
    if (c.state == State::kParked && now >= c.wait_until) {
      unpark(c);
      answer(c, true);
    } else if (now >= c.io_deadline) {
      if (c.sending()) {
        lost(c, strCat("timed out sending ", c.out.size(), " bytes to ", c.who, " (", c.sent,
                       " sent)"));
      } else if (c.in.size() < 4) {
        lost(c, strCat("timed out receiving 4 bytes from ", c.who, " (", c.in.size(),
                       " received)"));
      } else {
        lost(c, strCat("timed out receiving ", frameLength(c.in), " bytes from ", c.who, " (",
                       c.in.size() - 4, " received)"));
      }
    }
  }
}

// ------------------------------------------------------ server lifetime ----

TcpStoreServer::TcpStoreServer(const std::string& host, int port, std::string secret)
    : secret_(std::move(secret)), hello_timeout_s_(wire::helloTimeout()) {
  net::raiseFdLimit(1L << 16);  // one connection per client: a job's every rank
  listen_fd_ = net::listenOn(host, port, &port_);
  if (::pipe2(wake_fds_, O_CLOEXEC | O_NONBLOCK) != 0) {
    int err = errno;
    net::closeFd(listen_fd_);
    fail(Code::kInternal, "pipe2 failed: ", std::strerror(err));
  }
  thread_ = std::thread([this] {
    Loop loop(this);
    loop.run();
  });
}

TcpStoreServer::~TcpStoreServer() { stop(); }

void TcpStoreServer::stop() {
  std::lock_guard<std::mutex> stop_lock(stop_mu_);
  if (!thread_.joinable()) return;  // already stopped
  stop_ = true;
  char c = 1;
  while (::write(wake_fds_[1], &c, 1) < 0 && errno == EINTR) {
  }
  thread_.join();  // the loop closes every client connection as it ends
  net::closeFd(listen_fd_);
  net::closeFd(wake_fds_[0]);
  net::closeFd(wake_fds_[1]);
  listen_fd_ = wake_fds_[0] = wake_fds_[1] = -1;
}

void TcpStoreServer::logRejection(const std::string& why) {
  // Strangers may knock often: log the 1st, 10th, 100th... rejection. Only
  // the serving thread counts them.
  ++rejections_;
  for (int64_t n = 1; n <= rejections_; n *= 10) {
    if (n == rejections_) {
      TFRING_LOG(kWarning, "store server on port ", port_, ": ", why, " (", n,
                 n == 1 ? " connection" : " connections", " refused so far)");
      return;
    }
  }
}

}  // namespace rendezvous
}  // namespace tfring
