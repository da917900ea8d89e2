// tfring._core: the numpy-level binding of the native core, used by the
// Python package, the tests and the benchmarks.
#include "python/bindings.h"

PYBIND11_MODULE(_core, m) {
  m.doc() = "tfring native core";
  tfring::python::bindStore(m);
  tfring::python::bindKernels(m);
  tfring::python::bindRuntime(m);
  tfring::python::bindGpuArrays(m);
  tfring::python::bindGpu(m);
  tfring::python::bindGpuStreams(m);
  tfring::python::bindAlgorithms(m);
  tfring::python::bindSecurity(m);
  tfring::python::bindAlltoallJoin(m);
  tfring::python::bindTunables(m);
}
