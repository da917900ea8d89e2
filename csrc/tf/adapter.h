// The seam between TensorFlow and the core: dtype and status translation and
// the base class every collective kernel derives from. Nothing here blocks:
// kernels hand their tensors to the engine (runtime::enqueue) and return; the
// engine calls back from its own thread, and only then do we call TF's done.
//
// One kernel class per op serves host and GPU tensors: registered for
// DEVICE_GPU (kernels.cc, when built with TFRING_TF_GPU), it hands the engine
// device pointers, the CUDA ordinal and TF's stream for the op, and the
// engine's stream contract (gpu/executor.h) does the ordering, so no TF
// thread waits on the GPU. Only TF's platform-neutral stream_executor
// interface is used: no CUDA headers, no GOOGLE_CUDA.
#pragma once

#include <string>
#include <vector>

#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"

#include "common/status.h"
#include "common/types.h"
#include "runtime/runtime.h"

namespace tfring {
namespace tf {

// DT_HALF -> kFloat16, DT_FLOAT -> kFloat32, ...; false for types the core
// does not handle (the op registrations already exclude them).
bool toRingDataType(::tensorflow::DataType in, DataType* out);

// tfring Code -> TF error code; the message passes through unchanged.
absl::Status toTfStatus(const Status& s);
// TF status -> tfring Status (kInternal, message kept), for allocator errors.
Status fromTfStatus(const absl::Status& s);

std::vector<int64_t> dimsOf(const ::tensorflow::TensorShape& shape);

// Base of the four collective kernels. Resolves the name that matches this
// op's tensors across ranks: the `tensor_name` attribute when set (the
// Python wrappers always set it inside tf.function and in eager mode),
// otherwise the node name (tf.compat.v1 graphs, graphs built elsewhere).
class RingOpKernel : public ::tensorflow::AsyncOpKernel {
 public:
  RingOpKernel(::tensorflow::OpKernelConstruction* c, CollectiveType type);

 protected:
  // Fills the fields every request shares from input `index`: name, type,
  // dtype, shape, input pointer, and for a GPU kernel the device and TF's
  // stream. Sets an error on ctx and returns false for a dtype the core
  // cannot handle (or a GPU kernel without a stream). `name_suffix` tells
  // apart the requests of one op with several inputs.
  bool prepare(::tensorflow::OpKernelContext* ctx, runtime::Request* req,
               int index = 0, const std::string& name_suffix = "");

  // Hands the requests to the engine. `done` is called exactly once, after
  // every request that was enqueued has finished (from the engine thread),
  // or right here when none was. The first error is set on ctx before it.
  // If enqueue refuses a request the rest are not submitted.
  static void submit(::tensorflow::OpKernelContext* ctx,
                     std::vector<runtime::Request> reqs, DoneCallback done);
  // With TFRING_GPU_COMPLETION=stream, GPU requests wait first for the
  // gated XLA call in flight (adapter.cc).
  static void afterGatedSubmissions(const std::vector<runtime::Request>& reqs);

  // An allocator for requests whose output shape only the engine knows
  // (allgather, reducescatter): allocates output 0 of ctx. Called on the
  // engine thread; on GPU it returns once the work TF queued on the op's
  // stream before the allocation is done, since TF's allocator reuses
  // memory whose last reader is only queued there.
  runtime::Allocator outputAllocator(::tensorflow::OpKernelContext* ctx) const;

  static void* dataOf(const ::tensorflow::Tensor& t) {
    return const_cast<char*>(t.tensor_data().data());
  }

  const std::string& tensorName() const { return tensor_name_; }
  bool onGpu() const { return on_gpu_; }

 private:
  CollectiveType type_;
  std::string tensor_name_;
  bool on_gpu_ = false;  // the DEVICE_GPU registration
  int process_set_ = 0;  // the process_set_id attribute
};

}  // namespace tf
}  // namespace tfring
