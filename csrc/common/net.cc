#include "common/net.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <climits>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <thread>

#include "common/tunables.h"
#include "common/status.h"

namespace tfring {
namespace net {
namespace {

std::string joinHostPort(const std::string& host, int port) {
  if (host.find(':') != std::string::npos) return strCat("[", host, "]:", port);
  return strCat(host, ":", port);
}

// Milliseconds left before the deadline, clamped for poll(). Never negative.
int pollMillis(const Deadline& deadline) {
  double ms = deadline.remaining() * 1000.0;
  if (ms <= 0) return 0;
  if (ms >= INT_MAX) return INT_MAX;
  return static_cast<int>(ms) + 1;  // round up so we never spin at the end
}

// Waits until fd is ready for `events` or the deadline passes. Returns false
// on timeout. EINTR restarts the wait with the time that is left.
bool waitReady(int fd, short events, const Deadline& deadline) {
  for (;;) {
    struct pollfd p {fd, events, 0};
    int ms = pollMillis(deadline);
    int rc = ::poll(&p, 1, ms);
    if (rc > 0) return true;  // ready, or an error/HUP the next call reports
    if (rc == 0) {
      if (deadline.expired()) return false;
      continue;
    }
    if (errno == EINTR) continue;
    fail(Code::kInternal, "poll failed: ", strerror(errno));
  }
}

struct AddrInfo {
  struct addrinfo* res = nullptr;
  ~AddrInfo() {
    if (res) freeaddrinfo(res);
  }
};

// Resolves host:port; returns the getaddrinfo error code (0 on success).
int resolve(const std::string& host, int port, bool passive, AddrInfo* out) {
  struct addrinfo hints;
  std::memset(&hints, 0, sizeof(hints));
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  if (passive) hints.ai_flags = AI_PASSIVE;
  std::string port_s = std::to_string(port);
  const char* node = host.empty() ? nullptr : host.c_str();
  if (passive && host == "0.0.0.0") node = nullptr;
  if (passive && node == nullptr) hints.ai_family = AF_INET;
  return getaddrinfo(node, port_s.c_str(), &hints, &out->res);
}

// Errors after which the server may simply not be listening yet.
bool retryableConnectError(int err) {
  return err == ECONNREFUSED || err == ETIMEDOUT || err == EHOSTUNREACH ||
         err == ENETUNREACH || err == ECONNRESET || err == EAGAIN;
}

}  // namespace

int listenOn(const std::string& host, int port, int* bound_port, int backlog) {
  AddrInfo ai;
  int gai = resolve(host, port, /*passive=*/true, &ai);
  if (gai != 0)
    fail(Code::kUnavailable, "could not listen on ", joinHostPort(host, port),
         ": cannot resolve the address: ", gai_strerror(gai));
  int last_err = 0;
  for (struct addrinfo* a = ai.res; a; a = a->ai_next) {
    // Non-blocking, so that acceptWithDeadline cannot block in accept() when
    // a connection seen by poll() has been reset before it is accepted.
    // Accepted sockets do not inherit this: they start out blocking.
    int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK,
                      a->ai_protocol);
    if (fd < 0) {
      last_err = errno;
      continue;
    }
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, backlog) == 0) {
      struct sockaddr_storage ss;
      socklen_t len = sizeof(ss);
      if (::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) {
        last_err = errno;
        closeFd(fd);
        continue;
      }
      int p = ss.ss_family == AF_INET6
                  ? ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port)
                  : ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
      if (bound_port) *bound_port = p;
      return fd;
    }
    last_err = errno;
    closeFd(fd);
  }
  fail(Code::kUnavailable, "could not listen on ", joinHostPort(host, port), ": ",
       strerror(last_err));
}

int acceptWithDeadline(int listen_fd, const Deadline& deadline) {
  for (;;) {
    if (!waitReady(listen_fd, POLLIN, deadline)) return -1;
    int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd >= 0) {
      setDefaultLiveness(fd);
      return fd;
    }
    // The pending connection may have gone away between poll and accept.
    if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK ||
        errno == ECONNABORTED || errno == EPROTO)
      continue;
    fail(Code::kInternal, "accept failed: ", strerror(errno));
  }
}

int connectTo(const std::string& host, int port, const Deadline& deadline) {
  const std::string addr = joinHostPort(host, port);
  const Deadline start = Deadline::in(0);
  // A refused connection means the host is up but nothing listens yet: retry
  // until the deadline. No answer at all (SYN unanswered, host unreachable)
  // for 80% of TFRING_HEARTBEAT_TIMEOUT (the budget of setLiveness) means the
  // host is down or cut off: fail then rather than at the deadline.
  const double heartbeat = tunables::getDouble("TFRING_HEARTBEAT_TIMEOUT");
  const double silent_limit = heartbeat > 0 ? std::max(2.0, 0.8 * heartbeat) : 0;
  double silent_since = -1;  // when the current run of unanswered attempts began
  double backoff = 0.01;
  int last_err = 0;
  std::string last_what;
  for (;;) {
    AddrInfo ai;
    int gai = resolve(host, port, /*passive=*/false, &ai);
    if (gai != 0 && gai != EAI_AGAIN)
      fail(Code::kUnavailable, "could not connect to ", addr,
           ": cannot resolve the host: ", gai_strerror(gai));
    if (gai == EAI_AGAIN) last_what = gai_strerror(gai);
    for (struct addrinfo* a = ai.res; a; a = a->ai_next) {
      int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK,
                        a->ai_protocol);
      if (fd < 0) {
        last_err = errno;
        continue;
      }
      // Non-blocking connect so the attempt itself honours the deadline.
      const double attempt_start = nowSeconds();
      int rc;
      do {
        rc = ::connect(fd, a->ai_addr, a->ai_addrlen);
      } while (rc < 0 && errno == EINTR);
      int err = rc == 0 ? 0 : errno;
      if (err == EINPROGRESS) {
        Deadline attempt = deadline;
        if (silent_limit > 0) {
          double left = silent_limit - (silent_since < 0 ? 0 : nowSeconds() - silent_since);
          attempt = Deadline::in(std::max(0.0, std::min(deadline.remaining(), left)));
        }
        if (!waitReady(fd, POLLOUT, attempt)) {
          err = ETIMEDOUT;
        } else {
          socklen_t len = sizeof(err);
          if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
        }
      }
      if (err == 0) {
        setNonBlocking(fd, false);
        setNoDelay(fd);
        setDefaultLiveness(fd);
        return fd;
      }
      closeFd(fd);
      last_err = err;
      last_what = strerror(err);
      if (!retryableConnectError(err))
        fail(Code::kUnavailable, "could not connect to ", addr, ": ", last_what);
      if (!isSilentPeerError(err)) {
        silent_since = -1;
      } else {
        double now = nowSeconds();
        if (silent_since < 0) silent_since = attempt_start;
        if (silent_limit > 0 && now - silent_since >= silent_limit && !deadline.expired())
          fail(Code::kPeerFailure, "could not connect to ", addr, ": no answer for ",
               static_cast<int>(now - silent_since + 0.5), " s (", last_what,
               "): its host is down or unreachable (TFRING_HEARTBEAT_TIMEOUT)");
      }
    }
    if (deadline.expired()) break;
    // Back off (10 ms doubling to 500 ms) but never sleep past the deadline.
    double sleep_s = std::min(backoff, std::max(0.0, deadline.remaining()));
    std::this_thread::sleep_for(std::chrono::duration<double>(sleep_s));
    backoff = std::min(backoff * 2, 0.5);
    if (deadline.expired()) break;
  }
  char waited[32];
  std::snprintf(waited, sizeof(waited), "%.1f", -start.remaining());
  fail(Code::kTimeout, "could not connect to ", addr, " within ", waited, " s: ",
       last_what.empty() ? strerror(last_err ? last_err : ETIMEDOUT) : last_what);
}

// MSG_DONTWAIT makes each call non-blocking even on a blocking fd; poll()
// does the waiting, bounded by the deadline.
void sendAll(int fd, const void* data, size_t n, const Deadline& deadline,
             const std::string& peer) {
  const char* p = static_cast<const char*>(data);
  size_t done = 0;
  while (done < n) {
    ssize_t rc = ::send(fd, p + done, n - done, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (rc > 0) {
      done += static_cast<size_t>(rc);
      continue;
    }
    if (rc < 0 && errno == EINTR) continue;
    if (rc < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (!waitReady(fd, POLLOUT, deadline))
        fail(Code::kTimeout, "timed out sending ", n, " bytes to ", peer, " (",
             done, " sent)");
      continue;
    }
    int err = rc < 0 ? errno : EPIPE;
    if (isSilentPeerError(err))
      fail(Code::kPeerFailure, "lost the connection to ", peer, " while sending: ",
           strerror(err), " (its host stopped answering: down, or the network is cut)");
    if (err == EPIPE || err == ECONNRESET || err == ENOTCONN)
      fail(Code::kPeerFailure, "lost the connection to ", peer, " while sending: ",
           strerror(err), " (the peer may have exited)");
    fail(Code::kInternal, "send to ", peer, " failed: ", strerror(err));
  }
}

void recvAll(int fd, void* data, size_t n, const Deadline& deadline,
             const std::string& peer) {
  char* p = static_cast<char*>(data);
  size_t done = 0;
  while (done < n) {
    ssize_t rc = ::recv(fd, p + done, n - done, MSG_DONTWAIT);
    if (rc > 0) {
      done += static_cast<size_t>(rc);
      continue;
    }
    if (rc == 0)
      fail(Code::kPeerFailure, "the connection to ", peer,
           " was closed by the peer (it may have exited)");
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (!waitReady(fd, POLLIN, deadline))
        fail(Code::kTimeout, "timed out receiving ", n, " bytes from ", peer, " (",
             done, " received)");
      continue;
    }
    int err = errno;
    if (isSilentPeerError(err))
      fail(Code::kPeerFailure, "lost the connection to ", peer, " while receiving: ",
           strerror(err), " (its host stopped answering: down, or the network is cut)");
    if (err == ECONNRESET || err == ENOTCONN || err == EPIPE)
      fail(Code::kPeerFailure, "lost the connection to ", peer, " while receiving: ",
           strerror(err), " (the peer may have exited)");
    fail(Code::kInternal, "recv from ", peer, " failed: ", strerror(err));
  }
}

void setNonBlocking(int fd, bool on) {
  int flags = TFRING_SYSCHECK(::fcntl(fd, F_GETFL, 0), "fcntl(F_GETFL)");
  flags = on ? (flags | O_NONBLOCK) : (flags & ~O_NONBLOCK);
  TFRING_SYSCHECK(::fcntl(fd, F_SETFL, flags), "fcntl(F_SETFL)");
}

bool isSilentPeerError(int err) {
  return err == ETIMEDOUT || err == EHOSTUNREACH || err == ENETUNREACH;
}

void setLiveness(int fd, double timeout_s) {
  // Budget: 80% of the timeout, so that the error, and the aborts it
  // triggers on other ranks, land within the timeout. Probes: the first
  // after half the budget of silence, then 3 more spread over the rest.
  double budget = std::max(2.0, 0.8 * timeout_s);
  int idle = std::max(1, static_cast<int>(budget / 2));
  int cnt = 3;
  int intvl = std::max(1, static_cast<int>((budget - idle) / cnt));
  int on = 1;
  unsigned int user_ms = static_cast<unsigned int>(budget * 1000);
  if (::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof(on)) != 0) return;
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof(intvl));
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof(cnt));
  // Without it, data in flight to a vanished host is retransmitted for
  // ~15 minutes (tcp_retries2) and keepalive never starts.
  ::setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_ms, sizeof(user_ms));
}

void setDefaultLiveness(int fd) {
  const double timeout_s = tunables::getDouble("TFRING_HEARTBEAT_TIMEOUT");
  if (timeout_s > 0) setLiveness(fd, timeout_s);
}

void setNoDelay(int fd) {
  int one = 1;
  // Fails harmlessly on non-TCP sockets (e.g. unix sockets in tests).
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

void setBufferSizes(int fd, int bytes) {
  if (bytes <= 0) return;
  ::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof(bytes));
  ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &bytes, sizeof(bytes));
}

void closeFd(int fd) {
  // Never retry close() on EINTR: on Linux the fd is released either way.
  if (fd >= 0) ::close(fd);
}

void raiseFdLimit(long wanted) {
  struct rlimit lim;
  if (::getrlimit(RLIMIT_NOFILE, &lim) != 0 || lim.rlim_cur == RLIM_INFINITY) return;
  if (static_cast<rlim_t>(wanted) <= lim.rlim_cur) return;
  rlim_t want = static_cast<rlim_t>(wanted);
  if (lim.rlim_max != RLIM_INFINITY) want = std::min(want, lim.rlim_max);
  if (want > lim.rlim_cur) {
    lim.rlim_cur = want;
    ::setrlimit(RLIMIT_NOFILE, &lim);
  }
}

std::string ifaceAddress() {
  std::string forced = tunables::getString("TFRING_IFACE_ADDR");
  if (!forced.empty()) return forced;
  std::string name = tunables::getString("TFRING_IFACE");
  if (name.empty()) return "";
  struct ifaddrs* ifs = nullptr;
  std::string found;
  if (getifaddrs(&ifs) == 0) {
    for (struct ifaddrs* i = ifs; i && found.empty(); i = i->ifa_next) {
      if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET || name != i->ifa_name) continue;
      char buf[INET_ADDRSTRLEN];
      auto* sin = reinterpret_cast<sockaddr_in*>(i->ifa_addr);
      if (inet_ntop(AF_INET, &sin->sin_addr, buf, sizeof(buf))) found = buf;
    }
    freeifaddrs(ifs);
  }
  if (found.empty())
    fail(Code::kInvalidArgument, "TFRING_IFACE=", name,
         ": no such network interface with an IPv4 address on this host");
  return found;
}

bool singleHostJob() {
  // tfring-run's variables, then Open MPI's (not ours: read as they are).
  const int64_t local = tunables::getInt("TFRING_LOCAL_SIZE");
  const int64_t world = tunables::getInt("TFRING_SIZE");
  if (local > 0 && world > 0) return local == world;
  auto ompi = [](const char* name) {
    const std::string v = tunables::foreignEnv(name);
    char* end = nullptr;
    long long r = std::strtoll(v.c_str(), &end, 10);
    return v.empty() || *end != '\0' ? -1ll : r;
  };
  const long long ompi_local = ompi("OMPI_COMM_WORLD_LOCAL_SIZE");
  const long long ompi_world = ompi("OMPI_COMM_WORLD_SIZE");
  if (ompi_local > 0 && ompi_world > 0) return ompi_local == ompi_world;
  return false;
}

std::string localAddress(const std::string& towards) {
  std::string forced = ifaceAddress();
  if (!forced.empty()) return forced;
  if (singleHostJob()) return "127.0.0.1";

  if (!towards.empty()) {
    // A connected UDP socket sends nothing but makes the kernel pick the
    // source address of the route towards the peer.
    struct addrinfo hints;
    std::memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_DGRAM;
    struct addrinfo* res = nullptr;
    if (getaddrinfo(towards.c_str(), "9", &hints, &res) == 0 && res) {
      int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
      std::string found;
      if (fd >= 0 && ::connect(fd, res->ai_addr, res->ai_addrlen) == 0) {
        struct sockaddr_in sin;
        socklen_t len = sizeof(sin);
        char buf[INET_ADDRSTRLEN];
        if (::getsockname(fd, reinterpret_cast<sockaddr*>(&sin), &len) == 0 &&
            inet_ntop(AF_INET, &sin.sin_addr, buf, sizeof(buf)) && sin.sin_addr.s_addr != 0)
          found = buf;
      }
      closeFd(fd);
      freeaddrinfo(res);
      if (!found.empty()) return found;
    }
  }

  struct ifaddrs* ifs = nullptr;
  std::string found;
  if (getifaddrs(&ifs) == 0) {
    for (struct ifaddrs* i = ifs; i && found.empty(); i = i->ifa_next) {
      if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET) continue;
      if ((i->ifa_flags & IFF_UP) == 0 || (i->ifa_flags & IFF_LOOPBACK) != 0) continue;
      char buf[INET_ADDRSTRLEN];
      auto* sin = reinterpret_cast<sockaddr_in*>(i->ifa_addr);
      if (inet_ntop(AF_INET, &sin->sin_addr, buf, sizeof(buf))) found = buf;
    }
    freeifaddrs(ifs);
  }
  return found.empty() ? "127.0.0.1" : found;
}

std::string hostIdentity() {
  std::string forced = tunables::getString("TFRING_HOSTNAME");
  if (!forced.empty()) return forced;
  char host[256] = {0};
  if (::gethostname(host, sizeof(host) - 1) != 0) std::strcpy(host, "unknown-host");
  std::string id = host;
  // Containers may share a hostname across machines; the boot id tells
  // hosts apart (and is shared by containers on the same kernel).
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  std::string boot;
  if (f && std::getline(f, boot)) {
    while (!boot.empty() && std::isspace(static_cast<unsigned char>(boot.back())))
      boot.pop_back();
    if (!boot.empty()) id += "/" + boot;
  }
  return id;
}

bool secretsEqual(const std::string& a, const std::string& b) {
  // Touch every byte of the longer string so timing reveals only lengths.
  size_t n = std::max(a.size(), b.size());
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < n; ++i) {
    unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= static_cast<unsigned char>(x ^ y);
  }
  return diff == 0;
}

int connectInSlices(const std::string& host, int port, const Deadline& deadline,
                    const std::function<void()>& between) {
  for (;;) {
    between();
    try {
      return connectTo(host, port, Deadline::in(std::min(1.0, std::max(0.0, deadline.remaining()))));
    } catch (const Error& e) {
      if (e.status().code() != Code::kTimeout || deadline.expired()) throw;
    }
  }
}

}  // namespace net
}  // namespace tfring
