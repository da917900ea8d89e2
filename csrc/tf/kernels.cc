// Kernels of the four collective ops, for host and GPU tensors alike. Each is
// an AsyncOpKernel: it builds a runtime::Request pointing at TF's buffers
// and returns; the engine runs the collective on its own thread and calls
// `done`. No TF thread ever waits on the network (nor, on GPU, on the
// device).
//
// Output buffers: allreduce and broadcast know their output shape (the
// input's), so they allocate it here, reusing the input buffer when TF says
// nobody else holds it; a grouped allreduce puts the outputs it cannot
// forward in one shared allocation (RingGroupedAllreduceOp). Allgather and
// reducescatter learn their output shape only once every rank has been
// heard from, so the engine calls back into outputAllocator() to allocate
// it.
#include <algorithm>
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
    std::string w;
    OP_REQUIRES_OK(c, c->GetAttr("wire_dtype", &w));
    OP_REQUIRES(c, parseWireType(w, &wire_),
                absl::InvalidArgumentError("tfring: unknown wire_dtype '" + w + "'"));
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
    req->wire = wire_;
    return true;
  }

 protected:
  ReduceOp op() const { return op_; }
  WireType wire() const { return wire_; }
  double prescale() const { return prescale_; }
  double postscale() const { return postscale_; }

 private:
  ReduceOp op_ = ReduceOp::kSum;
  double prescale_ = 1.0, postscale_ = 1.0;
  WireType wire_ = WireType::kNone;
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

// One op, many tensors. Host tensors of one dtype (a model's gradients)
// are one request with a part per tensor (runtime::Request::parts): the
// engine negotiates, fuses and completes the group as one tensor named
// "<tensor name>", and reduces every part where it lies. Each tensor of
// such a group cost the step about 2-3 us of per-request work (its name,
// its entry, its place in the round, its callback) on a 2-core host. Its
// outputs that cannot reuse their input share one allocation: an assign
// then copies into the variable's own buffer, as after TF's own ops, rather
// than adopting a fresh buffer and freeing the last one, one pair a tensor
// a step (measured: 100 x 16 KiB assigned, 10-20% of the step).
// GPU tensors of one dtype are one request with parts too: the GPU
// executor reduces the parts as one fused buffer. A mix of dtypes goes as
// one request per tensor, request i named "<tensor name>.i", all enqueued
// before the engine's next cycle, so they are fused; the op finishes when
// the last one does.
class RingGroupedAllreduceOp : public ReduceKernel {
 public:
  using ReduceKernel::ReduceKernel;

  void ComputeAsync(tfw::OpKernelContext* ctx, DoneCallback done) override {
    const int n = ctx->num_inputs();
    bool one_dtype = n > 0;
    for (int i = 1; one_dtype && i < n; ++i)
      one_dtype = ctx->input(i).dtype() == ctx->input(0).dtype();
    if (one_dtype) {
      runtime::Request req;
      if (!prepareGroup(ctx, &req)) return done();
      submit(ctx, {std::move(req)}, std::move(done));
      return;
    }
    std::vector<runtime::Request> reqs(n);
    for (int i = 0; i < n; ++i)
      if (!prepareReduce(ctx, i, "." + std::to_string(i), &reqs[i])) return done();
    submit(ctx, std::move(reqs), std::move(done));
  }

 private:
  // One request for every input. Output i is input i when TF lets it be
  // forwarded (a gradient nothing else holds); the others share one
  // allocation, each part aligned for Eigen, instead of one allocation
  // each.
  bool prepareGroup(tfw::OpKernelContext* ctx, runtime::Request* req) {
    if (!prepare(ctx, req, 0, "")) return false;
    const int n = ctx->num_inputs();
    const tfw::DataType dt = ctx->input(0).dtype();
    const int64_t align = std::max<int64_t>(1, 64 / tfw::DataTypeSize(dt));
    auto padded = [align](int64_t count) { return (count + align - 1) / align * align; };
    std::vector<std::vector<int64_t>> shapes(n);
    std::vector<runtime::Request::Part> parts(n);
    std::vector<int> rest;
    int64_t shared = 0;
    for (int i = 0; i < n; ++i) {
      const tfw::Tensor& in = ctx->input(i);
      tfw::Tensor* out = nullptr;
      shapes[i] = dimsOf(in.shape());
      parts[i] = {dataOf(in), nullptr, in.NumElements()};
      if (ctx->forward_input_to_output_with_shape(i, i, in.shape(), &out)) {
        parts[i].output = dataOf(*out);
      } else if (in.NumElements() > 0) {
        rest.push_back(i);
        shared += padded(in.NumElements());
      } else {
        auto st = ctx->allocate_output(i, in.shape(), &out);
        if (!st.ok()) {
          ctx->SetStatus(st);
          return false;
        }
        parts[i].output = dataOf(*out);
      }
    }
    if (!rest.empty()) {
      tfw::Tensor flat;
      auto st = ctx->allocate_temp(dt, tfw::TensorShape({shared}), &flat,
                                   ctx->output_alloc_attr(rest[0]));
      if (!st.ok()) {
        ctx->SetStatus(st);
        return false;
      }
      int64_t off = 0;
      for (int i : rest) {
        const tfw::Tensor& in = ctx->input(i);
        tfw::Tensor out;
        if (!out.CopyFrom(flat.Slice(off, off + in.NumElements()), in.shape())) {
          ctx->SetStatus(absl::InternalError("tfring: cannot place output of '" + tensorName() +
                                             "'"));
          return false;
        }
        ctx->set_output(i, out);
        parts[i].output = dataOf(out);
        off += padded(in.NumElements());
      }
    }
    req->op = op();
    req->prescale = prescale();
    req->postscale = postscale();
    req->wire = wire();
    runtime::setParts(req, std::move(parts), shapes);
    return true;
  }
};

class RingAllgatherOp : public RingOpKernel {
 public:
  explicit RingAllgatherOp(tfw::OpKernelConstruction* c)
      : RingOpKernel(c, CollectiveType::kAllgather) {}

  void ComputeAsync(tfw::OpKernelContext* ctx, DoneCallback done) override {
    runtime::Request req;
    if (!prepare(ctx, &req)) return done();
    // A scalar is refused by the core on every rank (runtime/validate.cc),
    // not here: a rank refusing alone would leave the others waiting.
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
