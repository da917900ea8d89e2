// Op registrations: the collective op types TensorFlow sees (the four of
// the public contract plus RingGroupedAllreduce), with their
// attributes and shape functions. Kernels live in kernels.cc; registering ops
// apart from kernels lets a GPU kernel (or none, for XLA) plug in later.
//
// All ops are stateful: two identical allreduce calls are two
// collectives, so TF must never merge (CSE), constant-fold or prune them.
// They are also marked as distributed communication, which tells TF's
// executor that an error from them is likely the root cause of a failed step.
//
// Every op carries `tensor_name`: the name that matches the request across
// ranks. When empty the kernel uses its node name (see kernels.cc).
// `process_set_id` picks the communicator (0: every rank; others: a process
// set, runtime.h); a broadcast's root_rank is a global rank either way.
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tfring {
namespace tf {

using ::tensorflow::shape_inference::DimensionHandle;
using ::tensorflow::shape_inference::InferenceContext;
using ::tensorflow::shape_inference::ShapeHandle;

namespace {

// Output: like the input, with an unknown first dimension (allgather: the sum
// of every rank's rows; reducescatter: this rank's share of the rows).
// A scalar input gets an unknown output shape rather than an error here: the
// core refuses it when the op runs, on every rank of the collective alike
// (runtime/validate.cc), where an error while building the op would stop
// this rank alone and leave the others waiting for it.
absl::Status unknownFirstDim(InferenceContext* c) {
  if (c->RankKnown(c->input(0)) && c->Rank(c->input(0)) == 0) {
    c->set_output(0, c->UnknownShape());
    return absl::OkStatus();
  }
  ShapeHandle in;
  TF_RETURN_IF_ERROR(c->WithRankAtLeast(c->input(0), 1, &in));
  ShapeHandle out;
  TF_RETURN_IF_ERROR(c->ReplaceDim(in, 0, c->UnknownDim(), &out));
  c->set_output(0, out);
  return absl::OkStatus();
}

}  // namespace

REGISTER_OP("RingAllreduce")
    .Attr("T: {half, bfloat16, float, double, int32, int64, uint8, int8, int16, uint16}")
    .Attr("reduce_op: {'sum', 'average', 'min', 'max', 'product'} = 'sum'")
    .Attr("prescale_factor: float = 1.0")
    .Attr("postscale_factor: float = 1.0")
    .Attr("tensor_name: string = ''")
    .Attr("process_set_id: int = 0")
    .Attr("wire_dtype: {'none', 'float16', 'bfloat16'} = 'none'")
    .Input("tensor: T")
    .Output("reduced: T")
    .SetIsStateful()
    .SetIsDistributedCommunication()
    .SetShapeFn(::tensorflow::shape_inference::UnchangedShape)
    .Doc(R"doc(
Reduces `tensor` element-wise across all ranks; every rank receives the result
`postscale_factor * reduce_op(prescale_factor * tensor)`. 'average' sums then
divides by the number of ranks. `wire_dtype` float16 or bfloat16 sends a float
tensor's words between ranks in 16 bits while every rank accumulates in float32
(docs/compression.md); other dtypes ignore it.
)doc");

REGISTER_OP("RingGroupedAllreduce")
    .Attr("T: list({half, bfloat16, float, double, int32, int64, uint8, int8, int16, uint16})")
    .Attr("reduce_op: {'sum', 'average', 'min', 'max', 'product'} = 'sum'")
    .Attr("prescale_factor: float = 1.0")
    .Attr("postscale_factor: float = 1.0")
    .Attr("tensor_name: string = ''")
    .Attr("process_set_id: int = 0")
    .Attr("wire_dtype: {'none', 'float16', 'bfloat16'} = 'none'")
    .Input("tensors: T")
    .Output("reduced: T")
    .SetIsStateful()
    .SetIsDistributedCommunication()
    .SetShapeFn([](InferenceContext* c) {
      for (int i = 0; i < c->num_inputs(); ++i) c->set_output(i, c->input(i));
      return absl::OkStatus();
    })
    .Doc(R"doc(
RingAllreduce of several tensors (any mix of dtypes) as one op: they are
handed to the engine together, so they are fused, and finish together. The
request for tensor i is named "<tensor_name>.i".
)doc");

REGISTER_OP("RingAllgather")
    .Attr("T: {half, bfloat16, float, double, int32, int64, uint8, int8, int16, uint16, bool}")
    .Attr("tensor_name: string = ''")
    .Attr("process_set_id: int = 0")
    .Input("tensor: T")
    .Output("gathered: T")
    .SetIsStateful()
    .SetIsDistributedCommunication()
    .SetShapeFn(unknownFirstDim)
    .Doc(R"doc(
Concatenates every rank's `tensor` along the first dimension, in rank order.
The first dimension may differ between ranks; the others must agree.
)doc");

REGISTER_OP("RingBroadcast")
    .Attr("T: {half, bfloat16, float, double, int32, int64, uint8, int8, int16, uint16, bool}")
    .Attr("root_rank: int")
    .Attr("tensor_name: string = ''")
    .Attr("process_set_id: int = 0")
    .Input("tensor: T")
    .Output("broadcast: T")
    .SetIsStateful()
    .SetIsDistributedCommunication()
    .SetShapeFn(::tensorflow::shape_inference::UnchangedShape)
    .Doc(R"doc(
Every rank receives `root_rank`'s `tensor` (the shapes must agree).
)doc");

REGISTER_OP("RingReducescatter")
    .Attr("T: {half, bfloat16, float, double, int32, int64, uint8, int8, int16, uint16}")
    .Attr("reduce_op: {'sum', 'average', 'min', 'max', 'product'} = 'sum'")
    .Attr("prescale_factor: float = 1.0")
    .Attr("postscale_factor: float = 1.0")
    .Attr("tensor_name: string = ''")
    .Attr("process_set_id: int = 0")
    .Input("tensor: T")
    .Output("reduced: T")
    .SetIsStateful()
    .SetIsDistributedCommunication()
    .SetShapeFn(unknownFirstDim)
    .Doc(R"doc(
Reduces `tensor` across ranks like RingAllreduce, then keeps this rank's share
of the first dimension: rows are split as evenly as possible, the first
(dim0 % size) ranks getting one extra row.
)doc");

// ---- alltoall and join ----------------------------------------------------

REGISTER_OP("RingAlltoall")
    .Attr("T: {half, bfloat16, float, double, int32, int64, uint8, int8, int16, uint16, bool}")
    .Attr("tensor_name: string = ''")
    .Attr("process_set_id: int = 0")
    .Input("tensor: T")
    .Input("splits: int32")
    .Output("output: T")
    .Output("received_splits: int32")
    .SetIsStateful()
    .SetIsDistributedCommunication()
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(unknownFirstDim(c));
      ShapeHandle splits;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &splits));
      c->set_output(1, c->Vector(c->UnknownDim()));
      return absl::OkStatus();
    })
    .Doc(R"doc(
Sends splits[i] rows of `tensor`'s first dimension to rank i (an empty
`splits`: an even split) and returns the rows received from every rank, in
rank order, with how many came from each (`received_splits`).
)doc");

REGISTER_OP("RingJoin")
    .Attr("tensor_name: string = ''")
    .Output("last_rank: int32")
    .SetIsStateful()
    .SetIsDistributedCommunication()
    .SetShapeFn(::tensorflow::shape_inference::ScalarShape)
    .Doc(R"doc(
This rank is out of data: until every rank has joined it takes part in the
others' allreduces with zeros. Returns the last rank to join.
)doc");

}  // namespace tf
}  // namespace tfring
