// TCP channels between ranks on different hosts (or anywhere with
// TFRING_TRANSPORT=tcp). Each ring edge is one connection, opened by the
// sender to its right neighbour's listener and authenticated with the job
// secret (see transport/ring_links.cc). Sockets are non-blocking; the
// receiver keeps a staging buffer so reductions can read whole elements in
// place, while plain copies go straight into the destination.
#pragma once

#include <memory>
#include <string>

#include "transport/channel.h"

namespace tfring {
namespace transport {

class TcpSendChannel : public SendChannel {
 public:
  // peer_label: how messages name the peer (its global rank; -1: peer_rank).
  TcpSendChannel(int fd, int peer_rank, std::string peer_addr, int peer_label = -1);
  ~TcpSendChannel() override;
  size_t trySend(const void* data, size_t n) override;
  void align() override {}
  int pollFd() const override { return fd_; }
  std::string describe() const override;

 private:
  int fd_;
  int peer_rank_;
  int peer_label_;
  std::string peer_addr_;
};

class TcpRecvChannel : public RecvChannel {
 public:
  TcpRecvChannel(int fd, int peer_rank, std::string peer_addr, size_t staging_bytes,
                 int peer_label = -1);
  ~TcpRecvChannel() override;
  size_t tryRecv(void* data, size_t n) override;
  size_t peek(const void** data, size_t max) override;
  void consume(size_t n) override;
  void align() override {}
  int pollFd() const override { return fd_; }
  std::string describe() const override;

 private:
  // Reads what the socket has, up to n bytes, into dst; 0 if nothing yet.
  size_t readSome(void* dst, size_t n);
  int fd_;
  int peer_rank_;
  int peer_label_;
  std::string peer_addr_;
  // Left uninitialised: a large staging buffer's pages are faulted in as
  // data first reaches them, not zeroed for every link at start-up.
  std::unique_ptr<char[]> buf_;
  size_t cap_;
  size_t begin_ = 0, end_ = 0;  // staged bytes are buf_[begin_, end_)
};

}  // namespace transport
}  // namespace tfring
