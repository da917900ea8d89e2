// Mutation fuzzing of the parsers that read untrusted bytes, under
// AddressSanitizer: every input lives in a heap block of exactly its size,
// so a read past it stops the run. Valid encodings are mutated (truncated,
// bytes changed, huge counts spliced in, random bytes) and each parser must
// return or throw tfring::Error. Built and run by tests/fuzz/run_asan.sh.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/wire.h"
#include "rendezvous/tcp_store.h"
#include "runtime/messages.h"

using namespace tfring;
using Bytes = std::vector<uint8_t>;

namespace {

uint64_t rng_state = 0x9e3779b97f4a7c15ull;
uint64_t next() {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return rng_state;
}

Bytes mutate(const Bytes& base) {
  Bytes b = base;
  switch (next() % 5) {
    case 0: b.resize(next() % (b.size() + 1)); break;
    case 1:
      if (!b.empty()) b[next() % b.size()] = static_cast<uint8_t>(next());
      break;
    case 2: {
      static const uint32_t kHuge[] = {0xFFFFFFFFu, 0x7FFFFFFFu, 0x10000u, 1u << 30, 3u};
      uint32_t v = kHuge[next() % 5];
      if (b.size() >= 4) std::memcpy(&b[next() % (b.size() - 3)], &v, 4);
      break;
    }
    case 3: {
      b.resize(next() % 300);
      for (auto& x : b) x = static_cast<uint8_t>(next());
      break;
    }
    default: {
      size_t n = next() % 8;
      for (size_t i = 0; i < n; ++i) b.insert(b.begin() + next() % (b.size() + 1), next());
    }
  }
  return b;
}

Bytes storeRequest() {
  Bytes b = {2};
  auto str = [&](const std::string& s) {
    uint32_t n = s.size();
    b.insert(b.end(), reinterpret_cast<uint8_t*>(&n), reinterpret_cast<uint8_t*>(&n) + 4);
    b.insert(b.end(), s.begin(), s.end());
  };
  str("key");
  str("value");
  return b;
}

}  // namespace

int main(int argc, char** argv) {
  long iterations = argc > 1 ? std::atol(argv[1]) : 200000;
  runtime::Meta m;
  m.name = "grad";
  m.shape = {2, 3};
  wire::Writer wm;
  m.write(wm);
  runtime::Response resp;
  resp.seq = 7;
  resp.new_ids = {{0, "grad"}};
  runtime::Group g;
  g.names = {"grad", "bias"};
  g.dim0s = {{3, 4}, {1}};
  resp.groups = {g};
  wire::Writer wr;
  resp.write(wr);
  wire::Writer wh;
  wh.put<uint32_t>(wire::kHelloMagic);
  wh.put<uint8_t>(wire::kProtocolVersion);
  wh.put<uint32_t>(wire::kPurposeRing);
  wh.put<int32_t>(1);
  for (int i = 0; i < 32; ++i) wh.put<uint8_t>(i);

  struct Target {
    const char* name;
    Bytes seed;
    std::function<void(const Bytes&)> parse;
  };
  std::vector<Target> targets = {
      {"meta", wm.bytes(), [](const Bytes& b) { wire::Reader r(b); runtime::Meta::read(r); }},
      {"response", wr.bytes(),
       [](const Bytes& b) { wire::Reader r(b); runtime::Response::read(r); }},
      {"hello", wh.bytes(), [](const Bytes& b) { wire::parseClientHello(b); }},
      {"store", storeRequest(), [](const Bytes& b) { rendezvous::checkStoreRequest(b); }},
  };
  for (auto& t : targets) {
    t.parse(t.seed);  // the seed itself must parse
    long rejected = 0;
    for (long i = 0; i < iterations; ++i) {
      Bytes in = mutate(t.seed);
      Bytes exact(in.begin(), in.end());  // a heap block of exactly in.size()
      exact.shrink_to_fit();
      try {
        t.parse(exact);
      } catch (const Error&) {
        ++rejected;
      }
    }
    std::printf("%s: %ld inputs, %ld rejected cleanly, no over-read\n", t.name, iterations,
                rejected);
  }
  return 0;
}
