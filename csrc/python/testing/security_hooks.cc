// tfring._core_testing security hooks: the SHA-256/HMAC the connection
// handshake uses (checked against published test vectors) and the parsers
// every listening port runs on untrusted bytes (fed random and mutated
// input by tests/core/test_security*.py).
//
//   sha256(data) -> bytes
//   hmac_sha256(key, msg) -> bytes
//   random_bytes(n) -> bytes
//   fuzz_parse(kind, data)   kind: hello, meta, response, store, frame;
//                            returns None or raises a tfring error
#include <pybind11/pybind11.h>
#include <sys/socket.h>

#include <string>
#include <vector>

#include "common/hmac.h"
#include "common/net.h"
#include "common/wire.h"
#include "python/testing/testing.h"
#include "rendezvous/tcp_store.h"
#include "runtime/messages.h"

namespace py = pybind11;

namespace tfring {
namespace python {
namespace testing {
namespace {

py::bytes digestBytes(const crypto::Digest& d) {
  return py::bytes(reinterpret_cast<const char*>(d.data()), d.size());
}

// Runs one parser over `data`; returns normally or raises a tfring error.
void fuzzParse(const std::string& kind, const std::string& data) {
  std::vector<uint8_t> bytes(data.begin(), data.end());
  if (kind == "hello") {
    wire::parseClientHello(bytes);
  } else if (kind == "meta") {
    wire::Reader r(bytes);
    runtime::Meta::read(r);
  } else if (kind == "response") {
    wire::Reader r(bytes);
    runtime::Response::read(r);
  } else if (kind == "store") {
    rendezvous::checkStoreRequest(bytes);
  } else if (kind == "frame") {
    // The bytes as a peer would send them, then EOF: recvFrame must return
    // a frame or fail cleanly, never wait for more or read past them.
    int sv[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
      fail(Code::kInternal, "socketpair failed");
    struct Closer {
      int* fds;
      ~Closer() { net::closeFd(fds[0]); net::closeFd(fds[1]); }
    } closer{sv};
    int sz = 1 << 20;
    ::setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &sz, sizeof(sz));
    net::sendAll(sv[0], data.data(), data.size(), Deadline::in(5), "the test");
    ::shutdown(sv[0], SHUT_WR);
    wire::recvFrame(sv[1], Deadline::in(5), "the test");
  } else {
    fail(Code::kInvalidArgument, "unknown parser kind '", kind, "'");
  }
}

}  // namespace

void bindSecurityHooks(py::module_& m) {
  m.def("sha256", [](const py::bytes& b) { return digestBytes(crypto::sha256(b)); });
  m.def("hmac_sha256", [](const py::bytes& key, const py::bytes& msg) {
    return digestBytes(crypto::hmacSha256(key, msg));
  });
  m.def("random_bytes", [](size_t n) { return py::bytes(crypto::randomBytes(n)); });
  m.def("fuzz_parse", [](const std::string& kind, const py::bytes& data) {
    std::string s = data;
    py::gil_scoped_release nogil;
    fuzzParse(kind, s);
  }, py::arg("kind"), py::arg("data"),
        "Runs the parser `kind` (hello, meta, response, store, frame) over `data`; "
        "returns None or raises a tfring error.");
}

}  // namespace testing
}  // namespace python
}  // namespace tfring
