// Engine: one background thread per process that owns the ring links.
//
// Callers (TF kernels, the Python binding) enqueue named Requests from any
// thread. The engine thread forwards their Metas to the coordinator and
// executes the Responses it sends back, in order, calling each request's
// done callback. A second thread reads the coordinator connection so that
// an Abort reaches the engine even while it is inside a collective.
#pragma once

#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "collectives/ring.h"
#include "gpu/executor.h"
#include "runtime/messages.h"
#include "runtime/runtime.h"
#include "runtime/timeline.h"
#include "transport/ring_links.h"

namespace tfring {
namespace runtime {

struct Entry {
  Request req;
  DoneCallback done;
  Meta meta;
  std::shared_ptr<void> gpu_ready;  // GPU tensors: the input's ready event
};

// Allocates a request's output through its allocator once the shape is
// known (allgather, reducescatter); a no-op when the caller supplied one.
void allocateOutput(Entry& e, const std::vector<int64_t>& shape);

// Block layouts shared by the host and GPU executors. Allgather: the bytes
// each rank contributes when rank r has dim0s[r] rows, and the gathered
// shape. Reducescatter: the elements of each rank's block over n ranks.
std::vector<size_t> allgatherBytes(const Meta& m, const std::vector<int64_t>& dim0s,
                                   std::vector<int64_t>* out_shape);
std::vector<size_t> reducescatterCounts(const Meta& m, int n);

class Engine {
 public:
  Engine(std::unique_ptr<transport::RingLinks> links, int ctrl_fd, const Config& cfg);
  ~Engine();
  void start();
  Status enqueue(Request req, DoneCallback done);
  // Says goodbye to the coordinator, fails what is still queued, joins.
  void stop();

  const transport::Topology& topology() const { return links_->topology(); }
  std::string transportName() const { return links_->transportName(); }

 private:
  void loop();
  void readerLoop();
  void sendRequests(std::vector<std::shared_ptr<Entry>>& fresh);
  void runResponse(const Response& resp);
  void runGroup(const Group& g);
  void failAll(const Status& s);
  void reportFatal(const Status& s);

  // executor.cc
  void execAllreduce(const std::vector<std::shared_ptr<Entry>>& es);
  void execAllgather(Entry& e, const std::vector<int64_t>& dim0s);
  void execBroadcast(Entry& e);
  void execReducescatter(Entry& e);

  // executor_gpu.cc: GPU tensors (Request.device >= 0)
  Status acceptGpu(Entry& e);
  Status execGpu(const Group& g, const std::vector<std::shared_ptr<Entry>>& es);

  std::unique_ptr<transport::RingLinks> links_;
  int ctrl_fd_;
  Config cfg_;
  std::unique_ptr<transport::Waiter> waiter_;
  collectives::RingComm comm_;
  Timeline timeline_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::shared_ptr<Entry>> incoming_;
  std::deque<Response> responses_;
  std::unordered_map<std::string, std::shared_ptr<Entry>> inflight_;  // by name
  bool stopping_ = false;
  bool reader_done_ = false;

  // Engine-thread state.
  std::unordered_map<std::string, std::pair<int32_t, Meta>> sent_;  // cache
  std::unordered_map<std::string, int32_t> ids_;
  std::vector<char> fusion_;
  std::vector<char> scratch_;
  std::unique_ptr<gpu::Executor> gpu_;  // created at the first GPU group

  std::thread thread_, reader_;
};

}  // namespace runtime
}  // namespace tfring
