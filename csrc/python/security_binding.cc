// tfring._core network security settings: the address this process's
// listening sockets bind to and publish (the Python store servers and the
// launchers bind the same one). The handshake's SHA-256/HMAC and the
// parsers of untrusted bytes are reached by tests through
// tfring._core_testing (csrc/python/testing/).
#include <pybind11/pybind11.h>

#include <string>

#include "common/net.h"
#include "common/tunables.h"
#include "python/bindings.h"

namespace py = pybind11;

namespace tfring {
namespace python {

void bindSecurity(py::module_& m) {
  m.def("_listen_address", [](const py::object& config) {
          tunables::ScopedOverrides scope(configArg(config));
          return net::localAddress();
        }, py::arg("config") = py::none(),
        "The address this process's listening sockets bind to and publish "
        "(TFRING_IFACE_ADDR, TFRING_IFACE, loopback on single-host jobs, ...); `config` "
        "as for init.");
}

}  // namespace python
}  // namespace tfring
