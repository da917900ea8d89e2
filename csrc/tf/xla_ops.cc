// XLA kernels of the collective ops, so that a function compiled with
// jit_compile=True (Keras's train step on GPU hosts included) runs them.
// Each op becomes one typed-FFI custom call (targets in xla_custom_call.cc)
// whose attributes carry the op's cross-rank `tensor_name` and its reduce
// attributes. An allreduce or broadcast writes over its operand's buffer
// (output_to_operand_aliasing), as TF kernels do when TF forwards their
// input; the other ops get an output buffer of their own.
//
// XLA fixes every shape when it compiles, so:
//   * allreduce and broadcast produce the input's shape;
//   * allgather produces size * dim0 rows: under XLA every rank must bring
//     the same first dimension (checked across ranks at run time, a
//     MismatchError on every rank otherwise, see xla_custom_call.cc);
//   * reducescatter produces this rank's rows (runtime::reducescatterShape),
//     so tfring must be initialized before the function is compiled;
//   * a dynamic (data-dependent) dimension is refused while compiling, with
//     an error naming the op.
//
// The calls are side-effecting: XLA never merges, drops or hoists them,
// exactly like the stateful TF ops they compile.
//
// Order. Where a custom call blocks its thread until the collective is done
// (the CUDA target), every rank must reach the calls in the same order, and
// XLA does not promise that for calls with no data path between them (seen
// on an H200: model.fit with two gradient buckets, each rank blocked in the
// other's; likely cause: the module differs by rank where GPU autotuning,
// timed in each process, picks other fusions, and the schedule with it).
// So there the calls of one computation form a chain: each takes the
// previous call's extra s32[] result as its last operand and returns a new
// one, in the order tf2xla compiles the ops: a topological order that
// follows the order the ops were built in, so the same on every rank that
// traces the same code (ranks that build independent collectives in
// different orders deadlock here, as they would without the chain). A
// data dependency fixes the order in every schedule. The host target is asynchronous (its calls can be in
// flight together in any order), so it is left free unless TFRING_XLA_ORDER
// says "chain" ("free" turns the chain off everywhere).
#include <cctype>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "tensorflow/compiler/tf2xla/xla_context.h"
#include "tensorflow/compiler/tf2xla/xla_expression.h"
#include "tensorflow/compiler/tf2xla/xla_op_kernel.h"
#include "tensorflow/compiler/tf2xla/xla_op_registry.h"
#include "tensorflow/compiler/tf2xla/xla_resource.h"
#include "xla/hlo/builder/xla_builder.h"
#include "xla/shape.h"
#include "xla/shape_util.h"

#include "common/tunables.h"
#include "common/types.h"
#include "runtime/runtime.h"

namespace tfring {
namespace tf {
namespace {

namespace tfw = ::tensorflow;

// A string attribute in the MLIR dictionary syntax XLA parses a typed-FFI
// call's backend_config with: anything but [A-Za-z0-9_./-] hex-escaped.
std::string mlirString(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '_' || c == '.' || c == '/' || c == '-') {
      out += static_cast<char>(c);
    } else {
      char buf[4];
      std::snprintf(buf, sizeof(buf), "\\%02X", c);
      out += buf;
    }
  }
  return out + "\"";
}

// A double as its exact bit pattern (MLIR's hexadecimal float literal).
std::string mlirDouble(double v) {
  uint64_t bits;
  std::memcpy(&bits, &v, sizeof(bits));
  char buf[40];
  std::snprintf(buf, sizeof(buf), "0x%016llX : f64", static_cast<unsigned long long>(bits));
  return buf;
}

std::string mlirInt(int64_t v) { return std::to_string(v) + " : i32"; }

// TFRING_XLA_ORDER: "auto" (default: chain where the calls block, every
// XLA device but the CPU), "chain" (everywhere), "free" (nowhere). Read
// once per process (ops are built before init, so a bad value fails the
// op's construction, naming the variable).
bool chainCalls(const std::string& xla_device, std::string* error) {
  static std::string bad;
  static const std::string mode = [] {
    try {
      return ::tfring::tunables::getString("TFRING_XLA_ORDER");
    } catch (const ::tfring::Error& e) {
      bad = e.status().message();
      return std::string("auto");
    }
  }();
  *error = bad;
  if (mode == "chain") return true;
  if (mode == "free") return false;
  return xla_device != "XLA_CPU_JIT";
}

// The last chained call's order value, per XlaBuilder (one computation: a
// while loop's body has its own). A builder's address can be reused after
// it is gone, so an entry counts only if its builder has the same name and
// the op is still an s32[] there; otherwise the chain starts again.
class CallChain {
 public:
  static xla::XlaOp previous(xla::XlaBuilder* b) {
    std::lock_guard<std::mutex> lk(mu());
    auto it = links().find(b);
    if (it != links().end() && it->second.builder_name == b->name()) {
      absl::StatusOr<xla::Shape> shape = b->GetShape(it->second.op);
      if (shape.ok() && *shape == orderShape()) return it->second.op;
    }
    return xla::ConstantR0<int32_t>(b, 0);
  }
  static void record(xla::XlaBuilder* b, xla::XlaOp op) {
    std::lock_guard<std::mutex> lk(mu());
    links()[b] = Link{b->name(), op};
  }
  static xla::Shape orderShape() { return xla::ShapeUtil::MakeShape(xla::S32, {}); }

 private:
  struct Link {
    std::string builder_name;
    xla::XlaOp op;
  };
  static std::mutex& mu() {
    static std::mutex* m = new std::mutex();
    return *m;
  }
  static std::unordered_map<const xla::XlaBuilder*, Link>& links() {
    static auto* l = new std::unordered_map<const xla::XlaBuilder*, Link>();
    return *l;
  }
};

// Whether `op` is one of the computation's arguments as they arrive: a
// tensor argument, or a resource variable's value before any update (a
// step that reads a variable and reduces it). XLA must keep those buffers,
// so an output aliased to one costs a copy instruction of its own, and
// many small ones cost more than the engine's copy of the same bytes.
bool isArgument(tfw::XlaOpKernelContext* ctx, const xla::XlaOp& op) {
  for (const tfw::XlaExpression& arg : ctx->xla_context()->args()) {
    if (arg.kind() == tfw::XlaExpression::Kind::kXlaOp && arg.handle().IsIdenticalTo(op))
      return true;
    if (arg.kind() == tfw::XlaExpression::Kind::kResource && arg.resource() != nullptr &&
        arg.resource()->initial_value().IsIdenticalTo(op))
      return true;
  }
  return false;
}

class RingXlaOp : public tfw::XlaOpKernel {
 public:
  RingXlaOp(tfw::OpKernelConstruction* c, CollectiveType type)
      : XlaOpKernel(c), type_(type) {
    OP_REQUIRES_OK(c, c->GetAttr("tensor_name", &tensor_name_));
    if (tensor_name_.empty()) tensor_name_ = name();
    if (type == CollectiveType::kAllreduce || type == CollectiveType::kReducescatter) {
      std::string op;
      float pre = 1.0f, post = 1.0f;
      OP_REQUIRES_OK(c, c->GetAttr("reduce_op", &op));
      OP_REQUIRES_OK(c, c->GetAttr("prescale_factor", &pre));
      OP_REQUIRES_OK(c, c->GetAttr("postscale_factor", &post));
      OP_REQUIRES(c, parseReduceOp(op, &op_),
                  absl::InvalidArgumentError("tfring: unknown reduce_op '" + op + "'"));
      prescale_ = pre;
      postscale_ = post;
    }
    if (type == CollectiveType::kAllreduce) {
      // The custom call has no wire attribute: a 16-bit wire runs outside
      // XLA only (tfring.allreduce falls back to casting under jit_compile).
      std::string wire;
      OP_REQUIRES_OK(c, c->GetAttr("wire_dtype", &wire));
      OP_REQUIRES(c, wire == "none",
                  absl::UnimplementedError(absl::StrCat(
                      "tfring: allreduce of '", tensor_name_, "' with wire_dtype ", wire,
                      " cannot be compiled by XLA (jit_compile); tfring.allreduce with "
                      "compression= casts the tensor instead there")));
    }
    if (type == CollectiveType::kBroadcast) OP_REQUIRES_OK(c, c->GetAttr("root_rank", &root_));
    std::string bad_order;
    chained_ = chainCalls(c->device_type().type_string(), &bad_order);
    OP_REQUIRES(c, bad_order.empty(), absl::InvalidArgumentError("tfring: " + bad_order));
  }

  void Compile(tfw::XlaOpKernelContext* ctx) override {
    const int n = ctx->num_inputs();
    std::vector<xla::XlaOp> operands;
    std::vector<xla::Shape> results;
    for (int i = 0; i < n; ++i) {
      absl::StatusOr<xla::Shape> shape = ctx->InputXlaShape(i);
      OP_REQUIRES_OK(ctx, shape.status());
      OP_REQUIRES(ctx, shape->is_static(),
                  error(absl::StrCat("has the dynamic shape ", shape->ToString(),
                                     " under XLA (a data-dependent size, such as the output "
                                     "of tf.unique or tf.boolean_mask). XLA fixes every "
                                     "collective's shape when it compiles: pad the tensor to "
                                     "a fixed size, or call the collective outside the "
                                     "jit-compiled function")));
      operands.push_back(ctx->Input(i));
      xla::Shape out = *shape;
      if (type_ == CollectiveType::kAllgather || type_ == CollectiveType::kReducescatter) {
        OP_REQUIRES(ctx, out.dimensions().size() >= 1,
                    error("needs at least one dimension"));
        OP_REQUIRES(ctx, runtime::isInitialized(),
                    error("is compiled by XLA before tfring.init(): its output shape "
                          "depends on the number of ranks; call tfring.init() first"));
        int64_t d0 = out.dimensions(0);
        int64_t rows = type_ == CollectiveType::kAllgather
                           ? d0 * runtime::size()
                           : runtime::reducescatterShape({d0}, runtime::rank(),
                                                         runtime::size())[0];
        out.set_dimensions(0, rows);
      }
      results.push_back(out);
    }
    const bool grouped = type_ == CollectiveType::kAllreduce && grouped_;
    xla::XlaBuilder* b = ctx->builder();
    if (chained_) {  // the order value: last operand, last result
      operands.push_back(CallChain::previous(b));
      results.push_back(CallChain::orderShape());
    }
    const bool tuple = grouped || chained_;
    xla::Shape result = tuple ? xla::ShapeUtil::MakeTupleShape(results) : results[0];
    // An allreduce or broadcast writes its result over its input, as the TF
    // kernels do when TF forwards the input: XLA gives the call one buffer
    // per tensor, so the engine copies nothing. Not over an argument: XLA
    // would copy it first, one instruction per tensor (isArgument).
    std::vector<std::pair<xla::ShapeIndex, std::pair<int64_t, xla::ShapeIndex>>> alias;
    if (type_ == CollectiveType::kAllreduce || type_ == CollectiveType::kBroadcast) {
      for (int i = 0; i < n; ++i)
        if (!isArgument(ctx, operands[i]))
          alias.push_back({tuple ? xla::ShapeIndex({i}) : xla::ShapeIndex({}),
                         {i, xla::ShapeIndex({})}});
    }
    xla::XlaOp call = xla::CustomCall(
        b, target(), operands, result, backendConfig(grouped),
        /*has_side_effect=*/true, alias, /*literal=*/nullptr,
        xla::CustomCallSchedule::SCHEDULE_NONE, xla::CustomCallApiVersion::API_VERSION_TYPED_FFI);
    if (!tuple) {
      ctx->SetOutput(0, call);
      return;
    }
    for (int i = 0; i < n; ++i) ctx->SetOutput(i, xla::GetTupleElement(call, i));
    if (chained_) CallChain::record(b, xla::GetTupleElement(call, n));
  }

 protected:
  bool grouped_ = false;

 private:
  absl::Status error(const std::string& what) const {
    return absl::InvalidArgumentError(absl::StrCat(
        "tfring: ", collectiveName(type_), " of tensor '", tensor_name_, "' (op ", name(),
        ") ", what));
  }

  const char* target() const {
    switch (type_) {
      case CollectiveType::kAllgather: return "tfring_allgather";
      case CollectiveType::kBroadcast: return "tfring_broadcast";
      case CollectiveType::kReducescatter: return "tfring_reducescatter";
      default: return "tfring_allreduce";
    }
  }

  // The handler's attributes, in the dictionary syntax of typed FFI calls.
  std::string backendConfig(bool grouped) const {
    std::string c = "{tensor_name = " + mlirString(tensor_name_);
    c += ", ordered = " + mlirInt(chained_ ? 1 : 0);
    switch (type_) {
      case CollectiveType::kAllreduce:
        c += ", grouped = " + mlirInt(grouped ? 1 : 0);
        [[fallthrough]];
      case CollectiveType::kReducescatter:
        c += ", reduce_op = " + mlirInt(static_cast<int>(op_));
        c += ", prescale = " + mlirDouble(prescale_);
        c += ", postscale = " + mlirDouble(postscale_);
        break;
      case CollectiveType::kBroadcast:
        c += ", root = " + mlirInt(root_);
        break;
      default:
        break;
    }
    return c + "}";
  }

  CollectiveType type_;
  std::string tensor_name_;
  ReduceOp op_ = ReduceOp::kSum;
  double prescale_ = 1.0, postscale_ = 1.0;
  int root_ = 0;
  bool chained_ = false;
};

class RingAllreduceXla : public RingXlaOp {
 public:
  explicit RingAllreduceXla(tfw::OpKernelConstruction* c)
      : RingXlaOp(c, CollectiveType::kAllreduce) {}
};

class RingGroupedAllreduceXla : public RingXlaOp {
 public:
  explicit RingGroupedAllreduceXla(tfw::OpKernelConstruction* c)
      : RingXlaOp(c, CollectiveType::kAllreduce) {
    grouped_ = true;
  }
};

class RingAllgatherXla : public RingXlaOp {
 public:
  explicit RingAllgatherXla(tfw::OpKernelConstruction* c)
      : RingXlaOp(c, CollectiveType::kAllgather) {}
};

class RingBroadcastXla : public RingXlaOp {
 public:
  explicit RingBroadcastXla(tfw::OpKernelConstruction* c)
      : RingXlaOp(c, CollectiveType::kBroadcast) {}
};

class RingReducescatterXla : public RingXlaOp {
 public:
  explicit RingReducescatterXla(tfw::OpKernelConstruction* c)
      : RingXlaOp(c, CollectiveType::kReducescatter) {}
};

// XLA:CPU always; XLA:GPU only where the custom calls have a CUDA target
// (builds with the GPU kernels), so that elsewhere TF reports the op as not
// compilable for the GPU instead of XLA failing to find the target.
constexpr absl::string_view kXlaDevices[] = {
    "XLA_CPU_JIT",  // tensorflow::DEVICE_CPU_XLA_JIT
#if TFRING_TF_GPU
    "XLA_GPU_JIT",  // tensorflow::DEVICE_GPU_XLA_JIT
#endif
};

REGISTER_XLA_OP(Name("RingAllreduce").Device(kXlaDevices), RingAllreduceXla);
REGISTER_XLA_OP(Name("RingGroupedAllreduce").Device(kXlaDevices), RingGroupedAllreduceXla);
REGISTER_XLA_OP(Name("RingAllgather").Device(kXlaDevices), RingAllgatherXla);
REGISTER_XLA_OP(Name("RingBroadcast").Device(kXlaDevices), RingBroadcastXla);
REGISTER_XLA_OP(Name("RingReducescatter").Device(kXlaDevices), RingReducescatterXla);

}  // namespace
}  // namespace tf
}  // namespace tfring
