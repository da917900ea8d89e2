// CUDA arrays in tfring._core, shared by its GPU binding files: the
// CudaArray result type, what an object's __cuda_array_interface__ says
// (CudaView), and a GPU collective's completion (GpuState). Defined in
// gpu_arrays.cc, which also runs the collectives on GPU arrays
// (gpu_binding.h's submitCuda).
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/types.h"
#include "gpu/device.h"
#include "python/completion.h"

namespace tfring {
namespace python {

// The array-interface typestr of a tfring dtype (bfloat16 travels as u2).
const char* typestrOf(DataType t);

// Device memory owned by Python: a collective's result.
class CudaArray {
 public:
  CudaArray(std::vector<int64_t> shape, DataType dtype, int device, void* ptr)
      : shape_(std::move(shape)), dtype_(dtype), device_(device), ptr_(ptr) {}
  static std::shared_ptr<CudaArray> empty(std::vector<int64_t> shape, DataType dtype, int device) {
    size_t n = 1;
    for (auto d : shape) n *= static_cast<size_t>(d);
    void* p = gpu::deviceAlloc(device, n * dtypeSize(dtype));
    return std::make_shared<CudaArray>(std::move(shape), dtype, device, p);
  }
  ~CudaArray() { gpu::deviceFree(device_, ptr_); }

  size_t size() const {
    size_t n = 1;
    for (auto d : shape_) n *= static_cast<size_t>(d);
    return n;
  }
  size_t nbytes() const { return size() * dtypeSize(dtype_); }
  void* ptr() const { return ptr_; }
  int device() const { return device_; }
  DataType dtype() const { return dtype_; }
  const std::vector<int64_t>& shape() const { return shape_; }

  // __cuda_array_interface__ (v3) of the array, complete: no stream.
  pybind11::dict interface() const;
  // A copy on the host.
  pybind11::array toNumpy() const;

 private:
  std::vector<int64_t> shape_;
  DataType dtype_;
  int device_;
  void* ptr_;
};

// A CUDA array as its __cuda_array_interface__ describes it.
struct CudaView {
  void* ptr = nullptr;
  std::vector<int64_t> shape;
  std::string typestr;
  size_t itemsize = 0;
  bool readonly = false;
  void* stream = nullptr;  // the producer's stream; null: no sync needed
  size_t count() const {
    size_t n = 1;
    for (auto d : shape) n *= static_cast<size_t>(d);
    return n;
  }
};

// What `obj`'s __cuda_array_interface__ says; `what` names it in errors.
CudaView viewOf(const pybind11::object& obj, const char* what);
// The dtype of `v`, or `dtype` when given (its element size must match).
DataType resolveCudaDtype(const CudaView& v, const pybind11::object& dtype);
// The GPU holding `v` (the array `obj`): its pointer's, or for an empty
// array the device it names.
int deviceOfView(const CudaView& v, const pybind11::object& obj, const char* what);

// A cudaStream_t given as an int; None: null.
void* streamOf(const pybind11::object& s);
// "sum", "average", "min", "max" or "product".
ReduceOp opOf(const std::string& s);

// A GPU collective's completion, shared by the engine and its Python handle.
struct GpuState : Completion {
  // Engine-allocated output (allgather, reducescatter): device memory.
  std::vector<int64_t> out_shape;
  void* out_ptr = nullptr;
  int device = 0;
  ~GpuState() { gpu::deviceFree(device, out_ptr); }
};

}  // namespace python
}  // namespace tfring
