// Python exceptions for tfring::Error. Every binding file raises core errors
// through these, so Python code can catch one class per failure kind:
//
//   TfringError (RuntimeError)        everything else
//   ├── TfringTimeoutError            Code::kTimeout (also a builtin TimeoutError)
//   ├── MismatchError                 Code::kMismatch
//   └── PeerFailureError              Code::kPeerFailure
#pragma once

#include <pybind11/pybind11.h>

#include "common/status.h"

namespace tfring {
namespace python {

// Creates the exception classes in `m` and registers a translator that turns
// a tfring::Error escaping any binding into the matching class. Idempotent.
void registerErrors(pybind11::module_& m);

// Raises `status` as the matching Python exception (needs the GIL).
[[noreturn]] void throwStatus(const tfring::Status& status);

}  // namespace python
}  // namespace tfring
