// Stream-ordered completion of XLA's GPU custom calls
// (tf/xla_custom_call.cc), with TFRING_GPU_COMPLETION=stream.
//
// "host" (the default): the call returns once the collective's output is
// complete on the device. XLA's host thread therefore waits, every step,
// for the GPU to finish backprop and the collective, and the GPU then idles
// while the host queues the rest of the step and the next one.
//
// "stream": the call returns as soon as its requests are submitted. A
// stream gate (gpu/device.h) queued on XLA's stream right after the
// submission holds the stream's later work (the optimizer, the next step)
// until the engine has finished, so the outputs are used in stream order
// like any GPU kernel's, and the host goes on queueing work meanwhile. The
// engine still reads the input after the work queued before the submission
// (the event enqueue records comes before the gate).
//
// One gated submission is in flight per process: a later GPU submission
// (the next call, a TF op) may read inputs produced behind the gate, so it
// waits on the host for the gated one first. XLA's calls come in one order
// on every rank (the chain, xla_ops.cc), so that wait cannot cross ranks.
// The TF kernels are not gated: TF's executor may run two of them in
// different orders on different ranks. The first call of each collective
// type on a communicator (the world, each process set) is not gated either and completes on
// the host: it may set up the GPU backend, and set-up may synchronize the
// device, which would wait on the held stream.
//
// A gate must not hold back the engine's own stream. CUDA maps a context's
// streams onto a few hardware work queues (CUDA_DEVICE_MAX_CONNECTIONS;
// under MPS the driver may grant fewer than asked), and work on a stream
// that shares a queue with the gated one runs only after the gate opens:
// the engine would wait for itself. So before the first gate on a caller's
// stream, the communicator's engine stream runs a small probe while a gate
// holds the caller's (gpu::gateHoldsBack); if the probe waits, every
// collective on that stream completes on the host, with a warning once.
//
// Errors: a collective that fails after its call returned cannot fail that
// call. The error is logged at once and kept by its communicator (the world
// or the process set that ran it): every later stream-completed call on
// that communicator fails with it, naming the tensor that failed, so the
// step after the failure raises it. Other communicators go on. That step's
// outputs are not valid; with "host", the failing step itself raises.
#pragma once

#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "common/status.h"
#include "runtime/runtime.h"

namespace tfring {
namespace runtime {

// True when TFRING_GPU_COMPLETION=stream and gates work on `device` (else a
// warning once, and host completion).
bool streamCompletion(int device);

// One communicator's stream-completion state (runtime::Comm owns one, so a
// rebuilt communicator, or a new world, starts clean).
struct GatedState {
  std::mutex mu;
  Status error;        // the first failure of a stream-completed collective
  std::set<int> warm;  // collective types that have completed once here
};

// The first error of a stream-completed collective on communicator
// `process_set` (0: the world); OK if none, or if there is no such
// communicator.
Status streamCompletionError(int process_set = 0);

// Forgets the last gated submission: called by runtime::init, so a new
// world (an elastic reset) starts clean.
void resetStreamCompletion();

// Blocks (driving the engine) until the last gated submission of this
// process is done. Every GPU submission in stream mode comes after it: its
// input may be produced behind that gate, so the engine must not start (or
// fuse) it first. GatedSubmission's constructor and the TF kernels call it.
void waitForGatedSubmissions();

// One submission completed on its stream: construct, then submit().
class GatedSubmission {
 public:
  explicit GatedSubmission(int count);
  // Enqueues `reqs` (count of them, on `stream` of `device`, all on one
  // communicator) as one batch, then gates the stream; the first call of
  // its kind on that communicator, one on a stream whose gate would hold
  // back the engine's, or one that gets no gate, waits on the host instead.
  // An error here is the submission's own (refused, or failed while waited
  // for on the host).
  Status submit(std::vector<Request> reqs, int device, void* stream);

  struct State;

 private:
  std::vector<DoneCallback> callbacks();
  // Queues the gate on `stream` once the requests are enqueued (so the
  // engine's input event precedes it); opens it at once if they are done.
  // A non-OK status: no gate could be queued; the caller must then wait for
  // the requests itself (waitHost).
  Status closeAfterSubmit(int device, void* stream);
  // Fallback: blocks (driving the engine) until every request is done;
  // returns their first error.
  Status waitHost();

  std::shared_ptr<State> st_;
};

// What a caller in stream mode runs: fails at once with the recorded error
// of an earlier gated collective on the requests' communicator, else
// submits `reqs` (all on `stream` of `device`) as one gated submission.
Status submitGated(std::vector<Request> reqs, int device, void* stream);

}  // namespace runtime
}  // namespace tfring
