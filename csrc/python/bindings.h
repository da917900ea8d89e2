// Each binding file adds one part of tfring._core; module.cc calls them all.
#pragma once

#include <pybind11/pybind11.h>

#include <map>
#include <memory>
#include <string>

#include "collectives/collective_stats.h"

namespace tfring {
namespace python {

void bindStore(pybind11::module_& m);    // store_binding.cc
void bindKernels(pybind11::module_& m);  // kernels_binding.cc
void bindRuntime(pybind11::module_& m);  // runtime_binding.cc
void bindGpuArrays(pybind11::module_& m);  // gpu_arrays.cc
void bindGpu(pybind11::module_& m);      // gpu_binding.cc
void bindGpuStreams(pybind11::module_& m);  // gpu_stream_binding.cc
void bindAlgorithms(pybind11::module_& m);  // algorithms_binding.cc
void bindSecurity(pybind11::module_& m); // security_binding.cc
void bindAlltoallJoin(pybind11::module_& m);  // alltoall_binding.cc
void bindTunables(pybind11::module_& m);  // tunables_binding.cc

// init's `config` argument: a mapping of TFRING_* names to values, or None
// (tunables_binding.cc).
std::map<std::string, std::string> configArg(const pybind11::object& config);

// The statistics of communicator `process_set` (0: the world; all zero
// before init) for the readers that take process_set=; throws
// kInvalidArgument for an unknown set or one this rank is not in
// (algorithms_binding.cc).
std::shared_ptr<const collectives::CommStats> commStats(int process_set);

// A collective's cross-rank name: the caller's, else "<kind>.noname.<n>"
// for the n-th unnamed call of the process (runtime_binding.cc).
std::string autoName(const char* kind, const pybind11::object& name);

}  // namespace python
}  // namespace tfring
