// A little-endian byte serializer for control messages (handshakes,
// negotiation), and length-prefixed frames over a socket with a deadline.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstring>
#include <exception>
#include <string>
#include <thread>
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
    uint32_t n = getCount(sizeof(int64_t));
    std::vector<int64_t> v(n);
    for (auto& x : v) x = get<int64_t>();
    return v;
  }
  // An element count read from the message, checked against the bytes left
  // (each element takes at least min_elem_bytes) so a hostile count cannot
  // make the reader allocate before the data is seen to be there.
  uint32_t getCount(size_t min_elem_bytes) {
    uint32_t n = get<uint32_t>();
    if (min_elem_bytes && n > (n_ - o_) / min_elem_bytes)
      fail(Code::kInternal, "malformed control message (count ", n, " exceeds its ", n_,
           " bytes)");
    return n;
  }
  bool done() const { return o_ == n_; }

 private:
  void need(size_t k) {
    if (k > n_ - o_) fail(Code::kInternal, "malformed control message (", n_, " bytes)");
  }
  const uint8_t* p_;
  size_t n_;
  size_t o_ = 0;
};

// Frames: u32 length, then the payload. recvFrame refuses a length over
// max_len before allocating, and once the length has arrived the body must
// follow within kFrameBodyTimeout (or the deadline, if sooner): a peer that
// sends half a frame cannot hold the reader forever.
constexpr uint32_t kMaxFrame = 1u << 30;
constexpr double kFrameBodyTimeout = 60.0;
void sendFrame(int fd, const std::vector<uint8_t>& payload, const Deadline& deadline,
               const std::string& peer);
std::vector<uint8_t> recvFrame(int fd, const Deadline& deadline, const std::string& peer,
                               uint32_t max_len = kMaxFrame);

// ---- Connection handshake (every tfring TCP connection: store, control,
// ring data links). Mutual HMAC-SHA256 challenge-response: each side proves
// it knows the job secret against a fresh nonce of the other side, so the
// secret never travels and a recorded handshake cannot be replayed.
//
//   1 C->S  u32 magic "TFRG", u8 version, u32 purpose, i32 rank, nonce_c[32]
//   2 S->C  u32 magic, u8 version, u8 status (0 go on, 1 version, 2 purpose),
//           nonce_s[32]
//   3 C->S  mac_c = HMAC(secret, "tfring client" | transcript)
//   4 S->C  u8 accepted; if accepted, mac_s = HMAC(secret, "tfring server" | transcript)
//
// transcript := nonce_s | nonce_c | u32 purpose | i32 rank | u8 version.
// The server answers 4 only after checking 3 (constant-time compare), so it
// is no oracle for a stranger; the labels keep one side's proof from being
// reflected as the other's. Every message is a frame of at most
// kMaxHelloFrame bytes. A version mismatch is reported as such on both
// sides; the server gives a silent client helloTimeout() seconds.
// Builds before the challenge-response sent the same magic followed by a
// u32 purpose of 1 or 2, which this format reads as versions 1 and 2.
constexpr uint32_t kHelloMagic = 0x54465247;
// 4: a tensor's Meta carries the rank's own verdict on it (Meta::error) and
// a response group may be kInvalid.
constexpr uint8_t kProtocolVersion = 4;
constexpr uint32_t kMaxHelloFrame = 256;
constexpr size_t kNonceBytes = 32;

// Seconds a peer has to complete the handshake (and, in the store, to send a
// request's body once its length is in, and to take a reply):
// TFRING_HANDSHAKE_TIMEOUT, default 10. Throws InvalidArgument naming the
// variable and its value when that is malformed or not positive (tunables.h).
// Read where a server or client is made, or once per accepted connection.
double helloTimeout();

// Purposes: a connection opened for one cannot be accepted as another.
constexpr uint32_t kPurposeRing = 1;
constexpr uint32_t kPurposeControl = 2;
constexpr uint32_t kPurposeStore = 3;
constexpr uint32_t kPurposeCross = 4;  // the cross-host ring of hierarchical allreduce
constexpr uint32_t kPurposePeer = 5;   // point-to-point links of the recursive allreduces

struct ClientHello {
  uint8_t version = 0;
  uint32_t purpose = 0;
  int32_t rank = -1;
  std::string nonce;
};
// Parses message 1; throws kMismatch naming the versions on a version
// mismatch and kInternal on anything malformed. Exposed for the fuzz tests.
ClientHello parseClientHello(const std::vector<uint8_t>& msg);

// The connecting side, run to completion. Throws naming `peer` when the
// server rejects the secret, cannot prove it knows it, or speaks another
// protocol version.
void clientHandshake(int fd, uint32_t purpose, int rank, const std::string& secret,
                     const Deadline& deadline, const std::string& peer);

// clientHandshake on a thread, for a process that must accept connections
// (possibly its own) while its outgoing one is authenticated. finish()
// waits for it and rethrows its error; the destructor waits too.
class HelloClient {
 public:
  HelloClient(int fd, uint32_t purpose, int rank, const std::string& secret,
              const Deadline& deadline, const std::string& peer);
  ~HelloClient();
  void finish();
  // True once the handshake has failed: a caller waiting for other
  // connections meanwhile should stop and finish() to report why.
  bool failed() const { return failed_.load(); }

 private:
  std::thread thread_;
  std::exception_ptr error_;
  std::atomic<bool> failed_{false};
};

// The accepting side as two steps over messages the caller moves, for a
// server that serves many connections from one thread (the store);
// acceptHello runs the same steps on a blocking socket.
class HelloAcceptor {
 public:
  // `who` names the connecting peer in every refusal.
  HelloAcceptor(uint32_t purpose, std::string secret, std::string who);
  // Message 1 in, message 2 out. Throws (kInternal and the like) when m1 is
  // no tfring handshake at all: then nothing is answered. When refused()
  // afterwards (another version or purpose), the exchange ends once m2 is
  // sent and refusal() says why.
  std::vector<uint8_t> answerHello(const std::vector<uint8_t>& m1);
  // Message 3 in, message 4 out. Throws kInternal on a malformed proof; when
  // !accepted() afterwards, the connection ends once m4 is sent and
  // refusal() says why.
  std::vector<uint8_t> answerProof(const std::vector<uint8_t>& m3);
  bool refused() const { return !refusal_.empty(); }
  bool accepted() const { return accepted_; }
  const std::string& refusal() const { return refusal_; }
  int rank() const { return hello_.rank; }

 private:
  uint32_t purpose_;
  std::string secret_;
  std::string who_;
  ClientHello hello_;
  std::string nonce_s_;
  std::string refusal_;
  bool accepted_ = false;
};

// The accepting side. Returns true with the peer's rank (-1 for store
// clients) when it proved the secret; false with `why` (naming the peer's
// address) otherwise. Never waits past the deadline nor helloTimeout() (a
// bad TFRING_HANDSHAKE_TIMEOUT is thrown, not returned as `why`).
bool acceptHello(int fd, uint32_t purpose, const std::string& secret,
                 const Deadline& deadline, int* rank, std::string* why);

// "ip:port" of a connected socket's peer, or "an unknown address".
std::string peerAddress(int fd);

}  // namespace wire
}  // namespace tfring
