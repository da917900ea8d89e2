// Engine threads, submission, driving and shutdown (see engine.h); the
// agreement protocol itself is in engine_round.cc.
#include "runtime/engine.h"

#include <sched.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>

#include "common/abort.h"
#include "common/clock.h"
#include "common/logging.h"
#include "common/net.h"
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
// How long a wait may still block after a rank it needs has shut down.
constexpr double kLeftGrace = 2.0;
}  // namespace

Engine::Engine(std::unique_ptr<transport::RingLinks> links, int ctrl_fd, Coordinator* local,
               const Config& cfg)
    : links_(std::move(links)), ctrl_fd_(ctrl_fd), local_coord_(local), cfg_(cfg) {
  const auto& T = links_->topology();
  waiter_.reset(new transport::Waiter(links_->bell(), links_->right(), links_->left(),
                                      links_->abortState()));
  comm_ = collectives::makeRingComm(*links_, waiter_.get(), cfg);
  if (!cfg.timeline.empty()) timeline_.open(cfg.timeline, T.rank);
  const int ncpu = transport::usableCores();
  const int procs = cfg.host_procs > 0 ? cfg.host_procs : T.local_size;
  // TFRING_SPIN=auto busy-waits only where every local rank can have a
  // core; 0 never (a framework's own threads want every core), 1 always.
  const bool spin_auto = cfg.spin != "0" && cfg.spin != "1";
  transport::setSpinning(spin_auto ? procs <= ncpu : cfg.spin == "1");
  engine_spins_ = spin_auto ? 2 * procs <= ncpu : cfg.spin == "1";
  const transport::HostLinks* H = links_->host();
  vote_recdbl_ = T.size > 1 && H && H->vote_recdbl && H->want_peers;
  vote_host_ = vote_recdbl_ && H->vote_host;
  setVoteWatch();
  // Without a doorbell to ring (the left link is TCP, or there is no link,
  // or idle ranks watch the point-to-point links), local wake-ups go
  // through an eventfd the idle wait polls.
  if (T.size > 1 && (vote_recdbl_ || links_->left()->pollFd() >= 0 || !links_->bell()))
    wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
}

Engine::~Engine() {
  stop();
  if (wake_fd_ >= 0) ::close(wake_fd_);
}

void Engine::start() {
  comm_.abort->addWaker(this, [this] {
    wakeLocal();
    cv_.notify_all();
  });
  thread_ = std::thread([this] { loop(); });
  if (ctrl_fd_ >= 0) reader_ = std::thread([this] { readerLoop(); });
}

void Engine::wakeLocal() {
  if (links_->bell()) links_->bell()->ring();
  if (vote_host_) {
    // An idle rank under the host vote sleeps on its doorbell in the
    // segment (engine_round.cc); news_ is stored before this is read.
    const transport::HostLinks* H = links_->host();
    if (H->segment) {
      transport::Doorbell& b = H->segment->words(H->local_rank).idle;
      std::atomic_thread_fence(std::memory_order_seq_cst);
      if (b.sleeping.load(std::memory_order_seq_cst)) b.ring();
    }
  }
  if (wake_fd_ >= 0 && idle_blocked_.load(std::memory_order_seq_cst)) {
    uint64_t one = 1;
    ssize_t rc = ::write(wake_fd_, &one, sizeof(one));
    (void)rc;
  }
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
      Status s = acceptGpu(*e);
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
    std::lock_guard<std::mutex> lk(mu_);
    if (left_rank_.load() >= 0)
      return Status(Code::kAborted,
                    strCat("tensor '", es[0]->meta.name, "' can never complete: rank ",
                           left_rank_.load(), " has already shut down (tfring.shutdown())"));
    if (stopping_) return Status(Code::kAborted, "tfring has been shut down");
    // All or none: a name already in flight, or twice in the batch, takes
    // back what this batch inserted (one hash lookup a tensor, not a scan
    // of the batch).
    for (size_t i = 0; i < es.size(); ++i) {
      if (inflight_.emplace(es[i]->meta.name, es[i]).second) continue;
      const std::string& name = es[i]->meta.name;
      for (size_t j = 0; j < i; ++j) inflight_.erase(es[j]->meta.name);
      return Status(Code::kInvalidArgument,
                    strCat("a collective named '", name,
                           "' is already in flight on this rank; names must be unique "
                           "among outstanding operations"));
    }
    for (auto& e : es) {
      if (timeline_.enabled()) timeline_.begin(e->meta.name, "NEGOTIATE");
      incoming_.push_back(std::move(e));
    }
    news_.fetch_add(1, std::memory_order_release);
    // A parked engine thread serves what no caller will drive (drive()).
    if (!caller_drives && sync_drivers_.load() == 0 && parked_long_.exchange(false))
      cv_.notify_all();
  }
  if (comm_.size == 1) {
    cv_.notify_all();
    return Status::OK();
  }
  wakeLocal();
  return Status::OK();
}

Status Engine::runInline(Entry& e) {
  const Meta& m = e.meta;
  // What the coordinator would refuse for a job of one, host or GPU alike.
  if (!m.error.empty()) return Status(Code::kInvalidArgument, m.error);
  try {
    std::vector<std::shared_ptr<Entry>> one{std::shared_ptr<Entry>(&e, [](Entry*) {})};
    if (e.req.device >= 0) {
      Group g;
      g.type = m.type;
      g.names = {m.name};
      if (g.type == CollectiveType::kAllgather) g.dim0s = {{m.shape[0]}};
      return execGpu(g, one);
    }
    switch (m.type) {
      case CollectiveType::kAllreduce: execAllreduce(one); break;
      case CollectiveType::kAllgather: execAllgather(e, {m.shape[0]}); break;
      case CollectiveType::kBroadcast: execBroadcast(e); break;
      case CollectiveType::kReducescatter: execReducescatter(e); break;
      case CollectiveType::kBarrier: break;
      case CollectiveType::kAlltoall: {
        std::vector<int64_t> rows;
        alltoallSplits(m, 1, &rows);  // valid: checkRequest passed
        execAlltoall(e, rows);
        break;
      }
      case CollectiveType::kJoin:
        *static_cast<int32_t*>(e.req.output) = 0;  // the only rank is the last to join
        break;
    }
    return Status::OK();
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
      while (!comm_.abort->aborted() && !hasLeft(suspect) && !grace.expired())
        usleep(1000);
      if (!comm_.abort->aborted() && hasLeft(suspect)) {
        // A departure, not a failure: nothing to report; what needed the
        // rank fails naming it, as round() fails it once kMsgLeft is in.
        const int who = suspect >= 0 ? suspect : left_rank_.load();
        const int who_label = links_->labels()(who);
        TFRING_LOG(kDebug, "rank ", who_label, " shut down: ", e.status().message());
        failAll(Status(), [who_label](const Entry& en) {
          return Status(Code::kAborted, strCat("tensor '", en.meta.name,
                                               "' can never complete: rank ", who_label,
                                               " has already shut down (tfring.shutdown())"));
        });
        return false;
      }
    }
    reportFatal(e.status());
    // On rank 0 the coordinator relays the error as an abort: let it reach
    // every rank before this rank's script can learn of it and exit.
    if (local_coord_) local_coord_->waitAbortSent(2.0);
    failAll(comm_.abort->aborted() ? comm_.abort->status() : e.status());
    return false;
  }
}

bool Engine::hasLeft(int rank) {
  if (rank < 0) return left_rank_.load() >= 0;
  std::lock_guard<std::mutex> lk(mu_);
  return std::find(left_ranks_.begin(), left_ranks_.end(), rank) != left_ranks_.end();
}

bool Engine::pump(bool block) {
  comm_.abort->check();
  if (hasNews() || peerStartedRound()) {
    round();
    return true;
  }
  if (block) idleWait();
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
        std::lock_guard<std::mutex> lk(e->mu_);
        if (!e->inflight_.empty() && e->parked_long_.exchange(false)) e->cv_.notify_all();
      }
    }
  };
  {
    Leave leave{this};
    wakeLocal();  // an idle engine thread hands over the driver's seat
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
      std::unique_lock<std::mutex> lk(mu_);
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
        if (stopping_ || comm_.abort->aborted()) break;
        if (sync_drivers_.load() > 0) {
          if (!parked) {
            parked = true;
            cv_.wait_for(lk, std::chrono::milliseconds(1));
            continue;
          }
          parked_long_.store(true);
          // Re-checked under mu_ after announcing: a caller leaving in
          // between either sees parked_long_ or is seen here.
          if (sync_drivers_.load() > 0)
            cv_.wait_for(lk, std::chrono::duration<double>(kParkMax));
          parked_long_.store(false);
          // The short park again: back-to-back calls then wake this
          // thread at most once a millisecond, as a timer would.
          parked = false;
          continue;
        }
        parked = false;
        double quiet = nowSeconds() - last_drive_end_.load();
        if (quiet >= kSeatQuiet) break;
        cv_.wait_for(lk, std::chrono::duration<double>(kSeatQuiet - quiet));
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
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait_for(lk, std::chrono::milliseconds(1));
      continue;
    }
    while (sync_drivers_.load() == 0) {
      bool idle_stop;
      {
        std::lock_guard<std::mutex> lk(mu_);
        idle_stop = stopping_ && incoming_.empty();
      }
      // Once a rank has left no round can complete: a round a peer started
      // (its bytes unread on a link) must not keep this thread spinning.
      if (idle_stop && (left_rank_.load() >= 0 || !peerStartedRound())) {
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

// ------------------------------------------------------ control messages ----

void Engine::sendCtrl(const std::vector<uint8_t>& payload, double timeout_s) {
  if (local_coord_) {
    local_coord_->postLocal(payload);
    return;
  }
  // The driver, the reader (pongs) and the fatal-error path all write here.
  std::lock_guard<std::mutex> lk(ctrl_send_mu_);
  if (ctrl_fd_ < 0) return;
  wire::sendFrame(ctrl_fd_, payload, Deadline::in(timeout_s < 0 ? cfg_.timeout_s : timeout_s),
                  strCat("the coordinator (rank ", links_->labels()(0), ")"));
}

void Engine::onCtrlMessage(const std::vector<uint8_t>& msg) {
  try {
    wire::Reader rd(msg);
    auto type = rd.get<uint8_t>();
    if (type == kMsgResponse) {
      Response resp = Response::read(rd);
      {
        std::lock_guard<std::mutex> lk(mu_);
        recv_seq_.store(resp.seq);
        responses_.push_back(std::move(resp));
        news_.fetch_add(1, std::memory_order_release);
      }
      wakeLocal();
    } else if (type == kMsgPing) {
      if (!local_coord_) {
        wire::Writer w;
        w.put<uint8_t>(kMsgPong);
        sendCtrl(w.bytes(), 2.0);
      }
    } else if (type == kMsgStall) {
      TFRING_LOG(kWarning, rd.getStr());
    } else if (type == kMsgAbort) {
      int culprit = rd.get<int32_t>();
      std::string text = rd.getStr();
      comm_.abort->abort(Status(Code::kPeerFailure, strCat("rank ", culprit, ": ", text)));
    } else if (type == kMsgLeft) {
      // Rounds need every rank: from the next round on, this rank's work
      // fails with a message naming the rank that left.
      const int who = rd.get<int32_t>();
      {
        std::lock_guard<std::mutex> lk(mu_);
        left_ranks_.push_back(who);
      }
      left_rank_.store(who);
      // A round or collective already waiting for it would wait until
      // TFRING_TIMEOUT: give what it sent before leaving time to arrive,
      // then fail such a wait naming it.
      {
        std::lock_guard<std::mutex> lk(mu_);
        if (!stopping_)
          comm_.abort->abortWaitsAfter(
              Status(Code::kAborted, strCat("a collective can never complete: rank ",
                                            links_->labels()(who),
                                            " has already shut down (tfring.shutdown())")),
              kLeftGrace);
      }
      news_.fetch_add(1, std::memory_order_release);
      wakeLocal();
    }
  } catch (const Error& e) {
    comm_.abort->abort(e.status());
  }
}

void Engine::onCtrlLost() {
  std::lock_guard<std::mutex> lk(mu_);
  // After rank 0 said it shut down, its connection closing is expected.
  if (!stopping_ && left_rank_.load() != 0)
    comm_.abort->abort(
        Status(Code::kPeerFailure,
               strCat("lost the connection to the coordinator (rank ", links_->labels()(0),
                      "): rank ", links_->labels()(0),
                      " died, was killed, or its host failed")));
  cv_.notify_all();
}

void Engine::readerLoop() {
  // The coordinator pings at least every Coordinator::pingInterval(), so a
  // longer silence means rank 0 is stopped or hung.
  const double limit = Coordinator::silenceLimit(cfg_.timeout_s);
  for (;;) {
    std::vector<uint8_t> msg;
    try {
      msg = wire::recvFrame(ctrl_fd_, Deadline::in(limit),
                            strCat("the coordinator (rank ", links_->labels()(0), ")"));
    } catch (const Error& e) {
      if (e.status().code() == Code::kTimeout) {
        std::lock_guard<std::mutex> lk(mu_);
        if (!stopping_)
          comm_.abort->abort(Status(
              Code::kPeerFailure,
              strCat("the coordinator (rank ", links_->labels()(0), ") has sent nothing for ",
                     int(limit), " s, not even its pings: rank ", links_->labels()(0),
                     " is stopped or hung (SIGSTOP, swapped out, a debugger) although its "
                     "connection is up")));
        cv_.notify_all();
        return;
      }
      onCtrlLost();
      return;
    }
    onCtrlMessage(msg);
  }
}

void Engine::reportFatal(const Status& s) {
  bool first = comm_.abort->abort(s);
  if (!first) return;  // we are failing because someone told us to
  TFRING_LOG(kError, s.message());
  try {
    // Every rank hears this through the coordinator. A broken link or a
    // vanished process is most likely the peer's failure, not ours: name the
    // suspect first and this rank as the witness, so that a job of hundreds
    // of ranks is not blamed on the healthy rank that noticed.
    const int me = links_->topology().rank;
    const int suspect = s.code() == Code::kPeerFailure ? s.suspect() : -1;
    wire::Writer w;
    w.put<uint8_t>(kMsgError);
    if (suspect >= 0) {
      const std::string& where = s.suspectWhere();
      const RankLabels& L = links_->labels();
      w.putStr(strCat("rank ", L(suspect), where.empty() ? "" : strCat(" (", where, ")"),
                      " failed or became unreachable (seen by rank ", L(me), ": ", s.message(),
                      ")"));
    } else {
      w.putStr(strCat("rank ", links_->labels()(me), " failed: ", s.message()));
    }
    w.put<int32_t>(suspect);
    sendCtrl(w.bytes(), 2.0);
  } catch (const Error&) {
  }
}

void Engine::failAll(const Status& s, const std::function<Status(const Entry&)>& per_entry) {
  std::vector<std::shared_ptr<Entry>> es;
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (auto& kv : inflight_) es.push_back(kv.second);
    inflight_.clear();
    incoming_.clear();
    stopping_ = true;
  }
  for (auto& f : fast_) f.reset();
  fast_count_ = 0;
  fresh_.clear();
  for (auto& e : es) e->done(per_entry ? per_entry(*e) : s);
}

void Engine::stop() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (stopped_) return;
    stopped_ = true;
    stopping_ = true;
    stop_requested_ = true;
  }
  cv_.notify_all();
  wakeLocal();
  if (thread_.joinable()) thread_.join();
  try {
    wire::Writer w;
    w.put<uint8_t>(kMsgBye);
    sendCtrl(w.bytes(), 2.0);
  } catch (const Error&) {
  }
  if (ctrl_fd_ >= 0) {
    // Our goodbye is queued ahead of the FIN; closing both directions also
    // wakes the reader thread out of its recv.
    ::shutdown(ctrl_fd_, SHUT_RDWR);
    if (reader_.joinable()) reader_.join();
    std::lock_guard<std::mutex> lk(ctrl_send_mu_);
    net::closeFd(ctrl_fd_);
    ctrl_fd_ = -1;
  }
  comm_.abort->removeWaker(this);
}

void Engine::expectStop() {
  std::lock_guard<std::mutex> lk(mu_);
  stopping_ = true;
}

}  // namespace runtime
}  // namespace tfring
