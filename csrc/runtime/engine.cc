// Engine (engine.h): its threads, submission, driving and shutdown; the
// agreement protocol itself is in agreement.cc.
#include "runtime/engine.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>

#include "common/abort.h"
#include "common/clock.h"
#include "common/logging.h"
#include "runtime/coordinator.h"

namespace tfring {
namespace runtime {

namespace {
// How long no caller must have driven before the engine thread takes over.
constexpr double kSeatQuiet = 200e-6;
// How long a caller yields for the driver's seat before it sleeps on its
// collective's completion instead.
constexpr double kSeatYield = 100e-6;
// The longest the engine thread sleeps while a caller drives (stop and
// abort checks; a leaving caller wakes it at once).
constexpr double kParkMax = 0.1;
}  // namespace

Engine::Engine(std::unique_ptr<transport::RingLinks> links, int ctrl_fd, Coordinator* local,
               const Config& cfg)
    : links_(std::move(links)), cfg_(cfg) {
  const auto& T = links_->topology();
  waiter_.reset(new transport::Waiter(links_->bell(), links_->right(), links_->left(),
                                      links_->abortState()));
  comm_ = collectives::makeRingComm(*links_, waiter_.get(), cfg);
  if (!cfg.timeline.empty()) timeline_.open(cfg.timeline, T.rank);
  ctrl_.reset(new CtrlLink(ctrl_fd, local, cfg_, T.rank, in_, [this] { idle_->wake(); },
                           comm_.abort, links_->labels()));
  host_exec_.reset(new HostExecutor(comm_, T.rank, timeline_, cfg_.fusion_threshold));
  gpu_exec_.reset(new GpuExecutor(comm_, T, cfg_.timeout_s, links_->labels()));
  agreement_.reset(new Agreement(cfg_, comm_, *links_, timeline_, in_, *ctrl_,
                                 Executors{host_exec_.get(), gpu_exec_.get()}));
  idle_.reset(new IdleWait(*links_, cfg_, in_, *agreement_));
}

Engine::~Engine() { stop(); }

void Engine::start() {
  comm_.abort->addWaker(this, [this] {
    idle_->wake();
    in_.cv.notify_all();
  });
  thread_ = std::thread([this] { loop(); });
  ctrl_->start();
}

Status Engine::enqueue(std::vector<Request> reqs, std::vector<DoneCallback> dones) {
  std::vector<std::shared_ptr<Entry>> es;
  es.reserve(reqs.size());
  const double now = nowSeconds();
  for (size_t i = 0; i < reqs.size(); ++i) {
    auto e = std::make_shared<Entry>();
    Request& req = reqs[i];
    Meta& m = e->meta;
    // The name, shape and splits move into the Meta (the engine reads them
    // there only): no copies per tensor.
    m.name = std::move(req.name);
    m.type = req.type;
    m.dtype = req.dtype;
    m.shape = std::move(req.shape);
    m.op = req.op;
    m.root = req.root;
    m.prescale = req.prescale;
    m.postscale = req.postscale;
    // Ranks agree on host vs GPU; GPU ordinals legitimately differ per rank.
    m.device = req.device < 0 ? -1 : 0;
    // Only float32 host allreduces narrow; the others ignore the wire (GPU
    // tensors reduce on the device at their own precision).
    m.wire = req.type == CollectiveType::kAllreduce && req.device < 0
                 ? effectiveWire(req.wire, req.dtype)
                 : WireType::kNone;
    m.splits = std::move(req.splits);
    // A request this rank can judge invalid alone is still queued: it
    // reaches the coordinator, which fails it on every rank (validate.cc).
    m.error = req.error.empty() ? checkRequest(m, comm_.size) : std::move(req.error);
    if (!req.parts.empty() && m.type != CollectiveType::kAllreduce)
      return Status(Code::kInternal, strCat("tensor '", m.name,
                                            "': only an allreduce may have parts"));
    e->req = std::move(req);
    e->done = std::move(dones[i]);
    e->submitted = now;
    if (e->req.device >= 0) {  // without CUDA: "... has no CUDA support ..."
      Status s = GpuExecutor::accept(*e);
      if (!s.ok()) return s;
      gpu_seen_ = true;
    }
    es.push_back(std::move(e));
  }
  if (comm_.abort->aborted()) return comm_.abort->status();
  bool caller_drives = true;
  for (auto& e : es) caller_drives = caller_drives && e->req.caller_drives;
  if (comm_.size == 1) {
    // Nothing to agree on: tensors complete on the caller's thread before
    // enqueue returns (no engine-thread hop). Not GPU tensors ordered on a
    // producer stream (TF's GPU ops): their submitter must not wait for the
    // GPU, so the engine thread does.
    bool inline_ok = true;
    for (auto& e : es) inline_ok = inline_ok && (e->req.device < 0 || !e->req.stream);
    if (inline_ok) {
      std::lock_guard<std::mutex> lk(inline_mu_);
      for (auto& e : es) {
        if (timeline_.enabled()) timeline_.begin(e->meta.name, collectiveName(e->meta.type));
        Status st = runInline(*e);
        if (timeline_.enabled()) timeline_.end(e->meta.name);
        e->done(st);
      }
      return Status::OK();
    }
  }
  {
    std::lock_guard<std::mutex> lk(in_.mu);
    if (in_.left_rank.load() >= 0)
      return Status(Code::kAborted,
                    strCat("tensor '", es[0]->meta.name, "' can never complete: rank ",
                           in_.left_rank.load(), " has already shut down (tfring.shutdown())"));
    if (in_.stopping) return Status(Code::kAborted, "tfring has been shut down");
    // All or none: a name already in flight, or twice in the batch, takes
    // back what this batch inserted (one hash lookup a tensor, not a scan
    // of the batch).
    for (size_t i = 0; i < es.size(); ++i) {
      if (in_.inflight.emplace(es[i]->meta.name, es[i]).second) continue;
      const std::string& name = es[i]->meta.name;
      for (size_t j = 0; j < i; ++j) in_.inflight.erase(es[j]->meta.name);
      return Status(Code::kInvalidArgument,
                    strCat("a collective named '", name,
                           "' is already in flight on this rank; names must be unique "
                           "among outstanding operations"));
    }
    for (auto& e : es) {
      if (timeline_.enabled()) timeline_.begin(e->meta.name, "NEGOTIATE");
      in_.incoming.push_back(std::move(e));
    }
    in_.news.fetch_add(1, std::memory_order_release);
    // A parked engine thread serves what no caller will drive (drive()).
    if (!caller_drives && sync_drivers_.load() == 0 && parked_long_.exchange(false))
      in_.cv.notify_all();
  }
  if (comm_.size == 1) {
    in_.cv.notify_all();
    return Status::OK();
  }
  idle_->wake();
  return Status::OK();
}

Status Engine::runInline(Entry& e) {
  const Meta& m = e.meta;
  // What the coordinator would refuse for a job of one, host or GPU alike.
  if (!m.error.empty()) return Status(Code::kInvalidArgument, m.error);
  try {
    // The group the coordinator would schedule: one name; an allgather's
    // rows, an alltoall's 1 x 1 splits, or a join's result (the only rank
    // is the last to join).
    Group g;
    g.type = m.type;
    g.names = {m.name};
    if (g.type == CollectiveType::kAllgather) g.dim0s = {{m.shape[0]}};
    if (g.type == CollectiveType::kJoin) g.dim0s = {{0}};
    if (g.type == CollectiveType::kAlltoall && e.req.device < 0) {
      std::vector<int64_t> rows;
      alltoallSplits(m, 1, &rows);  // valid: checkRequest passed
      g.dim0s = {rows};
    }
    Entries one{std::shared_ptr<Entry>(&e, [](Entry*) {})};
    if (e.req.device >= 0) return gpu_exec_->run(g, one);
    return host_exec_->run(g, one);
  } catch (const Error& err) {
    return err.status();
  }
}

// ------------------------------------------------------------- driving ----

bool Engine::pumpGuarded(bool block) {
  try {
    return pump(block);
  } catch (const Error& e) {
    if (e.status().code() == Code::kPeerFailure && !comm_.abort->aborted()) {
      // A neighbour that closed its link may itself be failing because of
      // another rank, or may have shut down: a leaving rank says goodbye to
      // the coordinator before it closes its links, but this rank can see
      // the links close before the coordinator's word (kMsgLeft) that it
      // left. Give the coordinator's verdict (an abort naming the rank that
      // failed first, or that word) a moment to arrive before reporting.
      const int suspect = e.status().suspect();
      Deadline grace = Deadline::in(1.0);
      while (!comm_.abort->aborted() && !in_.hasLeft(suspect) && !grace.expired())
        usleep(1000);
      if (!comm_.abort->aborted() && in_.hasLeft(suspect)) {
        // A departure, not a failure: nothing to report; what needed the
        // rank fails naming it, as Agreement::round() fails it once
        // kMsgLeft is in.
        const int who = links_->labels()(suspect >= 0 ? suspect : in_.left_rank.load());
        TFRING_LOG(kDebug, "rank ", who, " shut down: ", e.status().message());
        failAll(Status(), [who](const Entry& en) {
          return Status(Code::kAborted, strCat("tensor '", en.meta.name,
                                               "' can never complete: rank ", who,
                                               " has already shut down (tfring.shutdown())"));
        });
        return false;
      }
    }
    ctrl_->reportFatal(e.status());
    // On rank 0 the coordinator relays the error as an abort: let it reach
    // every rank before this rank's script can learn of it and exit.
    ctrl_->waitAbortRelayed(2.0);
    failAll(comm_.abort->aborted() ? comm_.abort->status() : e.status());
    return false;
  }
}

bool Engine::pump(bool block) {
  comm_.abort->check();
  if (agreement_->hasNews() || agreement_->peerStartedRound()) {
    agreement_->round();
    return true;
  }
  if (!block) return false;
  const bool engine_thread = std::this_thread::get_id() == thread_.get_id();
  idle_->wait(engine_thread, engine_thread ? engine_lock_ : nullptr, sync_drivers_);
  return false;
}

void Engine::drive(const std::function<bool()>& done, const std::function<void()>& wait) {
  // Size 1 never needs driving (enqueue ran it). GPU groups run on whichever
  // thread drives: the executor sets its device on every call, and its
  // stream and IPC mappings belong to the process, not to a thread.
  if (comm_.size == 1) {
    while (!done()) wait();
    return;
  }
  sync_drivers_.fetch_add(1);
  struct Leave {
    Engine* e;
    ~Leave() {
      e->last_drive_end_.store(nowSeconds());
      // The engine thread parks (kParkMax) once a caller has driven for a
      // while. The last caller out wakes it only when this rank still has
      // collectives in flight (async ones, submitted by other threads):
      // rounds peers start meanwhile cannot complete a collective without
      // this rank's tensor, so they wait for this rank's next call, or at
      // most kParkMax. Back-to-back blocking calls then leave the engine
      // thread asleep: waking it after every call, to take the seat and
      // hand it back, cost 12 of the 15 context switches of a 4 KiB call
      // per rank at 128 ranks on 2 cores, and half the call's time.
      if (e->sync_drivers_.fetch_sub(1) == 1) {
        std::lock_guard<std::mutex> lk(e->in_.mu);
        if (!e->in_.inflight.empty() && e->parked_long_.exchange(false)) e->in_.cv.notify_all();
      }
    }
  };
  {
    Leave leave{this};
    idle_->wake();  // an idle engine thread hands over the driver's seat
    while (!done() && !stop_requested_.load()) {
      std::unique_lock<std::mutex> d(drive_mu_, std::try_to_lock);
      // The engine thread hands the seat over within microseconds (it
      // watches sync_drivers_); a caller that really drives takes longer.
      // Yield for at most kSeatYield: with many ranks per core one yield
      // can wait a turn of every runnable rank.
      const double yield_start = nowSeconds();
      for (int i = 0; i < 200 && !d.owns_lock() && !done(); ++i) {
        sched_yield();
        d.try_lock();
        if ((i & 7) == 7 && nowSeconds() - yield_start > kSeatYield) break;
      }
      if (!d.owns_lock()) {
        wait();
        continue;
      }
      while (!done()) {
        if (comm_.abort->aborted()) {
          failAll(comm_.abort->status());
          break;
        }
        // shutdown() from another thread: the engine thread fails what is
        // left once this thread gives the seat back.
        if (stop_requested_.load()) break;
        pumpGuarded(true);
      }
    }
  }
  while (!done()) wait();
}

void Engine::tryDrive() {
  if (comm_.size == 1 || gpu_seen_.load()) return;
  std::unique_lock<std::mutex> d(drive_mu_, std::try_to_lock);
  if (!d.owns_lock()) return;
  // Run what can run now (this rank's news, a round a peer started), never
  // an idle wait: the submitting thread goes back to its framework after.
  for (int i = 0; i < 64 && !comm_.abort->aborted() && !stop_requested_.load(); ++i)
    if (!pumpGuarded(false)) break;
}

void Engine::loop() {
  for (;;) {
    {
      std::unique_lock<std::mutex> lk(in_.mu);
      // A caller drives: stay out of its way. Look again after a
      // millisecond; if a caller still drives then, sleep until the last
      // caller leaves (drive() wakes this thread) so that rounds started
      // by peers are served once it is gone. A timer here would wake every
      // rank's engine thread a thousand times a second, which with many
      // ranks per core costs the cores the ranks that have work need.
      // Back-to-back blocking calls leave sync_drivers_ at zero only for
      // microseconds: take the seat only after it has stayed free a while.
      bool parked = false;
      for (;;) {
        if (in_.stopping || comm_.abort->aborted()) break;
        if (sync_drivers_.load() > 0) {
          if (!parked) {
            parked = true;
            in_.cv.wait_for(lk, std::chrono::milliseconds(1));
            continue;
          }
          parked_long_.store(true);
          // Re-checked under in_.mu after announcing: a caller leaving in
          // between either sees parked_long_ or is seen here.
          if (sync_drivers_.load() > 0)
            in_.cv.wait_for(lk, std::chrono::duration<double>(kParkMax));
          parked_long_.store(false);
          // The short park again: back-to-back calls then wake this
          // thread at most once a millisecond, as a timer would.
          parked = false;
          continue;
        }
        parked = false;
        double quiet = nowSeconds() - last_drive_end_.load();
        if (quiet >= kSeatQuiet) break;
        in_.cv.wait_for(lk, std::chrono::duration<double>(kSeatQuiet - quiet));
      }
    }
    if (comm_.abort->aborted()) {
      std::unique_lock<std::mutex> d(drive_mu_);
      failAll(comm_.abort->status());
      break;
    }
    // Blocks while another thread drives. The engine thread itself lets go
    // of the seat while it sleeps (idleWait), so callers can take it then.
    std::unique_lock<std::mutex> d(drive_mu_);
    engine_lock_ = &d;
    bool quit = false;
    // Shutting down: callers still driving give the seat back (drive()).
    if (stop_requested_.load() && sync_drivers_.load() > 0) {
      engine_lock_ = nullptr;
      d.unlock();
      std::unique_lock<std::mutex> lk(in_.mu);
      in_.cv.wait_for(lk, std::chrono::milliseconds(1));
      continue;
    }
    while (sync_drivers_.load() == 0) {
      bool idle_stop;
      {
        std::lock_guard<std::mutex> lk(in_.mu);
        idle_stop = in_.stopping && in_.incoming.empty();
      }
      // Once a rank has left no round can complete: a round a peer started
      // (its bytes unread on a link) must not keep this thread spinning.
      if (idle_stop && (in_.left_rank.load() >= 0 || !agreement_->peerStartedRound())) {
        quit = true;
        break;
      }
      if (comm_.abort->aborted()) break;
      pumpGuarded(true);
    }
    engine_lock_ = nullptr;
    if (quit) break;
  }
  std::unique_lock<std::mutex> d(drive_mu_);
  failAll(comm_.abort->aborted() ? comm_.abort->status()
                                      : Status(Code::kAborted, "tfring has been shut down"));
}

void Engine::stop() {
  {
    std::lock_guard<std::mutex> lk(in_.mu);
    if (stopped_) return;
    stopped_ = true;
    in_.stopping = true;
    stop_requested_ = true;
  }
  in_.cv.notify_all();
  idle_->wake();
  if (thread_.joinable()) thread_.join();
  ctrl_->close();
  comm_.abort->removeWaker(this);
}

void Engine::expectStop() {
  std::lock_guard<std::mutex> lk(in_.mu);
  in_.stopping = true;
}

}  // namespace runtime
}  // namespace tfring
