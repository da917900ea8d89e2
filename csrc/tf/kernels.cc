// Kernels of the four collective ops, for host and GPU tensors alike. Each is
// an AsyncOpKernel: it builds a runtime::Request pointing at TF's buffers
// and returns; the engine runs the collective on its own thread and calls
// `done`. No TF thread ever waits on the network (nor, on GPU, on the
// device).
//
// Output buffers: allreduce and broadcast know their output shape (the
// input's), so they allocate it here, reusing the input buffer when TF says
// nobody else holds it. Allgather and reducescatter learn their output shape
// only once every rank has been heard from, so the engine calls back into
// outputAllocator() to allocate it.
#include <string>
#include <vector>

#include "tensorflow/core/framework/op_kernel.h"

#include "tf/adapter.h"

namespace tfring {
namespace tf {

namespace tfw = ::tensorflow;

namespace {

// Reads the attributes allreduce and reducescatter share.
void reduceAttrs(tfw::OpKernelConstruction* c, ReduceOp* op, double* prescale,
                 double* postscale) {
  std::string s;
  float pre = 1.0f, post = 1.0f;
  OP_REQUIRES_OK(c, c->GetAttr("reduce_op", &s));
  OP_REQUIRES_OK(c, c->GetAttr("prescale_factor", &pre));
  OP_REQUIRES_OK(c, c->GetAttr("postscale_factor", &post));
  OP_REQUIRES(c, parseReduceOp(s, op),
              absl::InvalidArgumentError("tfring: unknown reduce_op '" + s +
                                         "'"));
  *prescale = pre;
  *postscale = post;
}

}  // namespace

// Allreduce kernels, single and grouped, share how one input becomes a
// request: reduce attributes read once, output forwarded from the input
// when TF allows it (the collective then runs in place), else allocated.
class ReduceKernel : public RingOpKernel {
 public:
  explicit ReduceKernel(tfw::OpKernelConstruction* c)
      : RingOpKernel(c, CollectiveType::kAllreduce) {
    reduceAttrs(c, &op_, &prescale_, &postscale_);
  }

 protected:
  // Request for input/output `i`; false (with ctx's status set) on error.
  bool prepareReduce(tfw::OpKernelContext* ctx, int i, const std::string& suffix,
                     runtime::Request* req) {
    if (!prepare(ctx, req, i, suffix)) return false;
    tfw::Tensor* out = nullptr;
    auto st = ctx->forward_input_or_allocate_output({i}, i, ctx->input(i).shape(), &out);
    if (!st.ok()) {
      ctx->SetStatus(st);
      return false;
    }
    req->output = dataOf(*out);
    req->op = op_;
    req->prescale = prescale_;
    req->postscale = postscale_;
    return true;
  }

 private:
  ReduceOp op_ = ReduceOp::kSum;
  double prescale_ = 1.0, postscale_ = 1.0;
};

class RingAllreduceOp : public ReduceKernel {
 public:
  using ReduceKernel::ReduceKernel;

  void ComputeAsync(tfw::OpKernelContext* ctx, DoneCallback done) override {
    runtime::Request req;
    if (!prepareReduce(ctx, 0, "", &req)) return done();
    submit(ctx, {std::move(req)}, std::move(done));
  }
};

// One op, many tensors (any mix of dtypes): every tensor is enqueued before
// the engine's next cycle, so they are fused, and the op finishes when the
// last one does. Request i is named "<tensor name>.i".
class RingGroupedAllreduceOp : public ReduceKernel {
 public:
  using ReduceKernel::ReduceKernel;

  void ComputeAsync(tfw::OpKernelContext* ctx, DoneCallback done) override {
    std::vector<runtime::Request> reqs(ctx->num_inputs());
    for (int i = 0; i < ctx->num_inputs(); ++i)
      if (!prepareReduce(ctx, i, "." + std::to_string(i), &reqs[i])) return done();
    submit(ctx, std::move(reqs), std::move(done));
  }
};

class RingAllgatherOp : public RingOpKernel {
 public:
  explicit RingAllgatherOp(tfw::OpKernelConstruction* c)
      : RingOpKernel(c, CollectiveType::kAllgather) {}

  void ComputeAsync(tfw::OpKernelContext* ctx, DoneCallback done) override {
    runtime::Request req;
    if (!prepare(ctx, &req)) return done();
    OP_REQUIRES_ASYNC(
        ctx, ctx->input(0).dims() >= 1,
        absl::InvalidArgumentError("tfring: allgather of tensor '" +
                                   tensorName() +
                                   "' needs at least one dimension"),
        done);
    req.allocate = outputAllocator(ctx);
    submit(ctx, {std::move(req)}, std::move(done));
  }
};

class RingBroadcastOp : public RingOpKernel {
 public:
  explicit RingBroadcastOp(tfw::OpKernelConstruction* c)
      : RingOpKernel(c, CollectiveType::kBroadcast) {
    OP_REQUIRES_OK(c, c->GetAttr("root_rank", &root_));
  }

  void ComputeAsync(tfw::OpKernelContext* ctx, DoneCallback done) override {
    runtime::Request req;
    if (!prepare(ctx, &req)) return done();
    tfw::Tensor* out = nullptr;
    OP_REQUIRES_OK_ASYNC(ctx,
                         ctx->forward_input_or_allocate_output(
                             {0}, 0, ctx->input(0).shape(), &out),
                         done);
    req.output = dataOf(*out);
    req.root = root_;
    submit(ctx, {std::move(req)}, std::move(done));
  }

 private:
  int root_ = 0;
};

class RingReducescatterOp : public RingOpKernel {
 public:
  explicit RingReducescatterOp(tfw::OpKernelConstruction* c)
      : RingOpKernel(c, CollectiveType::kReducescatter) {
    reduceAttrs(c, &op_, &prescale_, &postscale_);
  }

  void ComputeAsync(tfw::OpKernelContext* ctx, DoneCallback done) override {
    runtime::Request req;
    if (!prepare(ctx, &req)) return done();
    OP_REQUIRES_ASYNC(
        ctx, ctx->input(0).dims() >= 1,
        absl::InvalidArgumentError("tfring: reducescatter of tensor '" +
                                   tensorName() +
                                   "' needs at least one dimension"),
        done);
    req.op = op_;
    req.prescale = prescale_;
    req.postscale = postscale_;
    req.allocate = outputAllocator(ctx);
    submit(ctx, {std::move(req)}, std::move(done));
  }

 private:
  ReduceOp op_ = ReduceOp::kSum;
  double prescale_ = 1.0, postscale_ = 1.0;
};

// ---- alltoall and join ----------------------------------------------------
// Host tensors only: registered for DEVICE_CPU, so TensorFlow copies GPU
// tensors to the host and back around them.

class RingAlltoallOp : public RingOpKernel {
 public:
  explicit RingAlltoallOp(tfw::OpKernelConstruction* c)
      : RingOpKernel(c, CollectiveType::kAlltoall) {}

  void ComputeAsync(tfw::OpKernelContext* ctx, DoneCallback done) override {
    runtime::Request req;
    if (!prepare(ctx, &req)) return done();
    OP_REQUIRES_ASYNC(
        ctx, ctx->input(0).dims() >= 1,
        absl::InvalidArgumentError("tfring: alltoall of tensor '" +
                                   tensorName() +
                                   "' needs at least one dimension"),
        done);
    const tfw::Tensor& splits = ctx->input(1);
    auto flat = splits.flat<int32_t>();
    for (int64_t i = 0; i < flat.size(); ++i) req.splits.push_back(flat(i));
    auto received = std::make_shared<std::vector<int64_t>>();
    req.received_splits = received.get();
    req.allocate = outputAllocator(ctx);
    // received_splits is output 1, written once the engine has run.
    submit(ctx, {std::move(req)}, [ctx, received, done]() {
      if (ctx->status().ok()) {
        tfw::Tensor* out = nullptr;
        auto st = ctx->allocate_output(
            1, tfw::TensorShape({static_cast<int64_t>(received->size())}), &out);
        if (!st.ok()) {
          ctx->SetStatus(st);
        } else {
          auto v = out->flat<int32_t>();
          for (size_t i = 0; i < received->size(); ++i)
            v(i) = static_cast<int32_t>((*received)[i]);
        }
      }
      done();
    });
  }
};

class RingJoinOp : public RingOpKernel {
 public:
  explicit RingJoinOp(tfw::OpKernelConstruction* c)
      : RingOpKernel(c, CollectiveType::kJoin) {}

  void ComputeAsync(tfw::OpKernelContext* ctx, DoneCallback done) override {
    tfw::Tensor* out = nullptr;
    OP_REQUIRES_OK_ASYNC(ctx, ctx->allocate_output(0, tfw::TensorShape({}), &out),
                         done);
    runtime::Request req;
    req.name = "tfring.join";  // one join per rank at a time, matched by type
    req.type = CollectiveType::kJoin;
    req.dtype = DataType::kInt32;
    req.output = dataOf(*out);
    submit(ctx, {std::move(req)}, std::move(done));
  }
};

REGISTER_KERNEL_BUILDER(Name("RingAlltoall").Device(tfw::DEVICE_CPU), RingAlltoallOp);
REGISTER_KERNEL_BUILDER(Name("RingJoin").Device(tfw::DEVICE_CPU), RingJoinOp);

// One class per op for both devices (RingOpKernel tells them apart). The
// GPU kernels take device memory for every input and output (the attributes
// stay on the host) and are registered only in builds whose tfring_core can
// run GPU collectives for this TensorFlow (cmake/tensorflow.cmake,
// TFRING_TF_GPU); otherwise TF places the ops on the CPU. 16-bit integers
// have no NCCL type, so their GPU kernels are left out too and TF runs those
// collectives on the host (copying the tensor there and back).
#define TFRING_REGISTER_KERNELS(device, types)                               \
  REGISTER_KERNEL_BUILDER(                                                   \
      Name("RingAllreduce").Device(device).TypeConstraint("T", types),       \
      RingAllreduceOp);                                                      \
  REGISTER_KERNEL_BUILDER(Name("RingGroupedAllreduce")                       \
                              .Device(device)                                \
                              .TypeConstraint("T", types),                   \
                          RingGroupedAllreduceOp);                           \
  REGISTER_KERNEL_BUILDER(                                                   \
      Name("RingAllgather").Device(device).TypeConstraint("T", types),       \
      RingAllgatherOp);                                                      \
  REGISTER_KERNEL_BUILDER(                                                   \
      Name("RingBroadcast").Device(device).TypeConstraint("T", types),       \
      RingBroadcastOp);                                                      \
  REGISTER_KERNEL_BUILDER(                                                   \
      Name("RingReducescatter").Device(device).TypeConstraint("T", types),   \
      RingReducescatterOp)

namespace {
// Every dtype of the op registrations (each op's own list is narrower where
// it excludes bool); GPU: without the 16-bit integers.
const std::vector<tfw::DataType> kCpuTypes = {
    tfw::DT_HALF,  tfw::DT_BFLOAT16, tfw::DT_FLOAT, tfw::DT_DOUBLE,
    tfw::DT_INT32, tfw::DT_INT64,    tfw::DT_UINT8, tfw::DT_INT8,
    tfw::DT_INT16, tfw::DT_UINT16,   tfw::DT_BOOL};
#if TFRING_TF_GPU
const std::vector<tfw::DataType> kGpuTypes = {
    tfw::DT_HALF,  tfw::DT_BFLOAT16, tfw::DT_FLOAT, tfw::DT_DOUBLE,
    tfw::DT_INT32, tfw::DT_INT64,    tfw::DT_UINT8, tfw::DT_INT8,
    tfw::DT_BOOL};
#endif
}  // namespace

TFRING_REGISTER_KERNELS(tfw::DEVICE_CPU, kCpuTypes);
#if TFRING_TF_GPU
TFRING_REGISTER_KERNELS(tfw::DEVICE_GPU, kGpuTypes);
#endif

}  // namespace tf
}  // namespace tfring
