// Engine: the per-process progress engine that owns the ring links.
//
// Callers (TF kernels, the Python binding) enqueue named Requests from any
// thread. Work only moves when some thread "drives" the engine: the
// background engine thread by default, or a caller that blocks on its own
// result (drive()), which then runs the protocol itself so that its result
// arrives without a thread switch. One driver at a time (drive_mu_).
//
// Agreement happens in rounds (engine_round.cc). A round is a tiny
// collective on the data ring in which every rank contributes which of its
// cached tensors are ready, which coordinator responses it has received and
// whether it needs the coordinator; all ranks then execute the same list of
// collectives. Tensors every rank has already negotiated once run in the
// round that finds them ready everywhere, without a coordinator round trip,
// and so do a few new names every rank offers alike in the same round
// (engine_fresh.cc); anything else (a changed shape, many new names at
// once, a tensor only some ranks submit) goes to the coordinator on rank 0
// (coordinator.h), whose responses are executed in rounds too, so all
// ranks see one order.
//
// A rank starts a round when it has news (new tensors, a new response, an
// aged tensor) and joins one when bytes arrive from its left neighbour.
// Idle waits spin, then block on the shared-memory doorbell (or poll the
// TCP link), never sleep a fixed time.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
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
#include "runtime/vote.h"
#include "transport/ring_links.h"

namespace tfring {
namespace runtime {

class Coordinator;

struct Entry {
  Request req;  // its name, shape and splits have moved into meta
  DoneCallback done;
  Meta meta;
  std::shared_ptr<void> gpu_ready;  // GPU tensors: the input's ready event
  double submitted = 0;             // for the fast path's aging
  int32_t id = -1;                  // cache id while waiting on the fast path
  uint64_t fresh_full = 0;          // engine_fresh.cc: hashes offered in the vote
  uint32_t fresh_name = 0;
  bool rode = false;                // engine_rider.cc: finished by the vote
};

// An allreduce entry's buffers: its parts (Request::parts), else its one
// input and output. gatherInput packs the inputs at dst, in order;
// scatterOutput unpacks src into the outputs.
void entrySpans(const Entry& e, std::vector<collectives::Span>* out);
void gatherInput(const Entry& e, void* dst);
void scatterOutput(Entry& e, const void* src);

// Allocates a request's output through its allocator once the shape is
// known (allgather, reducescatter); a no-op when the caller supplied one.
void allocateOutput(Entry& e, const std::vector<int64_t>& shape);

// Block layouts shared by the host and GPU executors. Allgather: the bytes
// each rank contributes when rank r has dim0s[r] rows, and the gathered
// shape. Reducescatter: the elements of each rank's block over n ranks.
std::vector<size_t> allgatherBytes(const Meta& m, const std::vector<int64_t>& dim0s,
                                   std::vector<int64_t>* out_shape);
std::vector<size_t> reducescatterCounts(const Meta& m, int n);
// executor.cc: the postscale an allreduce ends with (Average's 1/size
// folded in), and the kernel op behind a reduce op (Average sums).
double finalScale(const Meta& m, int size);
ReduceOp kernelOp(ReduceOp op);
// The last collective's stats (collectives::lastCollectiveStats) as a
// timeline `event` (ALLREDUCE_STATS, ...) on e's row.
void traceCollective(Timeline& t, const collectives::CommStats& s, const Entry& e,
                     const char* event);

// alltoall_join.cc. Resolves one rank's alltoall splits over `size` ranks
// (empty: an even split) into *rows; returns why they are invalid, or "".
std::string alltoallSplits(const Meta& m, int size, std::vector<int64_t>* rows);
// A stand-in for a tensor a joined rank never submitted: zeros of the
// agreed Meta, its output discarded.
std::shared_ptr<Entry> joinFillEntry(const Meta& m);

class Engine {
 public:
  // ctrl_fd: the connection to the coordinator, or -1 on rank 0, whose
  // coordinator lives in this process (`local`).
  Engine(std::unique_ptr<transport::RingLinks> links, int ctrl_fd, Coordinator* local,
         const Config& cfg);
  ~Engine();
  void start();
  // Queues the requests as one batch: all are accepted or none is (then
  // the error is returned and no callback runs).
  Status enqueue(std::vector<Request> reqs, std::vector<DoneCallback> dones);
  // Fails this communicator from this rank, as a collective's fatal error
  // does (runtime.h's failCommunicator, for tests).
  void injectFailure(const Status& s) { reportFatal(s); }
  // This communicator's statistics (collectives/collective_stats.h).
  std::shared_ptr<collectives::CommStats> stats() const { return comm_.stats; }
  // Drives the engine on the calling thread until done() is true (or, when
  // another thread drives, waits for it). `wait` is called to sleep a little
  // while another thread drives; it returns early once done.
  void drive(const std::function<bool()>& done, const std::function<void()>& wait);
  // Runs the protocol on the calling thread while there is something to do
  // right now, if no other thread drives; never waits for work. Submitters
  // call it after enqueue so a ready tensor starts without waking the
  // engine thread.
  void tryDrive();
  // Says goodbye to the coordinator, fails what is still queued, joins.
  void stop();
  // Every rank of this ring is about to stop (a process set is removed):
  // refuses new work, and a peer's goodbye that arrives before stop() is
  // expected rather than a reason to fail waits.
  void expectStop();
  // A message from the coordinator (reader thread, or the coordinator's
  // own thread on rank 0).
  void onCtrlMessage(const std::vector<uint8_t>& msg);
  // A connection loss reported by the reader.
  void onCtrlLost();

  const transport::Topology& topology() const { return links_->topology(); }
  // Starts (or restarts, in a new file) and stops the timeline at run time.
  bool startTimeline(const std::string& path) { return timeline_.open(path, topology().rank); }
  void stopTimeline() { timeline_.close(); }
  std::string transportName() const { return links_->transportName(); }
  // The right link's store tuners (collectives/store_tuner.h): for
  // collectives from 8 MiB of output, and from 256 KiB.
  collectives::StoreTuner* storeTuner(bool large) const {
    return large ? comm_.tuner.get() : comm_.tuner_mid.get();
  }

 private:
  // engine.cc
  void loop();
  void readerLoop();
  void wakeLocal();
  // Fails every queued entry with `s`, or with per_entry(entry) when given.
  void failAll(const Status& s, const std::function<Status(const Entry&)>& per_entry = nullptr);
  void reportFatal(const Status& s);
  void sendCtrl(const std::vector<uint8_t>& payload, double timeout_s = -1);
  Status runInline(Entry& e);  // size-1 jobs: no negotiation, no thread
  // One step of progress: a round when there is news or a peer started
  // one, else an idle wait (when `block`). Returns true if a round ran.
  bool pump(bool block);
  bool pumpGuarded(bool block);  // pump() with fatal errors reported
  // Whether the coordinator said `rank` shut down (kMsgLeft); for -1
  // (a failure that names no peer), whether any rank did.
  bool hasLeft(int rank);

  // engine_round.cc
  bool hasNews();
  bool peerStartedRound();
  bool peerStartedVote();  // the recursive vote's links (runtime/vote.h)
  bool hostStartedVote();  // the host vote: a local rank voted past us
  void setVoteWatch();     // which links an idle rank watches, by vote mode
  void idleWait();
  void round();
  void classify(std::vector<std::shared_ptr<Entry>>& fresh);
  void sendSlow(const std::vector<std::shared_ptr<Entry>>& es);
  void executeResponse(const Response& resp);
  void runSlowGroup(const Group& g);
  void runGroup(const Group& g, const std::vector<std::shared_ptr<Entry>>& es);
  void finish(const std::vector<std::shared_ptr<Entry>>& es, const Status& st);
  std::string voteStatsJson() const;
  double agingLimit() const;

  // engine_rider.cc: one small allreduce carried by the round's vote
  size_t riderWords() const;              // extra vote words this round
  int32_t riderProposal();                // payload bytes proposed for the next round
  void writeRider(int32_t* out);          // this rank's rider (or none) into the vote
  void runRider(const int32_t* merged);   // completes the rider every rank agreed on
  bool riderEligible(const Entry& e) const;
  static void mergeRider(void* ctx, const int32_t* lo, const int32_t* hi, int32_t* out);
  static constexpr size_t kRiderKey = 3;  // key words before the data
  std::shared_ptr<Entry> rider_;  // this rank's rider in the round's vote
  int32_t rider_key_[kRiderKey] = {0, 0, 0};
  int64_t rider_bytes_ = 0;      // this round's payload room, agreed in the last vote
  int64_t rider_hint_ = 0;       // bytes of the last small allreduce seen
  uint64_t rider_seen_ = 0;      // round it was seen in
  uint64_t rounds_ = 0;

  // engine_fresh.cc: first appearances agreed in the round's vote
  // (kFreshSlots per rank, runtime/vote.h)
  bool freshEligible(Entry& e) const;  // and sets its hashes
  int writeFreshVote(int32_t* out);    // returns how many it offered
  // `tally`: the fresh part of the round's tally; `mine`: how many this
  // rank offered.
  void runFresh(const int32_t* tally, int mine);
  size_t waitingCount() const { return fast_count_ + fresh_.size(); }

  // executor.cc
  void execAllreduce(const std::vector<std::shared_ptr<Entry>>& es);
  void execAllgather(Entry& e, const std::vector<int64_t>& dim0s);
  void execBroadcast(Entry& e);
  void execReducescatter(Entry& e);
  // alltoall_join.cc: `splits` is the size x size matrix, rank-major.
  void execAlltoall(Entry& e, const std::vector<int64_t>& splits);

  // executor_gpu.cc: GPU tensors (Request.device >= 0)
  Status acceptGpu(Entry& e);
  Status execGpu(const Group& g, const std::vector<std::shared_ptr<Entry>>& es);

  std::unique_ptr<transport::RingLinks> links_;
  int ctrl_fd_;
  Coordinator* local_coord_;
  Config cfg_;
  std::unique_ptr<transport::Waiter> waiter_;
  collectives::RingComm comm_;
  Timeline timeline_;
  int wake_fd_ = -1;  // eventfd for local wake-ups when the left link is TCP
  bool engine_spins_ = true;  // the engine thread's idle wait may spin (a core per rank to spare)
  // The vote goes by recursive doubling over the point-to-point links
  // (runtime/vote.h); idle ranks then watch those links, not the ring.
  bool vote_recdbl_ = false;
  // The host vote (runtime/vote_host.cc): while on, idle ranks watch the
  // host segment, and local rank 0 the links to the other hosts' too.
  // Off for good, on every rank at the same round, once the vote outgrows
  // the segment's slots.
  bool vote_host_ = false;
  uint64_t vote_round_ = 0;        // host-vote rounds so far, the same on every rank
  int vote_watch_count_ = 0;  // the peer links open when vote_links_ was set
  bool vote_watch_complete_ = true;  // every link the vote uses is watched
  std::vector<int> vote_links_;    // indices of the watched links in the peer links
  std::vector<int> vote_fds_;  // the links' sockets, for the idle wait
  // When each of those links was found closed while idle (0: open); see
  // peerStartedRound().
  std::vector<double> vote_closed_at_;
  VoteStats last_vote_;        // this engine's last round, for the timeline

  // Shared between submitters, the reader and the driver (mu_).
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::shared_ptr<Entry>> incoming_;
  std::deque<Response> responses_;
  std::unordered_map<std::string, std::shared_ptr<Entry>> inflight_;  // by name
  bool stopping_ = false;
  bool stopped_ = false;
  std::atomic<uint64_t> news_{0};       // bumped by enqueue and the reader
  std::atomic<uint64_t> recv_seq_{0};   // last coordinator response received
  std::atomic<int> sync_drivers_{0};    // callers blocked in drive()
  std::atomic<double> last_drive_end_{0};  // when a caller last stopped driving
  // The engine thread sleeps without a timer while a caller drives; the
  // last caller to leave wakes it (drive()).
  std::atomic<bool> parked_long_{false};
  std::atomic<bool> gpu_seen_{false};   // tryDrive leaves GPU groups to the engine thread
  std::atomic<bool> idle_blocked_{false};
  std::atomic<int> left_rank_{-1};           // a rank that shut down (kMsgLeft)
  std::vector<int> left_ranks_;              // every such rank; guarded by mu_
  std::atomic<bool> stop_requested_{false};  // stop() was called

  // Driver state (drive_mu_).
  std::mutex drive_mu_;
  std::unique_lock<std::mutex>* engine_lock_ = nullptr;  // the engine thread's seat
  uint64_t seen_news_ = 0;
  uint64_t exec_seq_ = 0;      // last response executed
  size_t slow_outstanding_ = 0;
  bool aged_ = false;          // a fast tensor waited past agingLimit()
  std::unordered_map<std::string, int32_t> ids_;             // granted cache ids
  std::vector<Meta> exec_meta_;                              // id -> last run meta
  std::vector<std::vector<int64_t>> exec_dim0s_;             // id -> allgather rows
  std::vector<std::shared_ptr<Entry>> fast_;                 // id -> waiting entry
  size_t fast_count_ = 0;
  std::vector<std::shared_ptr<Entry>> fresh_;                // new names, in order (engine_fresh.cc)
  double fast_oldest_ = 1e300;                               // oldest submitted
  std::unordered_map<std::string, Meta> sent_;               // last Meta sent per name
  std::vector<int32_t> vote_, vote_scratch_;
  std::vector<char> fusion_;
  std::vector<char> scratch_;
  std::unique_ptr<gpu::Executor> gpu_;  // created at the first GPU group
  std::mutex gpu_mu_;                   // execGpu: inline callers and the engine thread

  std::mutex inline_mu_;      // size-1 jobs
  std::mutex ctrl_send_mu_;  // writes to ctrl_fd_
  std::thread thread_, reader_;
};

}  // namespace runtime
}  // namespace tfring
