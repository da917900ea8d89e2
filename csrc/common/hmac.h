// SHA-256 (FIPS 180-4) and HMAC-SHA256 (RFC 2104), for the connection
// handshake in common/wire.cc: peers prove they know the job secret without
// sending it. Small and dependency-free; checked against the FIPS 180-4 and
// RFC 4231 test vectors in tests/core/test_security.py.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace tfring {
namespace crypto {

using Digest = std::array<uint8_t, 32>;

class Sha256 {
 public:
  Sha256();
  void update(const void* data, size_t n);
  Digest finish();

 private:
  void block(const uint8_t* p);
  uint32_t h_[8];
  uint8_t buf_[64];
  size_t buf_len_ = 0;
  uint64_t total_ = 0;  // bytes hashed so far
};

Digest sha256(const std::string& data);
Digest hmacSha256(const std::string& key, const std::string& message);

// Equality of two digests in time independent of where they differ.
bool digestsEqual(const Digest& a, const Digest& b);

// n bytes from the kernel's CSPRNG (getrandom, else /dev/urandom); throws
// if neither is available rather than returning predictable bytes.
std::string randomBytes(size_t n);

std::string toHex(const Digest& d);

}  // namespace crypto
}  // namespace tfring
