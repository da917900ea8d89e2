// The store's request and reply encoding, shared by the client (tcp_store.cc)
// and the server (tcp_store_server.cc); the wire format is documented in
// tcp_store.cc.
#pragma once

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/wire.h"
#include "rendezvous/store.h"

namespace tfring {
namespace rendezvous {
namespace storewire {

enum Op : uint8_t { kSet = 2, kGet = 3, kAdd = 4, kWait = 5, kCheck = 6, kGetMany = 7 };
enum Reply : uint8_t { kOk = 0, kTimedOut = 1, kFailed = 2 };

constexpr uint32_t kMaxFrame = 256u << 20;
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

inline int64_t toMicros(double s) {
  if (!(s > 0)) return 0;
  return s > kForever ? static_cast<int64_t>(kForever * 1e6) : static_cast<int64_t>(s * 1e6);
}

// Counters are decimal text. Returns false if `v` is not an integer.
inline bool parseCounter(const Bytes& v, int64_t* out) {
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

inline Request parseRequest(const Bytes& frame, const std::string& peer) {
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

}  // namespace storewire
}  // namespace rendezvous
}  // namespace tfring
