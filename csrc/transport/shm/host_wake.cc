#include "transport/shm/host_wake.h"

#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>

#include "common/status.h"

namespace tfring {
namespace transport {

namespace {

socklen_t abstractAddress(const std::string& name, struct sockaddr_un* a) {
  memset(a, 0, sizeof(*a));
  a->sun_family = AF_UNIX;
  // sun_path[0] == 0: the abstract namespace.
  const size_t n = std::min(name.size(), sizeof(a->sun_path) - 2);
  memcpy(a->sun_path + 1, name.data(), n);
  return static_cast<socklen_t>(offsetof(struct sockaddr_un, sun_path) + 1 + n);
}

int datagramSocket() {
  int fd = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) fail(Code::kUnavailable, "socket(AF_UNIX) for the host's wake-ups: ", strerror(errno));
  return fd;
}

}  // namespace

std::unique_ptr<HostWake> HostWake::bind(const std::string& name) {
  std::unique_ptr<HostWake> w(new HostWake());
  w->fd_ = datagramSocket();
  struct sockaddr_un a;
  const socklen_t len = abstractAddress(name, &a);
  if (::bind(w->fd_, reinterpret_cast<struct sockaddr*>(&a), len) != 0)
    fail(Code::kUnavailable, "could not bind the host's wake-up socket @", name, ": ",
         strerror(errno));
  return w;
}

std::unique_ptr<HostWake> HostWake::connect(const std::string& name) {
  std::unique_ptr<HostWake> w(new HostWake());
  w->fd_ = datagramSocket();
  struct sockaddr_un a;
  const socklen_t len = abstractAddress(name, &a);
  if (::connect(w->fd_, reinterpret_cast<struct sockaddr*>(&a), len) != 0)
    fail(Code::kUnavailable, "could not reach local rank 0's wake-up socket @", name, ": ",
         strerror(errno), " (local ranks must share a network namespace)");
  return w;
}

HostWake::~HostWake() {
  if (fd_ >= 0) ::close(fd_);
}

void HostWake::ring() {
  const char b = 1;
  ssize_t rc = ::send(fd_, &b, 1, MSG_DONTWAIT | MSG_NOSIGNAL);
  (void)rc;  // EAGAIN: wake-ups are already queued; ECONNREFUSED: rank 0 is gone
}

void HostWake::drain() {
  char buf[64];
  while (::recv(fd_, buf, sizeof(buf), MSG_DONTWAIT) > 0) {
  }
}

}  // namespace transport
}  // namespace tfring
