// tfring._core_testing: test hooks into the core that the product never
// imports. The module imports tfring._core first, so the store classes and
// exception types it takes and raises are _core's own.
#pragma once

#include <pybind11/pybind11.h>

#include "common/status.h"

namespace tfring {
namespace python {
namespace testing {

void bindDirectAllreduce(pybind11::module_& m);  // direct_allreduce.cc
void bindSecurityHooks(pybind11::module_& m);    // security_hooks.cc
void bindGpuHooks(pybind11::module_& m);         // gpu_hooks.cc

// Raises `status` as tfring._core's exception class for its code (needs
// the GIL).
[[noreturn]] void throwStatus(const Status& status);

}  // namespace testing
}  // namespace python
}  // namespace tfring
