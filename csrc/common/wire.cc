#include "common/wire.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>

#include "common/hmac.h"
#include "common/net.h"
#include "common/tunables.h"

namespace tfring {
namespace wire {

void sendFrame(int fd, const std::vector<uint8_t>& payload, const Deadline& deadline,
               const std::string& peer) {
  std::vector<uint8_t> buf(4 + payload.size());
  uint32_t n = static_cast<uint32_t>(payload.size());
  std::memcpy(buf.data(), &n, 4);
  if (!payload.empty()) std::memcpy(buf.data() + 4, payload.data(), payload.size());
  net::sendAll(fd, buf.data(), buf.size(), deadline, peer);
}

std::vector<uint8_t> recvFrame(int fd, const Deadline& deadline, const std::string& peer,
                               uint32_t max_len) {
  uint32_t n = 0;
  net::recvAll(fd, &n, 4, deadline, peer);
  if (n > max_len)
    fail(Code::kInternal, "frame of ", n, " bytes from ", peer, " exceeds the ", max_len,
         "-byte limit (a corrupt stream or not a tfring peer)");
  // Grow the buffer as the bytes arrive (1 MiB steps), so a length alone,
  // without the data behind it, cannot make this process allocate.
  std::vector<uint8_t> buf;
  Deadline body = Deadline::in(std::min(deadline.remaining(), kFrameBodyTimeout));
  constexpr size_t kStep = 1u << 20;
  while (buf.size() < n) {
    size_t have = buf.size();
    size_t take = std::min<size_t>(n - have, kStep);
    buf.resize(have + take);
    net::recvAll(fd, buf.data() + have, take, body, peer);
  }
  return buf;
}

double helloTimeout() { return tunables::getDouble("TFRING_HANDSHAKE_TIMEOUT"); }

std::string peerAddress(int fd) {
  struct sockaddr_storage ss;
  socklen_t len = sizeof(ss);
  char host[INET6_ADDRSTRLEN] = {0};
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0)
    return "an unknown address";
  if (ss.ss_family == AF_INET) {
    auto* a = reinterpret_cast<sockaddr_in*>(&ss);
    inet_ntop(AF_INET, &a->sin_addr, host, sizeof(host));
    return strCat(host, ":", ntohs(a->sin_port));
  }
  if (ss.ss_family == AF_INET6) {
    auto* a = reinterpret_cast<sockaddr_in6*>(&ss);
    inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof(host));
    return strCat("[", host, "]:", ntohs(a->sin6_port));
  }
  return "a local socket";
}

namespace {

enum HelloStatus : uint8_t { kGoOn = 0, kBadVersion = 1, kBadPurpose = 2 };

const char* purposeName(uint32_t p) {
  switch (p) {
    case kPurposeRing: return "a ring data link";
    case kPurposeControl: return "a coordinator connection";
    case kPurposeStore: return "a store connection";
    case kPurposeCross: return "a cross-host ring link";
    case kPurposePeer: return "a point-to-point link";
    default: return "an unknown kind of connection";
  }
}

crypto::Digest proof(const std::string& secret, const char* label, const std::string& nonce_s,
                     const std::string& nonce_c, uint32_t purpose, int32_t rank) {
  Writer w;
  w.put<uint32_t>(purpose);
  w.put<int32_t>(rank);
  w.put<uint8_t>(kProtocolVersion);
  std::string tail(w.bytes().begin(), w.bytes().end());
  return crypto::hmacSha256(secret, std::string(label) + nonce_s + nonce_c + tail);
}

std::string take(Reader& r, size_t n) {
  std::string s;
  for (size_t i = 0; i < n; ++i) s += static_cast<char>(r.get<uint8_t>());
  return s;
}

crypto::Digest takeDigest(Reader& r) {
  crypto::Digest d;
  for (auto& b : d) b = r.get<uint8_t>();
  return d;
}

std::string versionMismatch(const std::string& peer, unsigned theirs) {
  return strCat(peer, " speaks tfring protocol version ", theirs, " but this build speaks version ",
                unsigned(kProtocolVersion),
                ": every host of the job must run the same tfring build");
}

}  // namespace

ClientHello parseClientHello(const std::vector<uint8_t>& msg) {
  Reader r(msg);
  if (msg.size() < 5 || r.get<uint32_t>() != kHelloMagic)
    fail(Code::kInternal, "not a tfring handshake (", msg.size(), " bytes, wrong magic)");
  ClientHello h;
  h.version = r.get<uint8_t>();
  if (h.version != kProtocolVersion)
    fail(Code::kMismatch, versionMismatch("the peer", h.version));
  h.purpose = r.get<uint32_t>();
  h.rank = r.get<int32_t>();
  h.nonce = take(r, kNonceBytes);
  if (!r.done()) fail(Code::kInternal, "malformed tfring handshake (", msg.size(), " bytes)");
  return h;
}

void clientHandshake(int fd, uint32_t purpose, int rank, const std::string& secret,
                     const Deadline& deadline, const std::string& peer) {
  const std::string nonce_c = crypto::randomBytes(kNonceBytes);
  Writer w1;
  w1.put<uint32_t>(kHelloMagic);
  w1.put<uint8_t>(kProtocolVersion);
  w1.put<uint32_t>(purpose);
  w1.put<int32_t>(rank);
  for (char c : nonce_c) w1.put<char>(c);
  sendFrame(fd, w1.bytes(), deadline, peer);

  std::vector<uint8_t> m2;
  try {
    m2 = recvFrame(fd, deadline, peer, kMaxHelloFrame);
  } catch (const Error& e) {
    if (e.status().code() != Code::kPeerFailure && e.status().code() != Code::kInternal) throw;
    fail(Code::kMismatch, peer, " ended the tfring handshake (", e.what(),
         "): it is not a tfring process of this job, or runs another protocol version");
  }
  Reader r2(m2);
  if (m2.size() < 6 || r2.get<uint32_t>() != kHelloMagic)
    fail(Code::kMismatch, peer, " answered the tfring handshake with something else (",
         m2.size(), " bytes): an older tfring build or not a tfring process");
  uint8_t version = r2.get<uint8_t>();
  uint8_t status = r2.get<uint8_t>();
  if (version != kProtocolVersion || status == kBadVersion)
    fail(Code::kMismatch, versionMismatch(peer, version));
  if (status == kBadPurpose)
    fail(Code::kMismatch, peer, " does not accept ", purposeName(purpose),
         " on this port (wrong address or port?)");
  if (status != kGoOn)
    fail(Code::kMismatch, peer, " refused the tfring handshake (status ", unsigned(status), ")");
  const std::string nonce_s = take(r2, kNonceBytes);

  crypto::Digest mine = proof(secret, "tfring client", nonce_s, nonce_c, purpose, rank);
  sendFrame(fd, std::vector<uint8_t>(mine.begin(), mine.end()), deadline, peer);

  std::vector<uint8_t> m4;
  try {
    m4 = recvFrame(fd, deadline, peer, kMaxHelloFrame);
  } catch (const Error& e) {
    if (e.status().code() != Code::kPeerFailure) throw;
    m4 = {0};  // a server closing here has rejected us
  }
  Reader r4(m4);
  if (m4.empty() || r4.get<uint8_t>() != 1)
    fail(Code::kMismatch, peer, " rejected this process: wrong job secret (every process of "
         "the job must use the same TFRING_SECRET)");
  if (m4.size() != 1 + 32 ||
      !crypto::digestsEqual(takeDigest(r4),
                            proof(secret, "tfring server", nonce_s, nonce_c, purpose, rank)))
    fail(Code::kMismatch, peer, " could not prove it knows the job secret: it is not part "
         "of this job (wrong address, or another job's process)");
}

HelloClient::HelloClient(int fd, uint32_t purpose, int rank, const std::string& secret,
                         const Deadline& deadline, const std::string& peer) {
  thread_ = std::thread([this, fd, purpose, rank, secret, deadline, peer] {
    try {
      clientHandshake(fd, purpose, rank, secret, deadline, peer);
    } catch (...) {
      error_ = std::current_exception();
      failed_ = true;
    }
  });
}

HelloClient::~HelloClient() {
  if (thread_.joinable()) thread_.join();
}

void HelloClient::finish() {
  if (thread_.joinable()) thread_.join();
  if (error_) {
    auto e = error_;
    error_ = nullptr;
    std::rethrow_exception(e);
  }
}

HelloAcceptor::HelloAcceptor(uint32_t purpose, std::string secret, std::string who)
    : purpose_(purpose), secret_(std::move(secret)), who_(std::move(who)) {}

std::vector<uint8_t> HelloAcceptor::answerHello(const std::vector<uint8_t>& m1) {
  uint8_t status = kGoOn;
  try {
    hello_ = parseClientHello(m1);
    if (hello_.purpose != purpose_) {
      status = kBadPurpose;
      refusal_ = strCat(who_, " asked for ", purposeName(hello_.purpose), " on the port for ",
                        purposeName(purpose_));
    }
  } catch (const Error& e) {
    if (e.status().code() != Code::kMismatch) throw;
    status = kBadVersion;  // tell the peer which version we speak, then close
    refusal_ = strCat("rejected ", who_, ": ", e.what());
  }
  nonce_s_ = crypto::randomBytes(kNonceBytes);
  Writer w2;
  w2.put<uint32_t>(kHelloMagic);
  w2.put<uint8_t>(kProtocolVersion);
  w2.put<uint8_t>(status);
  for (char c : nonce_s_) w2.put<char>(c);
  return std::move(w2.bytes());
}

std::vector<uint8_t> HelloAcceptor::answerProof(const std::vector<uint8_t>& m3) {
  if (m3.size() != 32) fail(Code::kInternal, "malformed handshake proof from ", who_);
  Reader r3(m3);
  crypto::Digest expected =
      proof(secret_, "tfring client", nonce_s_, hello_.nonce, purpose_, hello_.rank);
  accepted_ = crypto::digestsEqual(takeDigest(r3), expected);
  Writer w4;
  w4.put<uint8_t>(accepted_ ? 1 : 0);
  if (accepted_) {
    crypto::Digest mine =
        proof(secret_, "tfring server", nonce_s_, hello_.nonce, purpose_, hello_.rank);
    for (uint8_t b : mine) w4.put<uint8_t>(b);
  } else {
    refusal_ = strCat("rejected ", who_,
                      hello_.rank >= 0 ? strCat(" as rank ", hello_.rank) : "",
                      ": wrong job secret");
  }
  return std::move(w4.bytes());
}

bool acceptHello(int fd, uint32_t purpose, const std::string& secret,
                 const Deadline& deadline, int* rank, std::string* why) {
  const std::string from = peerAddress(fd);
  const std::string who = "a process connecting from " + from;
  Deadline d = Deadline::in(std::min(deadline.remaining(), helloTimeout()));
  try {
    HelloAcceptor acceptor(purpose, secret, who);
    std::vector<uint8_t> m2;
    try {
      m2 = acceptor.answerHello(recvFrame(fd, d, who, kMaxHelloFrame));
    } catch (const Error& e) {
      fail(e.status().code(), "ignored ", who, ": ", e.what());
    }
    sendFrame(fd, m2, d, who);
    if (acceptor.refused()) fail(Code::kMismatch, acceptor.refusal());
    std::vector<uint8_t> m4 = acceptor.answerProof(recvFrame(fd, d, who, kMaxHelloFrame));
    sendFrame(fd, m4, d, who);
    if (!acceptor.accepted()) fail(Code::kMismatch, acceptor.refusal());
    if (rank) *rank = acceptor.rank();
    return true;
  } catch (const Error& e) {
    if (why) *why = e.what();
    return false;
  }
}

}  // namespace wire
}  // namespace tfring
