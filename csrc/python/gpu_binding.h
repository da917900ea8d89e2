// GPU arrays in the collectives of runtime_binding.cc (gpu_arrays.cc).
#pragma once

#include <pybind11/pybind11.h>

#include <string>

#include "common/types.h"

namespace tfring {
namespace python {

// True for objects exposing __cuda_array_interface__ (CuPy, PyTorch CUDA
// tensors, Numba, CudaArray) that are not numpy arrays.
bool isCudaArray(const pybind11::object& obj);

// Submits a collective on a CUDA array; returns a GpuHandle whose wait()
// gives the result (out=, or a new CudaArray).
pybind11::object submitCuda(CollectiveType type, const pybind11::object& input,
                            const std::string& name, ReduceOp op, int root, double prescale,
                            double postscale, const pybind11::object& dtype_override,
                            const pybind11::object& out);

}  // namespace python
}  // namespace tfring
