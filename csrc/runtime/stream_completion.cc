// Stream-ordered completion: see stream_completion.h.
#include "runtime/stream_completion.h"

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <map>
#include <string>
#include <thread>
#include <utility>

#include "common/logging.h"
#include "common/tunables.h"
#include "gpu/device.h"
#include "runtime/comm.h"
#include "runtime/engine.h"
#include "runtime/registry.h"

namespace tfring {
namespace runtime {

namespace {

// Keeps `s` as the communicator's first stream-completed failure (`gs`
// null: the communicator is gone, nothing left to fail).
void recordError(GatedState* gs, const Status& s) {
  if (!gs) return;
  std::lock_guard<std::mutex> lk(gs->mu);
  if (!gs->error.ok()) return;
  gs->error = Status(s.code(),
                     strCat(s.message(), " (this collective completed on its GPU stream "
                                         "[TFRING_GPU_COMPLETION=stream] before it failed: "
                                         "the outputs of the step that ran it are not valid)"));
  TFRING_LOG(kError, gs->error.message());
}

// The stream-completion state of communicator `process_set`; null when
// there is none.
std::shared_ptr<GatedState> gatedStateOf(int process_set) {
  std::shared_ptr<Comm> c = Registry::get().find(process_set);
  return c ? c->gated : nullptr;
}

}  // namespace

bool streamCompletion(int device) {
  static const bool wanted = [] {
    // Read once, maybe before init (which rejects a bad value): here a bad
    // value is a warning.
    try {
      return tunables::getString("TFRING_GPU_COMPLETION") == "stream";
    } catch (const Error& e) {
      TFRING_LOG(kWarning, e.status().message(), "; using host");
      return false;
    }
  }();
  if (!wanted) return false;
  static std::once_flag once;
  static bool ok = false;
  std::call_once(once, [device] {
    std::string why;
    ok = gpu::streamGatesSupported(device, &why);
    if (ok)
      TFRING_LOG(kWarning, "TFRING_GPU_COMPLETION=stream is experimental: on an H200 under "
                           "MPS, gated collectives timed out with it at 2 ranks, in XLA "
                           "programs and in tfring's own stream-completion tests, before "
                           "tfring checked that a gate does not hold back its own stream "
                           "(docs/gpu-tensorflow.md)");
    if (!ok)
      TFRING_LOG(kWarning, "TFRING_GPU_COMPLETION=stream: ", why,
                 "; GPU collectives complete on the host instead");
  });
  return ok;
}

Status streamCompletionError(int process_set) {
  std::shared_ptr<GatedState> gs = gatedStateOf(process_set);
  if (!gs) return Status::OK();
  std::lock_guard<std::mutex> lk(gs->mu);
  return gs->error;
}

struct GatedSubmission::State {
  std::atomic<int> left{0};
  std::mutex mu;
  Status first;
  bool finished = false;
  // Waited for on the host from the start: its error is the call's own,
  // not one to fail later calls with.
  bool on_host = false;
  std::shared_ptr<gpu::StreamGate> gate;
  // The communicator the requests run on: its engine is the one driven
  // while waiting, its state keeps a failure.
  int process_set = 0;
  std::shared_ptr<GatedState> comm;
};

namespace {

// The last gated submission. A later submission's inputs are produced
// behind its gate on the same stream, so the engine must not take them
// first, nor fuse them with it: that would wait on the gate it is to open.
// One gated submission in flight per process rules it out (in an XLA step
// there is one call, so this rarely waits).
// Process-wide: one stream carries every set's calls, so a set's gate holds the next's inputs.
std::mutex g_last_mu;
std::shared_ptr<GatedSubmission::State> g_last;

// True once `type` has been submitted before on the communicator whose
// state is `gs`; marks it. The first of each completes on the host: it may
// set up the GPU backend (the executor, NCCL's communicator and its lazily
// made connections, the calibration), and set-up may synchronize the
// device, which would wait forever on a stream held by its own gate. Every
// rank makes the same calls in the same order, so every rank waits on the
// same ones.
bool warmedUp(GatedState* gs, CollectiveType type) {
  if (!gs) return false;
  std::lock_guard<std::mutex> lk(gs->mu);
  return !gs->warm.insert(static_cast<int>(type)).second;
}

// How long the check below gives the engine's stream to run its probe while
// the caller's stream is gated: microseconds when they are independent.
constexpr double kHoldCheckSeconds = 0.5;

// Whether a gate on `stream` leaves communicator `process_set`'s own GPU
// stream free to run (gpu::gateHoldsBack), checked once per pair of
// streams. Where the two share a hardware work queue, the engine's kernels
// and copies would wait behind the gate that waits for them: collectives on
// such a stream complete on the host instead. Before the communicator's
// first GPU collective there is no engine stream to check (false: on the
// host this time).
bool gateLeavesEngineFree(int process_set, int device, void* stream) {
  std::shared_ptr<Comm> c = Registry::get().find(process_set);
  void* engine = c && c->engine ? c->engine->gpuStream() : nullptr;
  if (!engine) return false;
  static std::mutex mu;
  static std::map<std::pair<void*, void*>, bool> checked;
  std::lock_guard<std::mutex> lk(mu);
  const auto key = std::make_pair(stream, engine);
  auto it = checked.find(key);
  if (it != checked.end()) return it->second;
  std::string why;
  bool held;
  try {
    held = gpu::gateHoldsBack(device, stream, engine, kHoldCheckSeconds, &why);
  } catch (const Error& e) {
    held = true;
    why = e.status().message();
  }
  static bool warned = false;  // once per process: every later check finds the same
  if (held && !warned) {
    warned = true;
    const std::string conn = tunables::foreignEnv("CUDA_DEVICE_MAX_CONNECTIONS");
    TFRING_LOG(kWarning, "TFRING_GPU_COMPLETION=stream: ",
               why.empty() ? strCat("tfring's GPU stream on GPU ", device,
                                    " waits behind a gate on the caller's stream (the two "
                                    "share one of the GPU's hardware work queues; "
                                    "CUDA_DEVICE_MAX_CONNECTIONS=", conn.empty() ? "unset" : conn,
                                    ", and under MPS the driver may grant fewer)")
                           : strCat("checking the caller's stream on GPU ", device, ": ", why),
               "; collectives on that stream complete on the host instead");
  }
  checked[key] = !held;
  return !held;
}

// Lends this thread to the engine until every request of `st` is done.
void driveUntilDone(const std::shared_ptr<GatedSubmission::State>& st) {
  if (st->left.load() == 0) return;
  drive([st] { return st->left.load() == 0; },
        [] { std::this_thread::sleep_for(std::chrono::microseconds(20)); }, st->process_set);
}

}  // namespace

void waitForGatedSubmissions() {
  std::shared_ptr<GatedSubmission::State> last;
  {
    std::lock_guard<std::mutex> lk(g_last_mu);
    last = g_last;
  }
  if (last) driveUntilDone(last);
}

void resetStreamCompletion() {
  std::lock_guard<std::mutex> lk(g_last_mu);
  g_last.reset();
}

GatedSubmission::GatedSubmission(int count) : st_(std::make_shared<State>()) {
  st_->left = count;
  waitForGatedSubmissions();
  std::lock_guard<std::mutex> lk(g_last_mu);
  g_last = st_;
}

std::vector<DoneCallback> GatedSubmission::callbacks() {
  std::vector<DoneCallback> cbs;
  const int n = st_->left.load();
  cbs.reserve(n);
  for (int i = 0; i < n; ++i)
    cbs.push_back([st = st_](const Status& s) {
      if (!s.ok()) {
        bool on_host;
        {
          std::lock_guard<std::mutex> lk(st->mu);
          if (st->first.ok()) st->first = s;
          on_host = st->on_host;
        }
        if (!on_host) recordError(st->comm.get(), s);
      }
      if (st->left.fetch_sub(1) != 1) return;
      std::shared_ptr<gpu::StreamGate> gate;
      {
        std::lock_guard<std::mutex> lk(st->mu);
        st->finished = true;
        gate = st->gate;
      }
      if (gate) gate->open();
    });
  return cbs;
}

Status GatedSubmission::closeAfterSubmit(int device, void* stream) {
  std::shared_ptr<gpu::StreamGate> gate;
  try {
    gate = gpu::closeStream(device, stream);
  } catch (const Error& e) {
    return e.status();
  }
  bool finished;
  {
    std::lock_guard<std::mutex> lk(st_->mu);
    st_->gate = gate;
    finished = st_->finished;
  }
  if (finished) gate->open();
  return Status::OK();
}

Status GatedSubmission::submit(std::vector<Request> reqs, int device, void* stream) {
  st_->process_set = reqs.empty() ? 0 : reqs[0].process_set;
  st_->comm = gatedStateOf(st_->process_set);
  bool gate = true;
  for (const auto& r : reqs) gate = warmedUp(st_->comm.get(), r.type) && gate;
  gate = gate && gateLeavesEngineFree(st_->process_set, device, stream);
  st_->on_host = !gate;
  Status s;
  try {
    s = enqueueBatch(std::move(reqs), callbacks());
  } catch (const Error& e) {
    s = e.status();
  }
  if (!s.ok()) {
    st_->left = 0;  // refused: no callback runs, and nothing is left to wait for
    return s;
  }
  // No tryDrive here: the engine leaves GPU groups to its own thread (or to
  // a thread that waits), so the submitting thread returns at once.
  if (!gate) return waitHost();
  s = closeAfterSubmit(device, stream);
  if (!s.ok()) s = waitHost();  // no gate: complete on the host after all
  return s;
}

Status GatedSubmission::waitHost() {
  driveUntilDone(st_);
  std::lock_guard<std::mutex> lk(st_->mu);
  return st_->first;
}

Status submitGated(std::vector<Request> reqs, int device, void* stream) {
  if (reqs.empty()) return Status::OK();
  Status s = streamCompletionError(reqs[0].process_set);
  if (!s.ok()) return s;
  GatedSubmission sub(static_cast<int>(reqs.size()));
  return sub.submit(std::move(reqs), device, stream);
}

}  // namespace runtime
}  // namespace tfring
