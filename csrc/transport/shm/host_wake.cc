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

}  // namespace

// Local rank 0 (`owner`) binds the abstract name; the others connect to it.
std::unique_ptr<HostWake> HostWake::open(const std::string& name, bool owner) {
  std::unique_ptr<HostWake> w(new HostWake());
  w->fd_ = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (w->fd_ < 0)
    fail(Code::kUnavailable, "socket(AF_UNIX) for the host's wake-ups: ", strerror(errno));
  struct sockaddr_un a;
  const socklen_t len = abstractAddress(name, &a);
  const struct sockaddr* sa = reinterpret_cast<struct sockaddr*>(&a);
  const int rc = owner ? ::bind(w->fd_, sa, len) : ::connect(w->fd_, sa, len);
  if (rc != 0 && owner)
    fail(Code::kUnavailable, "could not bind the host's wake-up socket @", name, ": ",
         strerror(errno));
  if (rc != 0)
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
