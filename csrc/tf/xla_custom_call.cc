// The XLA custom-call targets behind the ops' XLA kernels (xla_ops.cc): typed
// FFI handlers registered with the XLA FFI registry of the TensorFlow binary
// (XLA_FFI_GetApi, exported by libtensorflow_framework) for platform "Host",
// and for "CUDA" in builds with the GPU kernels (TFRING_TF_GPU).
//
// Each handler turns its buffers into runtime::Requests named by the
// `tensor_name` attribute and hands them to the engine in one batch, like
// the TF kernels do (adapter.cc), so a grouped allreduce is fused whole.
//
// Host: asynchronous. The handler returns an ffi::Future and the XLA:CPU
// runtime goes on with independent work meanwhile, so no XLA thread waits on
// the network and several collectives of one step can be in flight together
// in whatever order XLA's threads reach them (no rank can deadlock another
// by blocking its threads on a different collective). XLA:CPU runs small
// programs (<= 8 thunks, or buffers <= 512 bytes) one thunk at a time and
// waits for each future: there the calls go in the schedule's order.
// Completion never runs XLA code on a thread that holds the engine: if the
// requests finished before the handler returned (every rank was ready and
// tryDrive ran them), the future is returned complete; otherwise a
// completer thread fulfils it.
//
// CUDA: XLA:GPU runs custom calls on its host thread in program order. The
// handler hands the engine XLA's stream (the input is read after the work
// queued on it) and drives the engine until the output is complete on the
// device (runtime.h's stream contract), then returns; XLA's later kernels on
// that stream see the result. With TFRING_GPU_COMPLETION=stream the handler
// returns once it has submitted, and a stream gate holds XLA's later
// kernels until the engine is done (stream_completion.h). Program order can
// differ by rank (autotuning changes the module), so there the XLA kernels
// chain the calls through an extra s32[] operand and result (xla_ops.cc);
// `ordered = 1` says a call has them, and the handlers leave them alone.
//
// Errors reach TensorFlow with the engine's code: a shape that differs by
// rank fails with FailedPreconditionError and the same message as without
// XLA, on every rank.
#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "xla/ffi/api/ffi.h"

#include "common/status.h"
#include "common/types.h"
#include "runtime/stream_completion.h"
#include "runtime/runtime.h"

namespace tfring {
namespace tf {
namespace {

namespace ffi = ::xla::ffi;

bool toRingDataType(ffi::DataType in, DataType* out) {
  switch (in) {
    case ffi::DataType::F16: *out = DataType::kFloat16; return true;
    case ffi::DataType::BF16: *out = DataType::kBFloat16; return true;
    case ffi::DataType::F32: *out = DataType::kFloat32; return true;
    case ffi::DataType::F64: *out = DataType::kFloat64; return true;
    case ffi::DataType::S32: *out = DataType::kInt32; return true;
    case ffi::DataType::S64: *out = DataType::kInt64; return true;
    case ffi::DataType::U8: *out = DataType::kUInt8; return true;
    case ffi::DataType::S8: *out = DataType::kInt8; return true;
    case ffi::DataType::S16: *out = DataType::kInt16; return true;
    case ffi::DataType::U16: *out = DataType::kUInt16; return true;
    case ffi::DataType::PRED: *out = DataType::kBool; return true;
    default: return false;
  }
}

// The same codes the TF kernels report (adapter.cc, toTfStatus).
ffi::Error toFfiError(const Status& s) {
  ffi::ErrorCode code;
  switch (s.code()) {
    case Code::kOk: return ffi::Error::Success();
    case Code::kInvalidArgument: code = ffi::ErrorCode::kInvalidArgument; break;
    case Code::kMismatch: code = ffi::ErrorCode::kFailedPrecondition; break;
    case Code::kTimeout: code = ffi::ErrorCode::kDeadlineExceeded; break;
    case Code::kPeerFailure: code = ffi::ErrorCode::kUnavailable; break;
    case Code::kAborted: code = ffi::ErrorCode::kAborted; break;
    case Code::kUnavailable: code = ffi::ErrorCode::kUnimplemented; break;
    case Code::kInternal: code = ffi::ErrorCode::kInternal; break;
    default: code = ffi::ErrorCode::kUnknown; break;
  }
  return ffi::Error(code, s.message());
}

std::vector<int64_t> dimsOf(const ffi::AnyBuffer& b) {
  auto d = b.dimensions();
  return std::vector<int64_t>(d.begin(), d.end());
}

// What the XLA kernel put in the custom call's attributes (xla_ops.cc).
struct Attrs {
  std::string name;
  ReduceOp op = ReduceOp::kSum;
  double prescale = 1.0;
  double postscale = 1.0;
  int root = 0;
};

// Fills a request's common fields from one argument/result pair; false with
// *err set for a dtype the core does not handle.
bool fill(CollectiveType type, const Attrs& a, const std::string& name,
          const ffi::AnyBuffer& in, void* out, runtime::Request* req, Status* err) {
  req->name = name;
  req->type = type;
  if (!toRingDataType(in.element_type(), &req->dtype)) {
    *err = Status(Code::kInvalidArgument,
                  strCat("tfring: ", collectiveName(type), " of tensor '", name,
                         "' under XLA does not support XLA element type ",
                         static_cast<int>(in.element_type())));
    return false;
  }
  req->shape = dimsOf(in);
  req->input = in.untyped_data();
  req->output = out;
  req->op = a.op;
  req->prescale = a.prescale;
  req->postscale = a.postscale;
  req->root = a.root;
  return true;
}

// Allgather under XLA has a static output of size * dim0 rows, so every
// rank must bring the same first dimension. The request's shape gets a
// leading 1: the coordinator then compares dim0 like any other dimension and
// a rank with other rows fails the collective on every rank with a
// MismatchError, before any data moves.
void allgatherShape(runtime::Request* req) { req->shape.insert(req->shape.begin(), 1); }

Status withAllgatherHint(const Status& s) {
  if (s.code() != Code::kMismatch) return s;
  return Status(s.code(),
                strCat(s.message(), ". Under XLA (jit_compile) allgather needs the same first "
                       "dimension on every rank, since XLA fixes the output shape when it "
                       "compiles; the shapes above carry a leading 1 for that check. Gather "
                       "tensors whose first dimension differs by rank outside the "
                       "jit-compiled function"));
}

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

// ------------------------------------------------------------- host ----

// One custom call's requests on their way through the engine.
struct Pending {
  enum Phase { kSubmitting, kReturned, kFinished };
  explicit Pending(int n, bool allgather) : left(n), allgather(allgather) {}

  std::atomic<int> left;
  std::atomic<int> phase{kSubmitting};
  const bool allgather;
  std::mutex mu;
  Status first_error;
  ffi::Promise promise;

  void record(const Status& s) {
    if (s.ok()) return;
    std::lock_guard<std::mutex> lk(mu);
    if (first_error.ok()) first_error = allgather ? withAllgatherHint(s) : s;
  }
  void fulfil() {
    Status s;
    {
      std::lock_guard<std::mutex> lk(mu);
      s = first_error;
    }
    if (s.ok())
      promise.SetAvailable();
    else
      promise.SetError(toFfiError(s));
  }
};

// Fulfils promises off the engine's threads: an XLA continuation attached to
// a future may run on the thread that completes it.
class Completer {
 public:
  static Completer& get() {
    static Completer* c = new Completer();  // never destroyed: exit order
    return *c;
  }
  void post(std::shared_ptr<Pending> p) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      queue_.push_back(std::move(p));
    }
    cv_.notify_one();
  }

 private:
  Completer() { std::thread([this] { loop(); }).detach(); }
  void loop() {
    for (;;) {
      std::shared_ptr<Pending> p;
      {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [this] { return !queue_.empty(); });
        p = std::move(queue_.front());
        queue_.pop_front();
      }
      p->fulfil();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Pending>> queue_;
};

// Submits the requests and returns the future XLA waits on.
ffi::Future submitAsync(std::vector<runtime::Request> reqs, bool allgather) {
  const int n = static_cast<int>(reqs.size());
  auto p = std::make_shared<Pending>(n, allgather);
  ffi::Future future(p->promise);
  Completer::get();  // started before any request can finish
  std::vector<runtime::DoneCallback> cbs;
  cbs.reserve(n);
  for (int i = 0; i < n; ++i) {
    cbs.push_back([p](const Status& s) {
      p->record(s);
      if (p->left.fetch_sub(1) != 1) return;
      int expected = Pending::kSubmitting;
      if (p->phase.compare_exchange_strong(expected, Pending::kFinished)) return;
      Completer::get().post(p);  // the handler has returned already
    });
  }
  Status s = n ? enqueueNoThrow(std::move(reqs), std::move(cbs)) : Status::OK();
  if (!s.ok()) {  // refused: no callback will come
    p->record(s);
    p->fulfil();
    return future;
  }
  if (n == 0) {
    p->fulfil();
    return future;
  }
  try {
    runtime::tryDrive();  // every rank ready: the collective runs here
  } catch (...) {
  }
  int expected = Pending::kSubmitting;
  if (!p->phase.compare_exchange_strong(expected, Pending::kReturned))
    p->fulfil();  // finished inside tryDrive (or size 1): complete at once
  return future;
}

Attrs reduceAttrs(std::string_view name, int32_t op, double pre, double post) {
  Attrs a;
  a.name = std::string(name);
  a.op = static_cast<ReduceOp>(op);
  a.prescale = pre;
  a.postscale = post;
  return a;
}

// The collective's buffers: every argument/result pair but a chained
// call's last, its order value (xla_ops.cc).
size_t dataPairs(const ffi::RemainingArgs& args, int32_t ordered) {
  return args.size() > 0 && ordered ? args.size() - 1 : args.size();
}

// One allreduce request per buffer pair (a grouped op names them
// "<name>.<i>"), for the host and the GPU targets alike.
Status allreduceRequests(const Attrs& a, ffi::RemainingArgs args, ffi::RemainingRets rets,
                         int32_t grouped, int32_t ordered,
                         std::vector<runtime::Request>* reqs) {
  const size_t n = dataPairs(args, ordered);
  reqs->resize(n);
  for (size_t i = 0; i < n; ++i) {
    auto in = args.get<ffi::AnyBuffer>(i);
    auto out = rets.get<ffi::AnyBuffer>(i);
    if (!in.has_value() || !out.has_value())
      return Status(Code::kInternal, strCat("tfring: allreduce of tensor '", a.name,
                                            "': XLA passed no buffer ", i));
    std::string req_name = grouped ? strCat(a.name, ".", i) : a.name;
    Status err;
    if (!fill(CollectiveType::kAllreduce, a, req_name, *in, (*out)->untyped_data(),
              &(*reqs)[i], &err))
      return err;
  }
  return Status();
}

// The one request of an allgather, broadcast or reducescatter.
Status oneRequest(CollectiveType type, const Attrs& a, ffi::RemainingArgs args,
                  ffi::RemainingRets rets, int32_t ordered, runtime::Request* req) {
  auto in = args.get<ffi::AnyBuffer>(0);
  auto out = rets.get<ffi::AnyBuffer>(0);
  if (dataPairs(args, ordered) != 1 || !in.has_value() || !out.has_value())
    return Status(Code::kInternal, strCat("tfring: ", collectiveName(type), " of tensor '",
                                          a.name, "': XLA passed ", args.size(),
                                          " buffers, not one"));
  Status err;
  if (!fill(type, a, a.name, *in, (*out)->untyped_data(), req, &err)) return err;
  if (type == CollectiveType::kAllgather) allgatherShape(req);
  return Status();
}

ffi::Future failed(const Status& s) {
  ffi::Promise p;
  ffi::Future f(p);
  p.SetError(toFfiError(s));
  return f;
}

// A grouped allreduce of one dtype (host or GPU) is one request with a part
// per buffer pair, named "<name>", as the TF kernel makes it
// (kernels.cc, runtime::Request::parts): ranks with and without XLA then
// submit the same request, and the engine handles the group as one tensor.
bool asParts(std::string_view name, std::vector<runtime::Request>* reqs) {
  if (reqs->empty()) return false;
  for (const auto& r : *reqs)
    if (r.dtype != (*reqs)[0].dtype) return false;
  runtime::Request one = (*reqs)[0];
  one.name = std::string(name);
  std::vector<runtime::Request::Part> parts;
  std::vector<std::vector<int64_t>> shapes;
  for (const auto& r : *reqs) {
    int64_t count = 1;
    for (auto d : r.shape) count *= d;
    parts.push_back({r.input, r.output, count});
    shapes.push_back(r.shape);
  }
  runtime::setParts(&one, std::move(parts), shapes);
  reqs->assign(1, std::move(one));
  return true;
}

ffi::Future hostAllreduce(ffi::RemainingArgs args, ffi::RemainingRets rets,
                          std::string_view name, int32_t op, double pre, double post,
                          int32_t grouped, int32_t ordered) {
  std::vector<runtime::Request> reqs;
  Status err = allreduceRequests(reduceAttrs(name, op, pre, post), args, rets, grouped,
                                 ordered, &reqs);
  if (!err.ok()) return failed(err);
  if (grouped) asParts(name, &reqs);
  return submitAsync(std::move(reqs), false);
}

ffi::Future hostOne(CollectiveType type, const Attrs& a, ffi::RemainingArgs args,
                    ffi::RemainingRets rets, int32_t ordered) {
  std::vector<runtime::Request> reqs(1);
  Status err = oneRequest(type, a, args, rets, ordered, &reqs[0]);
  if (!err.ok()) return failed(err);
  return submitAsync(std::move(reqs), type == CollectiveType::kAllgather);
}

ffi::Future hostAllgather(ffi::RemainingArgs args, ffi::RemainingRets rets,
                          std::string_view name, int32_t ordered) {
  Attrs a;
  a.name = std::string(name);
  return hostOne(CollectiveType::kAllgather, a, args, rets, ordered);
}

ffi::Future hostBroadcast(ffi::RemainingArgs args, ffi::RemainingRets rets,
                          std::string_view name, int32_t root, int32_t ordered) {
  Attrs a;
  a.name = std::string(name);
  a.root = root;
  return hostOne(CollectiveType::kBroadcast, a, args, rets, ordered);
}

ffi::Future hostReducescatter(ffi::RemainingArgs args, ffi::RemainingRets rets,
                              std::string_view name, int32_t op, double pre, double post,
                              int32_t ordered) {
  return hostOne(CollectiveType::kReducescatter, reduceAttrs(name, op, pre, post), args,
                 rets, ordered);
}

XLA_FFI_DEFINE_HANDLER(kHostAllreduce, hostAllreduce,
                       ffi::Ffi::Bind()
                           .RemainingArgs()
                           .RemainingRets()
                           .Attr<std::string_view>("tensor_name")
                           .Attr<int32_t>("reduce_op")
                           .Attr<double>("prescale")
                           .Attr<double>("postscale")
                           .Attr<int32_t>("grouped")
                           .Attr<int32_t>("ordered"));
XLA_FFI_DEFINE_HANDLER(kHostAllgather, hostAllgather,
                       ffi::Ffi::Bind()
                           .RemainingArgs()
                           .RemainingRets()
                           .Attr<std::string_view>("tensor_name")
                           .Attr<int32_t>("ordered"));
XLA_FFI_DEFINE_HANDLER(kHostBroadcast, hostBroadcast,
                       ffi::Ffi::Bind()
                           .RemainingArgs()
                           .RemainingRets()
                           .Attr<std::string_view>("tensor_name")
                           .Attr<int32_t>("root")
                           .Attr<int32_t>("ordered"));
XLA_FFI_DEFINE_HANDLER(kHostReducescatter, hostReducescatter,
                       ffi::Ffi::Bind()
                           .RemainingArgs()
                           .RemainingRets()
                           .Attr<std::string_view>("tensor_name")
                           .Attr<int32_t>("reduce_op")
                           .Attr<double>("prescale")
                           .Attr<double>("postscale")
                           .Attr<int32_t>("ordered"));

XLA_FFI_REGISTER_HANDLER(XLA_FFI_GetApi(), "tfring_allreduce", "Host", kHostAllreduce);
XLA_FFI_REGISTER_HANDLER(XLA_FFI_GetApi(), "tfring_allgather", "Host", kHostAllgather);
XLA_FFI_REGISTER_HANDLER(XLA_FFI_GetApi(), "tfring_broadcast", "Host", kHostBroadcast);
XLA_FFI_REGISTER_HANDLER(XLA_FFI_GetApi(), "tfring_reducescatter", "Host",
                         kHostReducescatter);

// -------------------------------------------------------------- CUDA ----
#if TFRING_TF_GPU

struct CUstream_st;  // cudaStream_t, without CUDA headers

// Submits with XLA's stream and drives the engine until every request is
// done (the outputs are then complete on the device).
ffi::Error submitBlocking(std::vector<runtime::Request> reqs, bool allgather) {
  const int n = static_cast<int>(reqs.size());
  struct State {
    std::atomic<int> left;
    std::mutex mu;
    Status first;
  };
  auto st = std::make_shared<State>();
  st->left = n;
  std::vector<runtime::DoneCallback> cbs;
  for (int i = 0; i < n; ++i)
    cbs.push_back([st](const Status& s) {
      if (!s.ok()) {
        std::lock_guard<std::mutex> lk(st->mu);
        if (st->first.ok()) st->first = s;
      }
      st->left.fetch_sub(1);
    });
  Status s = n ? enqueueNoThrow(std::move(reqs), std::move(cbs)) : Status::OK();
  if (!s.ok()) return toFfiError(allgather ? withAllgatherHint(s) : s);
  try {
    runtime::drive([st] { return st->left.load() == 0; },
                   [] { std::this_thread::sleep_for(std::chrono::microseconds(20)); });
  } catch (const Error& e) {
    return toFfiError(e.status());
  }
  std::lock_guard<std::mutex> lk(st->mu);
  return toFfiError(allgather ? withAllgatherHint(st->first) : st->first);
}

// TFRING_GPU_COMPLETION=stream (stream_completion.h): returns once the
// requests are submitted, with a gate on XLA's stream that holds the
// program's later kernels until the engine is done, so XLA's host thread
// goes on queueing them (and the next step) meanwhile. Otherwise blocks.
ffi::Error submitOnGpu(std::vector<runtime::Request> reqs, bool allgather, int32_t device,
                       CUstream_st* stream) {
  for (auto& r : reqs) {
    r.device = device;
    r.stream = stream;
  }
  if (reqs.empty() || !runtime::streamCompletion(device))
    return submitBlocking(std::move(reqs), allgather);
  Status s = runtime::submitGated(std::move(reqs), device, stream);
  return toFfiError(allgather ? withAllgatherHint(s) : s);
}

ffi::Error gpuAllreduce(CUstream_st* stream, int32_t device, ffi::RemainingArgs args,
                        ffi::RemainingRets rets, std::string_view name, int32_t op,
                        double pre, double post, int32_t grouped, int32_t ordered) {
  std::vector<runtime::Request> reqs;
  Status err = allreduceRequests(reduceAttrs(name, op, pre, post), args, rets, grouped,
                                 ordered, &reqs);
  if (!err.ok()) return toFfiError(err);
  if (grouped) asParts(name, &reqs);
  return submitOnGpu(std::move(reqs), false, device, stream);
}

ffi::Error gpuOne(CollectiveType type, CUstream_st* stream, int32_t device, const Attrs& a,
                  ffi::RemainingArgs args, ffi::RemainingRets rets, int32_t ordered) {
  std::vector<runtime::Request> reqs(1);
  Status err = oneRequest(type, a, args, rets, ordered, &reqs[0]);
  if (!err.ok()) return toFfiError(err);
  return submitOnGpu(std::move(reqs), type == CollectiveType::kAllgather, device, stream);
}

ffi::Error gpuAllgather(CUstream_st* stream, int32_t device, ffi::RemainingArgs args,
                        ffi::RemainingRets rets, std::string_view name, int32_t ordered) {
  Attrs a;
  a.name = std::string(name);
  return gpuOne(CollectiveType::kAllgather, stream, device, a, args, rets, ordered);
}

ffi::Error gpuBroadcast(CUstream_st* stream, int32_t device, ffi::RemainingArgs args,
                        ffi::RemainingRets rets, std::string_view name, int32_t root,
                        int32_t ordered) {
  Attrs a;
  a.name = std::string(name);
  a.root = root;
  return gpuOne(CollectiveType::kBroadcast, stream, device, a, args, rets, ordered);
}

ffi::Error gpuReducescatter(CUstream_st* stream, int32_t device, ffi::RemainingArgs args,
                            ffi::RemainingRets rets, std::string_view name, int32_t op,
                            double pre, double post, int32_t ordered) {
  return gpuOne(CollectiveType::kReducescatter, stream, device,
                reduceAttrs(name, op, pre, post), args, rets, ordered);
}

#define TFRING_GPU_BIND \
  ffi::Ffi::Bind().Ctx<ffi::PlatformStream<CUstream_st*>>().Ctx<ffi::DeviceOrdinal>()

XLA_FFI_DEFINE_HANDLER(kGpuAllreduce, gpuAllreduce,
                       TFRING_GPU_BIND.RemainingArgs()
                           .RemainingRets()
                           .Attr<std::string_view>("tensor_name")
                           .Attr<int32_t>("reduce_op")
                           .Attr<double>("prescale")
                           .Attr<double>("postscale")
                           .Attr<int32_t>("grouped")
                           .Attr<int32_t>("ordered"));
XLA_FFI_DEFINE_HANDLER(kGpuAllgather, gpuAllgather,
                       TFRING_GPU_BIND.RemainingArgs()
                           .RemainingRets()
                           .Attr<std::string_view>("tensor_name")
                           .Attr<int32_t>("ordered"));
XLA_FFI_DEFINE_HANDLER(kGpuBroadcast, gpuBroadcast,
                       TFRING_GPU_BIND.RemainingArgs()
                           .RemainingRets()
                           .Attr<std::string_view>("tensor_name")
                           .Attr<int32_t>("root")
                           .Attr<int32_t>("ordered"));
XLA_FFI_DEFINE_HANDLER(kGpuReducescatter, gpuReducescatter,
                       TFRING_GPU_BIND.RemainingArgs()
                           .RemainingRets()
                           .Attr<std::string_view>("tensor_name")
                           .Attr<int32_t>("reduce_op")
                           .Attr<double>("prescale")
                           .Attr<double>("postscale")
                           .Attr<int32_t>("ordered"));

XLA_FFI_REGISTER_HANDLER(XLA_FFI_GetApi(), "tfring_allreduce", "CUDA", kGpuAllreduce);
XLA_FFI_REGISTER_HANDLER(XLA_FFI_GetApi(), "tfring_allgather", "CUDA", kGpuAllgather);
XLA_FFI_REGISTER_HANDLER(XLA_FFI_GetApi(), "tfring_broadcast", "CUDA", kGpuBroadcast);
XLA_FFI_REGISTER_HANDLER(XLA_FFI_GetApi(), "tfring_reducescatter", "CUDA",
                         kGpuReducescatter);

#endif  // TFRING_TF_GPU

}  // namespace
}  // namespace tf
}  // namespace tfring
