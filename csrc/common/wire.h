// A little-endian byte serializer for control messages (handshakes,
// negotiation), and length-prefixed frames over a socket with a deadline.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/status.h"

namespace tfring {
namespace wire {

class Writer {
 public:
  template <typename T>
  void put(T v) {
    static_assert(std::is_trivially_copyable<T>::value, "POD only");
    size_t o = buf_.size();
    buf_.resize(o + sizeof(T));
    std::memcpy(buf_.data() + o, &v, sizeof(T));
  }
  void putStr(const std::string& s) {
    put<uint32_t>(static_cast<uint32_t>(s.size()));
    buf_.insert(buf_.end(), s.begin(), s.end());
  }
  void putI64s(const std::vector<int64_t>& v) {
    put<uint32_t>(static_cast<uint32_t>(v.size()));
    for (auto x : v) put<int64_t>(x);
  }
  std::vector<uint8_t>& bytes() { return buf_; }

 private:
  std::vector<uint8_t> buf_;
};

class Reader {
 public:
  Reader(const uint8_t* p, size_t n) : p_(p), n_(n) {}
  explicit Reader(const std::vector<uint8_t>& v) : p_(v.data()), n_(v.size()) {}
  template <typename T>
  T get() {
    need(sizeof(T));
    T v;
    std::memcpy(&v, p_ + o_, sizeof(T));
    o_ += sizeof(T);
    return v;
  }
  std::string getStr() {
    uint32_t n = get<uint32_t>();
    need(n);
    std::string s(reinterpret_cast<const char*>(p_ + o_), n);
    o_ += n;
    return s;
  }
  std::vector<int64_t> getI64s() {
    uint32_t n = get<uint32_t>();
    std::vector<int64_t> v(n);
    for (auto& x : v) x = get<int64_t>();
    return v;
  }
  bool done() const { return o_ == n_; }

 private:
  void need(size_t k) {
    if (o_ + k > n_) fail(Code::kInternal, "malformed control message (", n_, " bytes)");
  }
  const uint8_t* p_;
  size_t n_;
  size_t o_ = 0;
};

// Frames: u32 length, then the payload.
void sendFrame(int fd, const std::vector<uint8_t>& payload, const Deadline& deadline,
               const std::string& peer);
std::vector<uint8_t> recvFrame(int fd, const Deadline& deadline, const std::string& peer);

// Connection handshake shared by every tfring TCP link: the connecting side
// sends {magic, purpose, rank, secret}; the accepting side checks the secret
// in constant time and answers one byte (1 accepted, 0 rejected).
void sendHello(int fd, uint32_t purpose, int rank, const std::string& secret,
               const Deadline& deadline, const std::string& peer);
// Returns the peer's rank, or -1 if the hello was invalid (and answers 0).
int acceptHello(int fd, uint32_t purpose, const std::string& secret,
                const Deadline& deadline);
void expectHelloAck(int fd, const Deadline& deadline, const std::string& peer);

}  // namespace wire
}  // namespace tfring
