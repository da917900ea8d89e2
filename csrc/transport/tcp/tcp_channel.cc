#include "transport/tcp/tcp_channel.h"

#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/net.h"
#include "common/status.h"

namespace tfring {
namespace transport {

namespace {

// A socket error on a data link: the peer rank exited (reset), or its host
// stopped answering for TFRING_HEARTBEAT_TIMEOUT (keepalive/user timeout).
// peer_rank: the suspect (a place in the ring); label: its name in messages.
[[noreturn]] void lostLink(int err, const char* when, int peer_rank, int label,
                           const std::string& addr) {
  if (net::isSilentPeerError(err))
    failPeer(peer_rank, addr, "lost the connection to rank ", label, " at ", addr, " ",
             when, ": ", strerror(err),
         " (its host stopped answering for TFRING_HEARTBEAT_TIMEOUT: down, or the network is cut)");
  failPeer(peer_rank, addr, "lost the connection to rank ", label, " at ", addr, " ", when,
           ": ", strerror(err), " (the rank exited or its host failed)");
}

}  // namespace

TcpSendChannel::TcpSendChannel(int fd, int peer_rank, std::string peer_addr, int peer_label)
    : fd_(fd),
      peer_rank_(peer_rank),
      peer_label_(peer_label >= 0 ? peer_label : peer_rank),
      peer_addr_(std::move(peer_addr)) {
  net::setNonBlocking(fd_, true);
  net::setDefaultLiveness(fd_);  // also when the fd did not come from connectTo
}

TcpSendChannel::~TcpSendChannel() { net::closeFd(fd_); }

size_t TcpSendChannel::trySend(const void* data, size_t n) {
  if (n == 0) return 0;
  for (;;) {
    ssize_t r = ::send(fd_, data, n, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (r >= 0) return static_cast<size_t>(r);
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
    lostLink(errno, "while sending", peer_rank_, peer_label_, peer_addr_);
  }
}

std::string TcpSendChannel::describe() const {
  return strCat("rank ", peer_label_, " (tcp ", peer_addr_, ")");
}

TcpRecvChannel::TcpRecvChannel(int fd, int peer_rank, std::string peer_addr,
                               size_t staging_bytes, int peer_label)
    : fd_(fd),
      peer_rank_(peer_rank),
      peer_label_(peer_label >= 0 ? peer_label : peer_rank),
      peer_addr_(std::move(peer_addr)),
      buf_(new char[std::max<size_t>(staging_bytes, 4096)]),
      cap_(std::max<size_t>(staging_bytes, 4096)) {
  net::setNonBlocking(fd_, true);
  net::setDefaultLiveness(fd_);
}

TcpRecvChannel::~TcpRecvChannel() { net::closeFd(fd_); }

size_t TcpRecvChannel::readSome(void* dst, size_t n) {
  if (n == 0) return 0;
  for (;;) {
    ssize_t r = ::recv(fd_, dst, n, MSG_DONTWAIT);
    if (r > 0) return static_cast<size_t>(r);
    if (r == 0)
      failPeer(peer_rank_, peer_addr_, "rank ", peer_label_, " at ", peer_addr_,
               " closed its connection (it exited or failed)");
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
    lostLink(errno, "while receiving", peer_rank_, peer_label_, peer_addr_);
  }
}

size_t TcpRecvChannel::tryRecv(void* data, size_t n) {
  char* out = static_cast<char*>(data);
  size_t staged = std::min(n, end_ - begin_);
  if (staged) {
    std::memcpy(out, buf_.get() + begin_, staged);
    begin_ += staged;
    if (begin_ == end_) begin_ = end_ = 0;
    if (staged == n) return n;
  }
  return staged + readSome(out + staged, n - staged);
}

size_t TcpRecvChannel::peek(const void** data, size_t max) {
  size_t have = end_ - begin_;
  if (have < max) {
    // Compact so a partial element at the end can be completed in place.
    if (begin_ > 0 && (cap_ - end_) < std::min(max, cap_ / 2)) {
      std::memmove(buf_.get(), buf_.get() + begin_, have);
      begin_ = 0;
      end_ = have;
    }
    end_ += readSome(buf_.get() + end_, cap_ - end_);
    have = end_ - begin_;
  }
  *data = buf_.get() + begin_;
  return std::min(have, max);
}

void TcpRecvChannel::consume(size_t n) {
  begin_ += n;
  if (begin_ == end_) begin_ = end_ = 0;
}

std::string TcpRecvChannel::describe() const {
  return strCat("rank ", peer_label_, " (tcp ", peer_addr_, ")");
}

}  // namespace transport
}  // namespace tfring
