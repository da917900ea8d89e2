// RingOutputs: hands a collective's outputs to their consumers from a
// synchronous op.
//
// When an asynchronous kernel finishes, TensorFlow's executor does not run
// the ops that become ready in the finishing thread: it schedules each one
// as its own task on the inter-op thread pool. A grouped allreduce of 100
// gradients whose results are each assigned to a variable therefore wakes
// pool threads for 100 tasks of a few microseconds each (measured: about
// 1.9 ms for 100 assigns at 2 ranks on 2 cores, against 0.45 ms after a
// synchronous op). Placed right after the collective, this op is the only
// node that becomes ready when it finishes; it forwards its inputs without
// copying, and being synchronous and cheap, the executor runs the ops it
// makes ready inline, in one thread, as it would after any synchronous op.
//
// Kept apart from the collectives (ops.cc, kernels.cc): it moves no data
// between ranks, is not stateful (TF may prune it with its consumers), and
// is inserted only in graphs (tfring/ops.py), never in eager mode.
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tfring {
namespace tf {

namespace tfw = ::tensorflow;

REGISTER_OP("RingOutputs")
    .Attr("T: list(type)")
    .Input("tensors: T")
    .Output("outputs: T")
    .SetShapeFn([](tfw::shape_inference::InferenceContext* c) {
      for (int i = 0; i < c->num_inputs(); ++i) c->set_output(i, c->input(i));
      return absl::OkStatus();
    })
    .Doc(R"doc(
Forwards `tensors` unchanged (no copy). Placed after an asynchronous
collective, it lets TensorFlow run the collective's consumers inline instead
of scheduling each on the inter-op thread pool.
)doc");

class RingOutputsOp : public tfw::OpKernel {
 public:
  explicit RingOutputsOp(tfw::OpKernelConstruction* c) : OpKernel(c) {}
  void Compute(tfw::OpKernelContext* ctx) override {
    for (int i = 0; i < ctx->num_inputs(); ++i) ctx->set_output(i, ctx->input(i));
  }
  bool IsExpensive() override { return false; }
};

REGISTER_KERNEL_BUILDER(Name("RingOutputs").Device(tfw::DEVICE_CPU), RingOutputsOp);
#if TFRING_TF_GPU
REGISTER_KERNEL_BUILDER(Name("RingOutputs").Device(tfw::DEVICE_GPU), RingOutputsOp);
#endif

}  // namespace tf
}  // namespace tfring
