// tfring._core_testing: hooks into the core for tests and benchmarks only
// (the collective algorithms outside the engine, the handshake's crypto,
// the parsers of untrusted bytes, the CUDA-IPC ring's schedule on host
// threads). Built beside tfring._core and linked against the same
// libtfring_core.so; the tfring package never imports it.
#include <pybind11/pybind11.h>

#include "python/testing/testing.h"

namespace py = pybind11;

namespace tfring {
namespace python {
namespace testing {
namespace {

// _core's exception class for `code` (csrc/python/errors.cc).
PyObject* classFor(Code code) {
  const char* name = "TfringError";
  switch (code) {
    case Code::kTimeout: name = "TfringTimeoutError"; break;
    case Code::kMismatch: name = "MismatchError"; break;
    case Code::kPeerFailure: name = "PeerFailureError"; break;
    case Code::kInvalidArgument: name = "InvalidArgumentError"; break;
    default: break;
  }
  return py::module_::import("tfring._core").attr(name).ptr();
}

}  // namespace

void throwStatus(const Status& status) {
  PyErr_SetString(classFor(status.code()), status.message().c_str());
  throw py::error_already_set();
}

}  // namespace testing
}  // namespace python
}  // namespace tfring

PYBIND11_MODULE(_core_testing, m) {
  namespace t = tfring::python::testing;
  // _core first: its store classes are this module's arguments, its
  // exception classes what this module raises.
  m.attr("_core") = py::module_::import("tfring._core");
  m.doc() = "tfring core hooks for tests and benchmarks";
  py::register_local_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const tfring::Error& e) {
      PyErr_SetString(t::classFor(e.status().code()), e.what());
    }
  });
  t::bindDirectAllreduce(m);
  t::bindSecurityHooks(m);
  t::bindGpuHooks(m);
}
