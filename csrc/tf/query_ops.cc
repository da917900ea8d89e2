// Ops that return the job's topology as int32 scalars when the graph runs,
// not when it is built (Horovod's rank_op, size_op, ...): a graph built
// before tfring.init(), or saved and run in another job, reads the values of
// the job that runs it. They fail with FailedPrecondition before init.
//
// RingSize and RingProcessSetIncluded take a process set id; 0 is the set
// of all ranks. Until process sets exist every other id is unknown:
// RingSize fails naming it and RingProcessSetIncluded returns Horovod's
// error code for an unknown set (-3), as Horovod's op does.
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"

#include <string>

#include "runtime/runtime.h"

namespace tfring {
namespace tf {

namespace tfw = ::tensorflow;

namespace {

constexpr int kUnknownSet = -3;  // Horovod's HOROVOD_PROCESS_SET_ERROR_UNKNOWN_SET

enum class Query { kRank, kLocalRank, kSize, kLocalSize, kIncluded };

class QueryOp : public tfw::OpKernel {
 public:
  QueryOp(tfw::OpKernelConstruction* c, Query q) : OpKernel(c), query_(q) {
    if (q == Query::kSize || q == Query::kIncluded)
      OP_REQUIRES_OK(c, c->GetAttr("process_set_id", &set_));
  }

  void Compute(tfw::OpKernelContext* ctx) override {
    OP_REQUIRES(ctx, runtime::isInitialized(),
                absl::FailedPreconditionError(
                    "tfring is not initialized: call tfring.init() first"));
    int value = 0;
    switch (query_) {
      case Query::kRank: value = runtime::rank(); break;
      case Query::kLocalRank: value = runtime::localRank(); break;
      case Query::kLocalSize: value = runtime::localSize(); break;
      case Query::kSize:
        OP_REQUIRES(ctx, set_ == 0,
                    absl::InvalidArgumentError(
                        "tfring: unknown process set id " + std::to_string(set_)));
        value = runtime::size();
        break;
      case Query::kIncluded: value = set_ == 0 ? 1 : kUnknownSet; break;
    }
    tfw::Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, tfw::TensorShape({}), &out));
    out->scalar<int32_t>()() = value;
  }

 private:
  Query query_;
  int set_ = 0;
};

template <Query Q>
class QueryKernel : public QueryOp {
 public:
  explicit QueryKernel(tfw::OpKernelConstruction* c) : QueryOp(c, Q) {}
};

}  // namespace

REGISTER_OP("RingRank")
    .Output("rank: int32")
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::ScalarShape);
REGISTER_OP("RingLocalRank")
    .Output("local_rank: int32")
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::ScalarShape);
REGISTER_OP("RingSize")
    .Attr("process_set_id: int = 0")
    .Output("size: int32")
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::ScalarShape);
REGISTER_OP("RingLocalSize")
    .Output("local_size: int32")
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::ScalarShape);
REGISTER_OP("RingProcessSetIncluded")
    .Attr("process_set_id: int = 0")
    .Output("included: int32")
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::ScalarShape);

// Host kernels only: TF places these ops on the CPU on a GPU host too.
REGISTER_KERNEL_BUILDER(Name("RingRank").Device(tfw::DEVICE_CPU), QueryKernel<Query::kRank>);
REGISTER_KERNEL_BUILDER(Name("RingLocalRank").Device(tfw::DEVICE_CPU),
                        QueryKernel<Query::kLocalRank>);
REGISTER_KERNEL_BUILDER(Name("RingSize").Device(tfw::DEVICE_CPU), QueryKernel<Query::kSize>);
REGISTER_KERNEL_BUILDER(Name("RingLocalSize").Device(tfw::DEVICE_CPU),
                        QueryKernel<Query::kLocalSize>);
REGISTER_KERNEL_BUILDER(Name("RingProcessSetIncluded").Device(tfw::DEVICE_CPU),
                        QueryKernel<Query::kIncluded>);

}  // namespace tf
}  // namespace tfring
