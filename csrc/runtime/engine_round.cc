// The agreement protocol: rounds on the data ring (see engine.h).
//
// A round's vote is an int32 vector reduced with Min over all ranks:
//   [0]       the last coordinator response this rank has received, so the
//             minimum is a response every rank holds and can execute now;
//   [1]       1, or 0 when this rank needs the coordinator (it sent it
//             tensors that are not finished, or a tensor of its own has
//             waited on the fast path longer than agingLimit()); the
//             minimum is 0 when any rank does;
//   [2]       the bytes of small allreduce this rank proposes the next
//             round's votes carry (engine_rider.cc); the minimum is the room
//             every rank's next vote has;
//   [3 + i]   1 when cache id i is ready here with the Meta it last ran
//             with, else 0; the minimum is 1 when it is ready everywhere.
//   [3 + K..] this rank's first new names as hashes (engine_fresh.cc),
//             merged into those on every rank's list (runtime/vote.h);
//   then      with room agreed, one small allreduce's id and data, reduced
//             when every rank chose the same (engine_rider.cc).
// Votes travel round the ring (an allgather: N-1 hops) or by recursive
// doubling over point-to-point links (log2 N hops), see runtime/vote.h;
// either way every step carries bytes, and an idle rank joins a round when
// bytes reach it.
//
// After the vote every rank does the same: executes the received
// responses, then the ids ready everywhere (fused by fuseReady), and, if
// any rank needs the coordinator, sends every tensor still waiting on the
// fast path to it, so the coordinator sees each tensor from every rank and
// can report mismatches and stalls by name. While any rank needs it, new
// tensors reach it too, at the latest in the next round. Ids and the Metas
// they last ran with change only at the same point of a round on every
// rank; a rank whose Meta differs (a new shape) sends the tensor to the
// coordinator and, by its vote, makes every other rank do the same.
#include <linux/futex.h>
#include <poll.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "common/abort.h"
#include "common/clock.h"
#include "common/logging.h"
#include "runtime/engine.h"
#include "runtime/fusion.h"

namespace tfring {
namespace runtime {

namespace {

constexpr int kSpinChecks = 2000;    // idle checks before yielding
constexpr int kYieldChecks = 50;     // then yields before blocking
constexpr double kYieldSeconds = 100e-6;  // and for no longer than this
constexpr double kMaxBlock = 0.1;    // seconds per block (stop/abort/aging checks)
constexpr double kLeftGrace = 2.0;   // a closed vote link waits for the coordinator's word

}  // namespace

double Engine::agingLimit() const {
  // Long enough that ranks merely out of step stay on the fast path, short
  // enough that the coordinator's stall warning still comes on time.
  return std::max(0.05, std::min(1.0, cfg_.stall_warning_s / 4));
}

bool Engine::hasNews() {
  if (news_.load(std::memory_order_acquire) != seen_news_) return true;
  return !aged_ && waitingCount() > 0 && nowSeconds() - fast_oldest_ > agingLimit();
}

void Engine::setVoteWatch() {
  // Flat recursive doubling: every link may bring a round's first bytes.
  // The host vote: only local rank 0's links to the other hosts' local
  // ranks 0 (the others hear of a round through the segment).
  vote_links_.clear();
  vote_fds_.clear();
  vote_closed_at_.clear();
  const transport::HostLinks* H = links_->host();
  // The links open when first used: the watch covers those open so far,
  // and is set again when more have opened (peerStartedVote) until every
  // link the vote uses is watched.
  vote_watch_count_ = vote_recdbl_ ? H->peers().count() : 0;
  vote_watch_complete_ = true;
  if (vote_recdbl_) {
    transport::PeerLinks& P = H->peers();
    std::vector<int> watch;
    if (vote_host_ && H->local_rank == 0)
      for (int h : transport::recursivePeers(H->cross_rank, H->num_hosts))
        watch.push_back(H->leaders[h]);
    for (int i = 0; i < P.count(); ++i) {
      if (vote_host_ && std::find(watch.begin(), watch.end(), P.at(i).rank) == watch.end())
        continue;
      vote_links_.push_back(i);
      vote_fds_.push_back(P.at(i).recv->pollFd());
    }
    // Flat: every partner votes; the host vote: local rank 0's partners.
    const size_t wanted = vote_host_ ? watch.size() : static_cast<size_t>(P.peerCount());
    vote_watch_complete_ = vote_links_.size() == wanted;
  }
  vote_closed_at_.assign(vote_fds_.size(), 0);
}

bool Engine::hostStartedVote() {
  const transport::HostLinks* H = links_->host();
  if (const transport::HostSegment* seg = H->segment.get())
    for (int q = 0; q < seg->localSize(); ++q)
      if (seg->words(q).vote_arrive.load(std::memory_order_acquire) > vote_round_) return true;
  return H->local_rank == 0 && peerStartedVote();
}

bool Engine::peerStartedRound() {
  if (!links_->left()) return false;  // a job of one
  const void* p = nullptr;
  try {
    if (vote_host_) return hostStartedVote();
    if (vote_recdbl_) return peerStartedVote();
    return links_->left()->peek(&p, 1) > 0;
  } catch (const Error&) {
    // The left link failed: start a round, which reports it properly
    // (unless this rank is on its way out anyway).
    std::lock_guard<std::mutex> lk(mu_);
    return !stopping_;
  }
}

bool Engine::peerStartedVote() {
  // A round's first bytes may come from any of the vote's partners. A
  // partner that closes its link while this rank is idle has usually shut
  // down (its goodbye reaches this rank through the coordinator as
  // kMsgLeft, after which rounds fail naming it without voting): the link
  // is left alone for kLeftGrace, and only then, or when this rank has
  // work of its own, does a round report it (its exchange fails naming the
  // partner). A killed partner is named sooner by the coordinator.
  transport::PeerLinks& P = links_->host()->peers();
  // A partner opening its link to this idle rank: take it in, and watch it.
  // (Checked on every look for a round, so only while a link is missing.)
  if (!vote_watch_complete_) {
    P.acceptPending();
    if (P.count() != vote_watch_count_) setVoteWatch();
  }
  const void* p = nullptr;
  for (size_t k = 0; k < vote_links_.size(); ++k) {
    const int i = vote_links_[k];
    if (vote_closed_at_[k] > 0) {
      if (left_rank_.load() < 0 && nowSeconds() - vote_closed_at_[k] > kLeftGrace) return true;
      continue;
    }
    try {
      if (P.at(i).recv->peek(&p, 1) > 0) return true;
    } catch (const Error&) {
      {
        std::lock_guard<std::mutex> lk(mu_);
        if (stopping_) return false;
      }
      vote_closed_at_[k] = nowSeconds();
    }
  }
  return false;
}

void Engine::idleWait() {
  if (comm_.size == 1) {  // only GPU work reaches the engine thread
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait_for(lk, std::chrono::duration<double>(kMaxBlock), [&] {
      return news_.load() != seen_news_ || stopping_ || comm_.abort->aborted();
    });
    return;
  }
  transport::Doorbell* bell = links_->bell();
  // Under the host vote a rank other than local rank 0 sleeps on its own
  // doorbell in the host segment, which a local rank starting a round
  // rings (runtime/vote_host.cc), and so does wakeLocal(). Local rank 0
  // polls its links to the other hosts and its wake-up socket instead.
  const transport::HostLinks* H = links_->host();
  transport::HostSegment* seg = vote_host_ ? H->segment.get() : nullptr;
  const bool host_leader = vote_host_ && (!seg || H->local_rank == 0);
  if (seg && !host_leader) bell = &seg->words(H->local_rank).idle;
  // Spin: a peer or a local caller usually shows up within microseconds.
  // A caller driving for its own result spins (its thread only waits
  // anyway). The engine thread spins only where each local rank has a core
  // to spare for it: otherwise its spinning takes the core the framework's
  // own threads need to reach the next collective.
  const bool on_engine_thread = std::this_thread::get_id() == thread_.get_id();
  const bool spin = transport::spinning() && (!on_engine_thread || engine_spins_);
  double yield_start = 0;
  for (int i = spin ? 0 : kSpinChecks; i < kSpinChecks + kYieldChecks; ++i) {
    if (i >= kSpinChecks) {
      // Yields end after kYieldSeconds as well: with many ranks per core
      // each yield waits a turn of every runnable rank.
      double now = nowSeconds();
      if (i == kSpinChecks) yield_start = now;
      else if (now - yield_start > kYieldSeconds) break;
      sched_yield();
    } else {
      transport::cpuRelax();
    }
    if (hasNews() || peerStartedRound()) return;
    if (sync_drivers_.load(std::memory_order_relaxed) > 0 && on_engine_thread)
      return;  // hand over to the caller that wants to drive
    if ((i & 255) == 0 && comm_.abort->aborted()) return;
  }
  // Block until woken, or until an aging tensor or kMaxBlock is due.
  double timeout = kMaxBlock;
  if (waitingCount() > 0 && !aged_)
    timeout = std::min(timeout, std::max(0.0005, fast_oldest_ + agingLimit() - nowSeconds()));
  // The engine thread gives up the driver's seat while it sleeps, so a
  // submitting or waiting caller can drive without waking it.
  const bool release = engine_lock_ && std::this_thread::get_id() == thread_.get_id();
  struct Reseat {
    std::unique_lock<std::mutex>* l;
    ~Reseat() {
      if (l) l->lock();
    }
  };
  const int lfd = links_->left()->pollFd();
  if (host_leader || (!vote_host_ && (vote_recdbl_ || lfd >= 0 || !bell))) {
    idle_blocked_.store(true, std::memory_order_seq_cst);
    // Raised before the last look, so a local rank that votes after it
    // sees it and rings the wake-up socket.
    if (host_leader && seg) seg->leaderPolling().store(1, std::memory_order_seq_cst);
    if (!hasNews() && !peerStartedRound()) {
      Reseat reseat{release ? engine_lock_ : nullptr};
      if (release) engine_lock_->unlock();
      std::vector<struct pollfd> fds;
      fds.reserve(vote_fds_.size() + 2);
      if (vote_recdbl_) {
        for (size_t i = 0; i < vote_fds_.size(); ++i)
          if (vote_closed_at_[i] == 0) fds.push_back({vote_fds_[i], POLLIN, 0});
        // A partner opening a link (its first vote with this rank).
        if (!vote_watch_complete_) fds.push_back({H->peers().listenFd(), POLLIN, 0});
      } else if (lfd >= 0) {
        fds.push_back({lfd, POLLIN, 0});
      }
      if (wake_fd_ >= 0) fds.push_back({wake_fd_, POLLIN, 0});
      if (host_leader && H->wake) fds.push_back({H->wake->fd(), POLLIN, 0});
      ::poll(fds.data(), fds.size(), static_cast<int>(timeout * 1000) + 1);
      uint64_t v;
      if (wake_fd_ >= 0) {
        ssize_t rc = ::read(wake_fd_, &v, sizeof(v));
        (void)rc;
      }
      if (host_leader && H->wake) H->wake->drain();
    }
    if (host_leader && seg) seg->leaderPolling().store(0, std::memory_order_seq_cst);
    idle_blocked_.store(false, std::memory_order_seq_cst);
    return;
  }
  // Same handshake as transport::Waiter: announce sleeping, re-check, sleep.
  // The re-check comes after `sleeping` is raised: the host vote's wakers
  // ring only a sleeper, after storing what the re-check reads.
  uint32_t ticket = bell->seq.load(std::memory_order_seq_cst);
  if (hasNews() || peerStartedRound()) return;
  bell->sleeping.store(1, std::memory_order_seq_cst);
  if (!hasNews() && !peerStartedRound() && bell->seq.load(std::memory_order_seq_cst) == ticket) {
    Reseat reseat{release ? engine_lock_ : nullptr};
    if (release) engine_lock_->unlock();
    transport::futexWait(&bell->seq, ticket, timeout);
  }
  bell->sleeping.store(0, std::memory_order_seq_cst);
}

void Engine::classify(std::vector<std::shared_ptr<Entry>>& fresh) {
  std::vector<std::shared_ptr<Entry>> slow;
  for (auto& e : fresh) {
    // An invalid request never takes a fast path: the coordinator fails it
    // on every rank (validate.cc), and this rank's vote sends the others'
    // waiting tensors of the same name there too.
    if (!e->meta.error.empty()) {
      slow.push_back(e);
      continue;
    }
    auto it = ids_.find(e->meta.name);
    if (cfg_.cache_enabled && it != ids_.end() && e->meta.type != CollectiveType::kJoin &&
        static_cast<size_t>(it->second) < exec_meta_.size() &&
        exec_meta_[it->second] == e->meta && !fast_[it->second]) {
      e->id = it->second;
      fast_[e->id] = e;
      ++fast_count_;
      fast_oldest_ = std::min(fast_oldest_, e->submitted);
    } else if (freshEligible(*e)) {  // engine_fresh.cc
      fresh_.push_back(e);
      fast_oldest_ = std::min(fast_oldest_, e->submitted);
    } else {
      slow.push_back(e);
    }
  }
  // More new tensors than the vote has slots for (a step's first pass):
  // the coordinator negotiates them all and grants ids for the fast path.
  if (fresh_.size() > static_cast<size_t>(kFreshSlots)) {
    slow.insert(slow.end(), fresh_.begin(), fresh_.end());
    fresh_.clear();
  }
  if (!slow.empty()) sendSlow(slow);
}

void Engine::sendSlow(const std::vector<std::shared_ptr<Entry>>& es) {
  wire::Writer w;
  w.put<uint8_t>(kMsgRequests);
  w.put<uint32_t>(static_cast<uint32_t>(es.size()));
  for (auto& e : es) {
    e->id = -1;
    auto it = sent_.find(e->meta.name);
    auto idit = ids_.find(e->meta.name);
    if (cfg_.cache_enabled && it != sent_.end() && idit != ids_.end() && it->second == e->meta) {
      w.put<int32_t>(idit->second);
    } else {
      w.put<int32_t>(-1);
      e->meta.write(w);
      sent_[e->meta.name] = e->meta;
    }
  }
  slow_outstanding_ += es.size();
  sendCtrl(w.bytes());
}

void Engine::round() {
  if (left_rank_.load() >= 0) {
    const int who = left_rank_.load();
    failAll(Status(), [who](const Entry& e) {
      return Status(Code::kAborted, strCat("tensor '", e.meta.name, "' can never complete: rank ",
                                           who, " has already shut down (tfring.shutdown())"));
    });
    return;
  }
  std::vector<std::shared_ptr<Entry>> fresh;
  {
    std::lock_guard<std::mutex> lk(mu_);
    seen_news_ = news_.load(std::memory_order_acquire);
    fresh.swap(incoming_);
  }
  if (fast_.size() < ids_.size()) fast_.resize(ids_.size());
  classify(fresh);

  // The vote.
  const size_t K = ids_.size();
  const size_t fresh_at = kVoteHeader + K;  // engine_fresh.cc's part of the vote
  const size_t rider_at = fresh_at + kFreshTallyWords;  // engine_rider.cc's part
  const VoteExtra rider{riderWords(), &Engine::mergeRider, this};
  vote_.assign(rider_at + rider.words, 1);
  const uint64_t held = recv_seq_.load(std::memory_order_acquire);
  vote_[0] = static_cast<int32_t>(std::min<uint64_t>(held, INT32_MAX));
  for (size_t i = 0; i < K; ++i) vote_[kVoteHeader + i] = fast_[i] ? 1 : 0;
  const int offered = writeFreshVote(vote_.data() + fresh_at);
  bool aged = waitingCount() > 0 && nowSeconds() - fast_oldest_ > agingLimit();
  aged_ = aged;
  vote_[1] = (slow_outstanding_ > 0 || aged) ? 0 : 1;
  vote_[2] = riderProposal();
  if (rider.words) writeRider(vote_.data() + rider_at);
  // Every rank ends with the same tally (runtime/vote.h).
  const VoteExtra* x = rider.words ? &rider : nullptr;
  if (vote_host_) {
    freshListToTally(vote_.data() + fresh_at);
    last_vote_ = hostVote(comm_, ++vote_round_, vote_.data(), fresh_at, &vote_scratch_, x);
  } else if (vote_recdbl_) {
    freshListToTally(vote_.data() + fresh_at);
    last_vote_ = recdblVote(comm_, vote_.data(), fresh_at, &vote_scratch_, x);
  } else {
    last_vote_ = ringVote(comm_, vote_.data(), fresh_at, &vote_scratch_, x);
  }
  // 0. The small allreduce the vote carried, if every rank chose the same;
  // and the room the next round's votes carry, the same on every rank.
  if (rider.words) runRider(vote_.data() + rider_at);
  rider_bytes_ = std::max<int32_t>(vote_[2], 0);

  // 1. Coordinator responses every rank holds, in order.
  const uint64_t upto = static_cast<uint64_t>(vote_[0]);
  while (exec_seq_ < upto) {
    Response resp;
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (responses_.empty() || responses_.front().seq > upto) break;
      resp = std::move(responses_.front());
      responses_.pop_front();
    }
    executeResponse(resp);
  }

  // 2. Cached tensors ready everywhere, fused the same way on every rank.
  std::vector<std::shared_ptr<Entry>> ready;
  for (size_t i = 0; i < K; ++i)
    if (vote_[kVoteHeader + i] == 1 && fast_[i]) {
      ready.push_back(std::move(fast_[i]));
      --fast_count_;
    }
  if (!ready.empty()) {
    std::vector<const Meta*> metas;
    metas.reserve(ready.size());
    for (auto& e : ready) metas.push_back(&e->meta);
    for (auto& idx : fuseReady(metas, cfg_.fusion_threshold)) {
      Group g;
      g.type = ready[idx[0]]->meta.type;
      std::vector<std::shared_ptr<Entry>> es;
      es.reserve(idx.size());
      for (size_t k : idx) es.push_back(ready[k]);
      if (g.type == CollectiveType::kAllgather || g.type == CollectiveType::kAlltoall)
        g.dim0s.push_back(exec_dim0s_[es[0]->id]);
      runGroup(g, es);
    }
  }

  // 2b. New names every rank offered alike (engine_fresh.cc).
  runFresh(vote_.data() + fresh_at, offered);

  // 3. Someone needs the coordinator: it must see every waiting tensor.
  if (vote_[1] == 0) {
    aged_ = false;
    if (waitingCount() > 0) {
      std::vector<std::shared_ptr<Entry>> move;
      for (auto& f : fast_)
        if (f) move.push_back(std::move(f));
      fast_count_ = 0;
      move.insert(move.end(), fresh_.begin(), fresh_.end());
      fresh_.clear();
      sendSlow(move);
    }
  }
  fast_oldest_ = 1e300;
  for (auto& f : fast_)
    if (f) fast_oldest_ = std::min(fast_oldest_, f->submitted);
  for (auto& f : fresh_) fast_oldest_ = std::min(fast_oldest_, f->submitted);

  // The next round's vote outgrows the host segment's slots: every rank
  // sees the same ids and room here, so all go to recdbl at this point.
  if (vote_host_ &&
      !hostVoteFits(*links_->host(), kVoteHeader + ids_.size() + kFreshTallyWords + riderWords())) {
    vote_host_ = false;
    setVoteWatch();
  }
}

void Engine::executeResponse(const Response& resp) {
  for (auto& p : resp.new_ids) {
    ids_[p.second] = p.first;
    if (exec_meta_.size() <= static_cast<size_t>(p.first)) {
      exec_meta_.resize(p.first + 1);
      exec_dim0s_.resize(p.first + 1);
      fast_.resize(p.first + 1);
    }
  }
  for (auto& g : resp.groups) runSlowGroup(g);
  exec_seq_ = resp.seq;
  wire::Writer w;
  w.put<uint8_t>(kMsgDone);
  w.put<uint64_t>(resp.seq);
  sendCtrl(w.bytes());
}

void Engine::runSlowGroup(const Group& g) {
  std::vector<std::shared_ptr<Entry>> es;
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (auto& n : g.names) {
      auto it = inflight_.find(n);
      if (it != inflight_.end()) es.push_back(it->second);
    }
  }
  if (slow_outstanding_ >= es.size())
    slow_outstanding_ -= es.size();
  else
    slow_outstanding_ = 0;
  if (g.kind != Group::kExec) {
    // Only this rank's own requests fail; ranks without them just log.
    if (es.empty()) TFRING_LOG(kError, g.error);
    finish(es, Status(g.kind == Group::kInvalid ? Code::kInvalidArgument : Code::kMismatch,
                      g.error));
    return;
  }
  if (es.size() != g.names.size()) {
    if (g.fill.size() != g.names.size())
      fail(Code::kInternal, "coordinator scheduled '", g.names[0],
           "' which this rank never submitted");
    // This rank has joined: zeros stand in for what it never submitted
    // (alltoall_join.cc), in the group's order.
    es.clear();
    std::lock_guard<std::mutex> lk(mu_);
    for (size_t i = 0; i < g.names.size(); ++i) {
      auto it = inflight_.find(g.names[i]);
      if (it != inflight_.end()) {
        es.push_back(it->second);
        continue;
      }
      es.push_back(joinFillEntry(g.fill[i]));
      if (timeline_.enabled()) timeline_.begin(g.names[i], "JOINED");  // runGroup ends it
    }
  }
  runGroup(g, es);
}

void Engine::runGroup(const Group& g, const std::vector<std::shared_ptr<Entry>>& es) {
  if (timeline_.enabled()) {
    const std::string args = voteStatsJson();
    for (auto& e : es) {
      timeline_.end(e->meta.name);
      if (last_vote_.size > 0) timeline_.instant(e->meta.name, "VOTE_STATS", args);
      timeline_.begin(e->meta.name, collectiveName(g.type));
    }
  }
  Status st;
  if (!es.empty() && es[0]->req.device >= 0) {
    st = execGpu(g, es);
  } else {
    switch (g.type) {
      case CollectiveType::kAllreduce: execAllreduce(es); break;
      case CollectiveType::kAllgather: execAllgather(*es[0], g.dim0s[0]); break;
      case CollectiveType::kBroadcast: execBroadcast(*es[0]); break;
      case CollectiveType::kReducescatter: execReducescatter(*es[0]); break;
      case CollectiveType::kBarrier: break;
      case CollectiveType::kAlltoall: execAlltoall(*es[0], g.dim0s[0]); break;
      case CollectiveType::kJoin:
        *static_cast<int32_t*>(es[0]->req.output) = static_cast<int32_t>(g.dim0s[0][0]);
        break;
    }
  }
  // Remember what ran, so the next submission with the same Meta can take
  // the fast path; after a local failure this rank renegotiates instead.
  for (size_t i = 0; i < es.size(); ++i) {
    auto it = ids_.find(es[i]->meta.name);
    if (it == ids_.end()) continue;
    exec_meta_[it->second] = st.ok() ? es[i]->meta : Meta();
    if (g.type == CollectiveType::kAllgather || g.type == CollectiveType::kAlltoall)
      exec_dim0s_[it->second] = g.dim0s[0];
  }
  finish(es, st);
}

// The vote of the round that runs a group (runtime/vote.h), for the
// timeline's VOTE_STATS events.
std::string Engine::voteStatsJson() const {
  const VoteStats& v = last_vote_;
  return strCat("{\"algo\":\"", voteAlgoName(v.algo), "\",\"ranks\":", v.size,
                ",\"bytes\":", v.bytes, ",\"hops\":", v.hops, ",\"bytes_sent\":", v.bytes_sent,
                "}");
}

void Engine::finish(const std::vector<std::shared_ptr<Entry>>& es, const Status& st) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (auto& e : es) inflight_.erase(e->meta.name);
  }
  for (auto& e : es) {
    if (timeline_.enabled()) timeline_.end(e->meta.name);
    e->done(st);
  }
}

}  // namespace runtime
}  // namespace tfring
