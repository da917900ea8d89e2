// Wire format (all integers little-endian):
//
//   frame    := u32 length, then `length` payload bytes
//   request  := u8 op, then the op's fields
//   string   := u32 length, then bytes (keys, values and the secret alike)
//
//   SET    string key, string value     -> u8 OK
//   GET    string key, i64 timeout_us   -> u8 OK, string value | u8 TIMEOUT
//   ADD    string key, i64 delta        -> u8 OK, i64 new value | u8 ERROR, string why
//   WAIT   u32 n, n strings, i64 timeout_us
//                                       -> u8 OK | u8 TIMEOUT, u32 n, n missing keys
//   CHECK  u32 n, n strings             -> u8 OK, u8 all_present
//   GETN   u32 n, n strings, i64 timeout_us
//                                       -> u8 OK, u32 n, n values | u8 TIMEOUT, u32 n,
//                                          n missing keys
//
// Every connection opens with the mutual HMAC handshake of common/wire.h
// (purpose kPurposeStore): the secret itself never travels, and nothing is
// answered to a peer that has not proved it knows it. Handshake frames are
// capped at 256 bytes, requests at kMaxFrame (checked before allocating), and
// a request's body must arrive within the handshake timeout
// (TFRING_HANDSHAKE_TIMEOUT, default 10 s: wire::helloTimeout()) of its
// length; a
// malformed request (unknown op, truncated or trailing bytes, counts larger
// than the frame) closes that one connection only.
// GET, WAIT and GETN are answered once the keys exist or the timeout the
// client sent passes (the server parks the connection meanwhile, without a
// thread of its own: tcp_store_server.cc); on the timeout it answers TIMEOUT
// and the client raises the error, so both sides agree about what timed out. Counters (ADD) are
// stored as decimal text, so get() on a counter returns e.g. b"3".
#include "rendezvous/tcp_store.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "common/logging.h"
#include "common/net.h"
#include "common/status.h"
#include "common/wire.h"
#include "rendezvous/store_codec.h"

namespace tfring {
namespace rendezvous {
using namespace storewire;  // NOLINT: the codec is this file's vocabulary

namespace {

void sendFrame(int fd, const Bytes& payload, const Deadline& d, const std::string& peer) {
  Bytes frame = Writer().u32(static_cast<uint32_t>(payload.size())).take();
  frame.insert(frame.end(), payload.begin(), payload.end());
  net::sendAll(fd, frame.data(), frame.size(), d, peer);
}

// Waits for a frame header until `header_deadline` (which may be far away:
// idle clients), then reads the body within `body_timeout_s`.
Bytes recvFrame(int fd, const Deadline& header_deadline, double body_timeout_s,
                uint32_t max_len, const std::string& peer) {
  uint8_t hdr[4];
  net::recvAll(fd, hdr, 4, header_deadline, peer);
  uint32_t n = hdr[0] | (hdr[1] << 8) | (hdr[2] << 16) | (static_cast<uint32_t>(hdr[3]) << 24);
  if (n > max_len)
    fail(Code::kInternal, "store frame of ", n, " bytes from ", peer, " exceeds the ",
         max_len, "-byte limit");
  Bytes body(n);
  net::recvAll(fd, body.data(), n, Deadline::in(body_timeout_s), peer);
  return body;
}

}  // namespace

void checkStoreRequest(const Bytes& frame) { parseRequest(frame, "the caller"); }

TcpStore::TcpStore(const std::string& host, int port, std::string secret,
                   double connect_timeout_s)
    : host_(host),
      port_(port),
      secret_(std::move(secret)),
      addr_(host.find(':') != std::string::npos ? "[" + host + "]:" + std::to_string(port)
                                                : host + ":" + std::to_string(port)),
      connect_timeout_s_(connect_timeout_s),
      hello_timeout_s_(wire::helloTimeout()),
      io_timeout_s_(std::max(connect_timeout_s, 30.0)) {
  idle_fds_.push_back(openConnection(connect_timeout_s));
}

TcpStore::~TcpStore() {
  for (int fd : idle_fds_) net::closeFd(fd);
}

int TcpStore::openConnection(double timeout_s) {
  const std::string who = "the tfring store at " + addr_;
  int fd;
  try {
    fd = net::connectTo(host_, port_, Deadline::in(timeout_s));
  } catch (const Error& e) {
    // net says "could not connect to <addr> within T s: <reason>"; keep the
    // detail and say what <addr> is.
    std::string detail = e.what();
    const std::string prefix = "could not connect to " + addr_;
    if (detail.compare(0, prefix.size(), prefix) == 0) {
      detail = detail.substr(prefix.size());
    } else {
      detail = ": " + detail;
    }
    fail(e.status().code(), "could not connect to the tfring store at ", addr_, detail,
         " (is rank 0 running?)");
  }
  try {
    wire::clientHandshake(fd, wire::kPurposeStore, -1, secret_,
                          Deadline::in(std::max(timeout_s, hello_timeout_s_)), who);
  } catch (...) {
    net::closeFd(fd);
    throw;
  }
  return fd;
}

Bytes TcpStore::roundTrip(const Bytes& request, double wait_s) {
  const std::string who = "the tfring store at " + addr_;
  int fd = -1;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!broken_.empty())
      fail(Code::kPeerFailure, "the connection to ", who, " was lost earlier (", broken_,
           "); the job cannot continue without its store");
    if (!idle_fds_.empty()) {
      fd = idle_fds_.back();
      idle_fds_.pop_back();
    }
  }
  if (fd < 0) fd = openConnection(connect_timeout_s_);
  Bytes reply;
  try {
    sendFrame(fd, request, Deadline::in(io_timeout_s_), who);
    reply = recvFrame(fd, Deadline::in(std::max(wait_s, 0.0) + io_timeout_s_),
                      io_timeout_s_, kMaxFrame, who);
  } catch (const Error& e) {
    // A half-finished exchange leaves the stream out of sync: drop it. A lost
    // server (its keys are gone with it) fails every later call as well.
    net::closeFd(fd);
    if (e.status().code() == Code::kPeerFailure) {
      std::lock_guard<std::mutex> lock(mu_);
      broken_ = e.what();
    }
    throw;
  }
  std::lock_guard<std::mutex> lock(mu_);
  idle_fds_.push_back(fd);
  return reply;
}

void TcpStore::set(const std::string& key, const Bytes& value) {
  roundTrip(Writer().u8(kSet).str(key).bytes(value).take(), 0);
}

Bytes TcpStore::get(const std::string& key, double timeout_s) {
  Bytes ans = roundTrip(Writer().u8(kGet).str(key).i64(toMicros(timeout_s)).take(), timeout_s);
  Reader r(ans, addr_);
  if (r.u8() != kOk)
    fail(Code::kTimeout, "timed out after ", fmtSeconds(timeout_s),
         " s waiting for store key [", key, "] at ", addr_);
  return r.bytes();
}

int64_t TcpStore::add(const std::string& key, int64_t delta) {
  Bytes ans = roundTrip(Writer().u8(kAdd).str(key).i64(delta).take(), 0);
  Reader r(ans, addr_);
  if (r.u8() != kOk)
    fail(Code::kInvalidArgument, "cannot add to store key [", key, "] at ", addr_, ": ",
         r.str());
  return r.i64();
}

void TcpStore::wait(const std::vector<std::string>& keys, double timeout_s) {
  Bytes ans = roundTrip(Writer().u8(kWait).strs(keys).i64(toMicros(timeout_s)).take(),
                        timeout_s);
  Reader r(ans, addr_);
  if (r.u8() != kOk)
    fail(Code::kTimeout, "timed out after ", fmtSeconds(timeout_s),
         " s waiting for store keys ", keyList(r.strs()), " at ", addr_);
}

std::vector<Bytes> TcpStore::getMany(const std::vector<std::string>& keys, double timeout_s) {
  Bytes ans = roundTrip(Writer().u8(kGetMany).strs(keys).i64(toMicros(timeout_s)).take(),
                        timeout_s);
  Reader r(ans, addr_);
  if (r.u8() != kOk)
    fail(Code::kTimeout, "timed out after ", fmtSeconds(timeout_s),
         " s waiting for store keys ", keyList(r.strs()), " at ", addr_);
  const uint32_t n = r.u32();
  if (n != keys.size()) fail(Code::kInternal, "store at ", addr_, " answered ", n, " values for ",
                             keys.size(), " keys");
  std::vector<Bytes> out;
  out.reserve(n);
  for (uint32_t i = 0; i < n; ++i) out.push_back(r.bytes());
  return out;
}

bool TcpStore::check(const std::vector<std::string>& keys) {
  Bytes ans = roundTrip(Writer().u8(kCheck).strs(keys).take(), 0);
  Reader r(ans, addr_);
  r.u8();
  return r.u8() != 0;
}

}  // namespace rendezvous
}  // namespace tfring
