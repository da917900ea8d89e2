#include "tf/adapter.h"

#include <atomic>
#include <exception>
#include <memory>
#include <mutex>
#include <utility>

#include "tensorflow/core/framework/device_base.h"
#include "xla/stream_executor/event.h"
#include "xla/stream_executor/stream.h"
#include "xla/stream_executor/stream_executor.h"

#include "runtime/stream_completion.h"

namespace tfring {
namespace tf {

namespace tfw = ::tensorflow;
namespace se = ::stream_executor;
using AsyncOpKernelDone = tfw::AsyncOpKernel::DoneCallback;

bool toRingDataType(tfw::DataType in, DataType* out) {
  switch (in) {
    case tfw::DT_HALF: *out = DataType::kFloat16; return true;
    case tfw::DT_BFLOAT16: *out = DataType::kBFloat16; return true;
    case tfw::DT_FLOAT: *out = DataType::kFloat32; return true;
    case tfw::DT_DOUBLE: *out = DataType::kFloat64; return true;
    case tfw::DT_INT32: *out = DataType::kInt32; return true;
    case tfw::DT_INT64: *out = DataType::kInt64; return true;
    case tfw::DT_UINT8: *out = DataType::kUInt8; return true;
    case tfw::DT_INT8: *out = DataType::kInt8; return true;
    case tfw::DT_BOOL: *out = DataType::kBool; return true;
    case tfw::DT_INT16: *out = DataType::kInt16; return true;
    case tfw::DT_UINT16: *out = DataType::kUInt16; return true;
    default: return false;
  }
}

absl::Status toTfStatus(const Status& s) {
  using absl::StatusCode;
  StatusCode code;
  switch (s.code()) {
    case Code::kOk: return absl::OkStatus();
    case Code::kInvalidArgument: code = StatusCode::kInvalidArgument; break;
    case Code::kMismatch: code = StatusCode::kFailedPrecondition; break;
    case Code::kTimeout: code = StatusCode::kDeadlineExceeded; break;
    case Code::kPeerFailure: code = StatusCode::kUnavailable; break;
    case Code::kAborted: code = StatusCode::kAborted; break;
    case Code::kUnavailable: code = StatusCode::kUnimplemented; break;
    case Code::kInternal: code = StatusCode::kInternal; break;
    default: code = StatusCode::kUnknown; break;
  }
  return absl::Status(code, s.message());
}

Status fromTfStatus(const absl::Status& s) {
  if (s.ok()) return Status::OK();
  return Status(Code::kInternal, std::string(s.message()));
}

std::vector<int64_t> dimsOf(const tfw::TensorShape& shape) {
  std::vector<int64_t> dims(shape.dims());
  for (int i = 0; i < shape.dims(); ++i) dims[i] = shape.dim_size(i);
  return dims;
}

namespace {

// TF's stream for the op in ctx (its GPU device context); null on host.
se::Stream* opStream(tfw::OpKernelContext* ctx) {
  tfw::DeviceContext* dc = ctx->op_device_context();
  return dc ? dc->stream() : nullptr;
}

// Blocks the calling thread until `stream` has run what was queued on it so
// far: an event recorded now and waited for, so work TF queues later is not
// waited for; the whole stream where the platform has no such event.
absl::Status waitForQueuedWork(se::Stream* stream) {
  auto event = stream->parent()->CreateEvent();
  if (event.ok()) {
    absl::Status s = stream->RecordEvent(event->get());
    if (s.ok()) s = (*event)->Synchronize();
    if (!absl::IsUnimplemented(s)) return s;
  }
  return stream->BlockHostUntilDone();
}

}  // namespace

RingOpKernel::RingOpKernel(tfw::OpKernelConstruction* c, CollectiveType type)
    : AsyncOpKernel(c),
      type_(type),
      on_gpu_(c->device_type() == tfw::DeviceType(tfw::DEVICE_GPU)) {
  OP_REQUIRES_OK(c, c->GetAttr("tensor_name", &tensor_name_));
  if (tensor_name_.empty()) tensor_name_ = name();
  // Graphs saved before the attribute existed have none: the world.
  if (c->HasAttr("process_set_id"))
    OP_REQUIRES_OK(c, c->GetAttr("process_set_id", &process_set_));
}

bool RingOpKernel::prepare(tfw::OpKernelContext* ctx, runtime::Request* req,
                           int index, const std::string& name_suffix) {
  const tfw::Tensor& input = ctx->input(index);
  req->name = tensor_name_ + name_suffix;
  req->type = type_;
  req->process_set = process_set_;
  if (!toRingDataType(input.dtype(), &req->dtype)) {
    ctx->SetStatus(absl::InvalidArgumentError(
        tfring::strCat("tfring: ", collectiveName(type_), " of tensor '",
                       req->name, "' does not support dtype ",
                       tfw::DataTypeString(input.dtype()))));
    return false;
  }
  req->shape = dimsOf(input.shape());
  req->input = dataOf(input);
  if (on_gpu_) {
    se::Stream* stream = opStream(ctx);
    if (!stream) {
      ctx->SetStatus(absl::InternalError(tfring::strCat(
          "tfring: ", collectiveName(type_), " of tensor '", req->name,
          "' runs on ", ctx->device()->name(),
          " but TensorFlow gave the op no GPU stream")));
      return false;
    }
    // The engine reads the input after the work already queued on TF's
    // stream (it records an event there in enqueue) and calls done once the
    // output is complete on the device, which is all TF's later ops on that
    // stream need: nothing here waits for the GPU.
    req->device = stream->parent()->device_ordinal();
    req->stream = stream->platform_specific_handle().stream;
  }
  return true;
}

namespace {

// Counts down the requests of one op; the last to finish reports to TF.
// One extra count belongs to the submitting thread, so `done` cannot run
// while requests are still being enqueued.
class Countdown {
 public:
  Countdown(tfw::OpKernelContext* ctx, int count, AsyncOpKernelDone done)
      : ctx_(ctx), pending_(count), done_(std::move(done)) {}

  void finish(const Status& s) {
    if (!s.ok()) {
      std::lock_guard<std::mutex> lock(mu_);
      if (first_error_.ok()) first_error_ = s;
    }
    if (pending_.fetch_sub(1) == 1) {
      if (!first_error_.ok()) ctx_->SetStatus(toTfStatus(first_error_));
      auto done = std::move(done_);
      done();
    }
  }

 private:
  tfw::OpKernelContext* ctx_;
  std::atomic<int> pending_;
  AsyncOpKernelDone done_;
  std::mutex mu_;
  Status first_error_;
};

Status enqueueNoThrow(std::vector<runtime::Request> reqs,
                      std::vector<runtime::DoneCallback> cbs) {
  try {
    return runtime::enqueueBatch(std::move(reqs), std::move(cbs));
  } catch (const Error& e) {
    return e.status();
  } catch (const std::exception& e) {
    return Status(Code::kInternal, e.what());
  }
}

}  // namespace

// TFRING_GPU_COMPLETION=stream gates XLA's GPU calls only
// (runtime/stream_completion.h). A TF op's GPU input may be produced behind such a
// gate, so it is submitted once the gated call is done: taken first, or
// fused with it, it would wait on the gate it is to open. The TF kernels
// themselves complete on the host: the TF executor may run two of them in
// different orders on different ranks, and a gate between them would then
// deadlock the ranks.
void RingOpKernel::afterGatedSubmissions(const std::vector<runtime::Request>& reqs) {
  if (!reqs.empty() && reqs[0].device >= 0 && runtime::streamCompletion(reqs[0].device))
    runtime::waitForGatedSubmissions();
}

void RingOpKernel::submit(tfw::OpKernelContext* ctx,
                          std::vector<runtime::Request> reqs,
                          DoneCallback done) {
  afterGatedSubmissions(reqs);
  const int n = static_cast<int>(reqs.size());
  const int process_set = n > 0 ? reqs[0].process_set : 0;
  auto countdown = std::make_shared<Countdown>(ctx, n + 1, std::move(done));
  // One batch: a grouped allreduce lands in one round and is fused whole.
  std::vector<runtime::DoneCallback> cbs;
  cbs.reserve(n);
  for (int i = 0; i < n; ++i)
    cbs.push_back([countdown](const Status& st) { countdown->finish(st); });
  Status s = enqueueNoThrow(std::move(reqs), std::move(cbs));
  if (!s.ok()) {
    // Refused: enqueue calls back for none of them.
    for (int j = 0; j < n; ++j) countdown->finish(s);
  } else {
    // If every rank is ready, the collective runs right here instead of
    // after a wake-up of the engine thread.
    try {
      runtime::tryDrive(process_set);
    } catch (...) {
    }
  }
  countdown->finish(Status::OK());
}

runtime::Allocator RingOpKernel::outputAllocator(
    tfw::OpKernelContext* ctx) const {
  const bool on_gpu = on_gpu_;
  return [ctx, on_gpu](const std::vector<int64_t>& dims,
                       void** data) -> Status {
    tfw::TensorShape shape;
    absl::Status s = tfw::TensorShape::BuildTensorShape(dims, &shape);
    tfw::Tensor* out = nullptr;
    if (s.ok()) s = ctx->allocate_output(0, shape, &out);
    // TF's GPU allocator hands out memory as soon as its last user has
    // queued its kernels on TF's stream, which may not have run yet; the
    // engine writes from its own stream, so it waits for them first. This
    // blocks the engine thread (allgather and reducescatter only), never
    // TF's.
    if (s.ok() && on_gpu && out->NumElements() > 0)
      s = waitForQueuedWork(opStream(ctx));
    if (!s.ok()) return fromTfStatus(s);
    *data = dataOf(*out);
    return Status::OK();
  };
}

}  // namespace tf
}  // namespace tfring
