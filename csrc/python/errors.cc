#include "python/errors.h"

namespace py = pybind11;

namespace tfring {
namespace python {
namespace {

// Owned for the life of the process on purpose: exception classes must
// outlive every module that can raise them, and releasing them from static
// destructors after the interpreter is gone would crash at exit.
PyObject* g_base = nullptr;
PyObject* g_timeout = nullptr;
PyObject* g_mismatch = nullptr;
PyObject* g_peer_failure = nullptr;
PyObject* g_invalid = nullptr;

PyObject* classFor(Code code) {
  switch (code) {
    case Code::kTimeout: return g_timeout;
    case Code::kMismatch: return g_mismatch;
    case Code::kPeerFailure: return g_peer_failure;
    case Code::kInvalidArgument: return g_invalid;
    default: return g_base;
  }
}

PyObject* newClass(py::module_& m, const char* name, PyObject* bases, const char* doc) {
  std::string qualified = std::string(PyModule_GetName(m.ptr())) + "." + name;
  PyObject* cls = PyErr_NewExceptionWithDoc(qualified.c_str(), doc, bases, nullptr);
  if (!cls) throw py::error_already_set();
  m.attr(name) = py::handle(cls);  // the module takes its own reference
  return cls;
}

}  // namespace

void registerErrors(py::module_& m) {
  if (g_base) {  // already created (a second import of the same library)
    m.attr("TfringError") = py::handle(g_base);
    m.attr("TfringTimeoutError") = py::handle(g_timeout);
    m.attr("MismatchError") = py::handle(g_mismatch);
    m.attr("PeerFailureError") = py::handle(g_peer_failure);
    m.attr("InvalidArgumentError") = py::handle(g_invalid);
    return;
  }
  g_base = newClass(m, "TfringError", PyExc_RuntimeError,
                    "Base class of every error raised by the tfring core.");
  py::tuple timeout_bases = py::make_tuple(py::handle(g_base), py::handle(PyExc_TimeoutError));
  g_timeout = newClass(m, "TfringTimeoutError", timeout_bases.ptr(),
                       "A wait passed its deadline (store key, peer, collective).");
  g_mismatch = newClass(m, "MismatchError", g_base,
                        "Processes of one job disagree (tensor shape/dtype/op, job secret).");
  g_peer_failure = newClass(m, "PeerFailureError", g_base,
                            "Another process died, closed its connection or reported an error.");

  // A wrong argument, judged by the rank that gave it (a root out of range,
  // splits that do not add up): raised on every rank of the collective.
  // Also a ValueError, as Python code expects of a bad argument.
  py::tuple invalid_bases = py::make_tuple(py::handle(g_base), py::handle(PyExc_ValueError));
  g_invalid = newClass(m, "InvalidArgumentError", invalid_bases.ptr(),
                       "A collective's arguments are invalid on some rank (root out of range, "
                       "bad splits, a dtype the operation does not take); raised on every "
                       "rank of the collective.");

  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const tfring::Error& e) {
      PyErr_SetString(classFor(e.status().code()), e.what());
    }
  });
}

void throwStatus(const tfring::Status& status) {
  PyObject* cls = g_base ? classFor(status.code()) : PyExc_RuntimeError;
  if (status.ok()) {
    PyErr_SetString(cls, "internal error: throwStatus called with an OK status");
  } else {
    PyErr_SetString(cls, status.message().c_str());
  }
  throw py::error_already_set();
}

}  // namespace python
}  // namespace tfring
