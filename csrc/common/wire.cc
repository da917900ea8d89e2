#include "common/wire.h"

#include "common/net.h"

namespace tfring {
namespace wire {

namespace {
constexpr uint32_t kHelloMagic = 0x54465247;  // "TFRG"
constexpr uint32_t kMaxFrame = 1u << 30;
}

void sendFrame(int fd, const std::vector<uint8_t>& payload, const Deadline& deadline,
               const std::string& peer) {
  std::vector<uint8_t> buf(4 + payload.size());
  uint32_t n = static_cast<uint32_t>(payload.size());
  std::memcpy(buf.data(), &n, 4);
  if (!payload.empty()) std::memcpy(buf.data() + 4, payload.data(), payload.size());
  net::sendAll(fd, buf.data(), buf.size(), deadline, peer);
}

std::vector<uint8_t> recvFrame(int fd, const Deadline& deadline, const std::string& peer) {
  uint32_t n = 0;
  net::recvAll(fd, &n, 4, deadline, peer);
  if (n > kMaxFrame) fail(Code::kInternal, "oversized control frame from ", peer);
  std::vector<uint8_t> buf(n);
  if (n) net::recvAll(fd, buf.data(), n, deadline, peer);
  return buf;
}

void sendHello(int fd, uint32_t purpose, int rank, const std::string& secret,
               const Deadline& deadline, const std::string& peer) {
  Writer w;
  w.put<uint32_t>(kHelloMagic);
  w.put<uint32_t>(purpose);
  w.put<int32_t>(rank);
  w.putStr(secret);
  sendFrame(fd, w.bytes(), deadline, peer);
}

int acceptHello(int fd, uint32_t purpose, const std::string& secret,
                const Deadline& deadline) {
  int rank = -1;
  try {
    auto buf = recvFrame(fd, deadline, "a connecting process");
    Reader r(buf);
    bool ok = r.get<uint32_t>() == kHelloMagic;
    ok = r.get<uint32_t>() == purpose && ok;
    int32_t peer_rank = r.get<int32_t>();
    std::string s = r.getStr();
    if (ok && net::secretsEqual(s, secret)) rank = peer_rank;
  } catch (const Error&) {
    rank = -1;
  }
  uint8_t ack = rank >= 0 ? 1 : 0;
  try {
    net::sendAll(fd, &ack, 1, deadline, "a connecting process");
  } catch (const Error&) {
    return -1;
  }
  return rank;
}

void expectHelloAck(int fd, const Deadline& deadline, const std::string& peer) {
  uint8_t ack = 0;
  net::recvAll(fd, &ack, 1, deadline, peer);
  if (ack != 1)
    fail(Code::kInvalidArgument, peer, " rejected this process: wrong job secret or purpose");
}

}  // namespace wire
}  // namespace tfring
