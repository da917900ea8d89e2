// The agreement protocol: rounds on the data ring (see agreement.h).
//
// A round is a tiny collective in which every rank contributes which of its
// cached tensors are ready, which coordinator responses it has received and
// whether it needs the coordinator; all ranks then execute the same list of
// collectives. Tensors every rank has already negotiated once (they hold a
// cache id) run in the round that finds them ready everywhere, without a
// coordinator round trip, and so do a few new names every rank offers alike
// in the same round (fresh_names.h); anything else (a changed shape, many
// new names at once, a tensor only some ranks submit) goes to the
// coordinator on rank 0 (coordinator.h), whose responses are executed in
// rounds too, so all ranks see one order.
//
// The vote is an int32 vector (its sections: vote_words.h) that the vote's
// collective (vote.h, by the algorithm vote_channel.h picks) turns into the
// same tally on every rank. Every step of it carries bytes, so an idle rank
// joins a round when bytes reach it.
//
// After the vote every rank does the same, in this order:
//   0. completes the small allreduce the vote carried, if every rank chose
//      the same (rider.h);
//   1. executes the coordinator responses every rank holds (kHeldResponse);
//   2. runs the cache ids ready everywhere, fused by fuseReady, then the new
//      names every rank offered alike; names ranks offered differently go to
//      the coordinator, which reports the mismatch;
//   3. if any rank needs the coordinator (kNoCoordinator is 0), sends every
//      tensor still waiting on the fast path to it, so the coordinator sees
//      each tensor from every rank and can report mismatches and stalls by
//      name. While any rank needs it, new tensors reach it too, at the
//      latest in the next round.
// Ids and the Metas they last ran with change only at the same point of a
// round on every rank; a rank whose Meta differs (a new shape) sends the
// tensor to the coordinator and, by its vote, makes every other rank do the
// same.
#include "runtime/agreement.h"

#include <algorithm>

#include "common/clock.h"
#include "common/logging.h"
#include "common/wire.h"
#include "runtime/fusion.h"

namespace tfring {
namespace runtime {

Agreement::Agreement(const Config& cfg, collectives::RingComm& comm,
                     transport::RingLinks& links, Timeline& timeline, Inbox& in, CtrlLink& ctrl,
                     Executors exec)
    : cfg_(cfg),
      comm_(comm),
      timeline_(timeline),
      in_(in),
      ctrl_(ctrl),
      exec_(exec),
      channel_(links, in),
      fresh_(cfg),
      rider_(cfg) {}

double Agreement::agingLimit() const {
  // Long enough that ranks merely out of step stay on the fast path, short
  // enough that the coordinator's stall warning still comes on time.
  return std::max(0.05, std::min(1.0, cfg_.stall_warning_s / 4));
}

bool Agreement::hasNews() {
  if (in_.news.load(std::memory_order_acquire) != seen_news_) return true;
  return !aged_ && waitingCount() > 0 && nowSeconds() - fast_oldest_ > agingLimit();
}

double Agreement::agingDue() const {
  return waitingCount() > 0 && !aged_ ? fast_oldest_ + agingLimit() : 1e300;
}

void Agreement::classify(Entries& fresh) {
  Entries slow;
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
    } else if (it == ids_.end() && fresh_.eligible(*e)) {  // fresh_names.h
      fresh_.waiting().push_back(e);
      fast_oldest_ = std::min(fast_oldest_, e->submitted);
    } else {
      slow.push_back(e);
    }
  }
  // More new tensors than the vote has slots for (a step's first pass):
  // the coordinator negotiates them all and grants ids for the fast path.
  Entries& waiting = fresh_.waiting();
  if (waiting.size() > static_cast<size_t>(kFreshSlots)) {
    slow.insert(slow.end(), waiting.begin(), waiting.end());
    waiting.clear();
  }
  if (!slow.empty()) sendSlow(slow);
}

void Agreement::sendSlow(const Entries& es) {
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
  ctrl_.send(w.bytes());
}

void Agreement::round() {
  if (in_.left_rank.load() >= 0) {
    const int who = in_.left_rank.load();
    failAll(Status(), [who](const Entry& e) {
      return Status(Code::kAborted, strCat("tensor '", e.meta.name, "' can never complete: rank ",
                                           who, " has already shut down (tfring.shutdown())"));
    });
    return;
  }
  Entries fresh;
  {
    std::lock_guard<std::mutex> lk(in_.mu);
    seen_news_ = in_.news.load(std::memory_order_acquire);
    fresh.swap(in_.incoming);
  }
  if (fast_.size() < ids_.size()) fast_.resize(ids_.size());
  classify(fresh);

  // The vote (vote_words.h).
  const size_t K = ids_.size();
  vote_.reset(K, rider_.words());
  const uint64_t held = in_.recv_seq.load(std::memory_order_acquire);
  vote_.header(kHeldResponse) = static_cast<int32_t>(std::min<uint64_t>(held, INT32_MAX));
  for (size_t i = 0; i < K; ++i) vote_.id(i) = fast_[i] ? 1 : 0;
  const int offered = fresh_.write(vote_.fresh());
  bool aged = waitingCount() > 0 && nowSeconds() - fast_oldest_ > agingLimit();
  aged_ = aged;
  vote_.header(kNoCoordinator) = (slow_outstanding_ > 0 || aged) ? 0 : 1;
  vote_.header(kRiderRoom) = rider_.propose(fast_, fresh_.waiting());
  if (vote_.riderWords()) rider_.write(vote_.rider(), fast_, fresh_.waiting());
  const VoteExtra rider = rider_.extra();
  last_vote_ = channel_.exchange(comm_, vote_, vote_.riderWords() ? &rider : nullptr);
  // 0. The small allreduce the vote carried, if every rank chose the same;
  // and the room the next round's votes carry, the same on every rank.
  if (vote_.riderWords()) runRider();
  rider_.setRoom(vote_.header(kRiderRoom));

  // 1. Coordinator responses every rank holds, in order.
  const uint64_t upto = static_cast<uint64_t>(vote_.header(kHeldResponse));
  while (exec_seq_ < upto) {
    Response resp;
    {
      std::lock_guard<std::mutex> lk(in_.mu);
      if (in_.responses.empty() || in_.responses.front().seq > upto) break;
      resp = std::move(in_.responses.front());
      in_.responses.pop_front();
    }
    executeResponse(resp);
  }

  // 2. Cached tensors ready everywhere, fused the same way on every rank.
  Entries ready;
  for (size_t i = 0; i < K; ++i)
    if (vote_.id(i) == 1 && fast_[i]) {
      ready.push_back(std::move(fast_[i]));
      --fast_count_;
    }
  if (!ready.empty()) runFused(ready, true);

  // 2b. New names every rank offered alike (fresh_names.h), and those
  // ranks disagree on, which the coordinator reports by name.
  Entries run, conflict;
  fresh_.settle(vote_.fresh(), offered, &run, &conflict);
  if (!run.empty()) runFused(run, false);
  if (!conflict.empty()) sendSlow(conflict);

  // 3. Someone needs the coordinator: it must see every waiting tensor.
  if (vote_.header(kNoCoordinator) == 0) {
    aged_ = false;
    if (waitingCount() > 0) {
      Entries move;
      for (auto& f : fast_)
        if (f) move.push_back(std::move(f));
      fast_count_ = 0;
      Entries& waiting = fresh_.waiting();
      move.insert(move.end(), waiting.begin(), waiting.end());
      waiting.clear();
      sendSlow(move);
    }
  }
  fast_oldest_ = 1e300;
  for (auto& f : fast_)
    if (f) fast_oldest_ = std::min(fast_oldest_, f->submitted);
  for (auto& f : fresh_.waiting()) fast_oldest_ = std::min(fast_oldest_, f->submitted);

  // The next round's vote may outgrow the host segment's slots.
  channel_.leaveHostIfFull(VoteWords::size(ids_.size(), rider_.words()));
}

void Agreement::runRider() {
  int32_t id = -1;
  std::shared_ptr<Entry> e = rider_.settle(vote_.rider(), &id);
  if (!e) return;
  if (id >= 0) {
    fast_[id].reset();
    --fast_count_;
  }
  const Meta& m = e->meta;
  if (timeline_.enabled()) {
    timeline_.end(m.name);
    timeline_.instant(m.name, "VOTE_STATS", voteStatsJson());
    timeline_.begin(m.name, "ALLREDUCE_IN_VOTE");
  }
  rider_.complete(*e, vote_.rider(), comm_.size, last_vote_, comm_.stats.get());
  traceCollective(timeline_, *comm_.stats, *e, "ALLREDUCE_STATS");
  finish({e}, Status());
}

void Agreement::executeResponse(const Response& resp) {
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
  ctrl_.send(w.bytes());
}

void Agreement::runSlowGroup(const Group& g) {
  Entries es;
  {
    std::lock_guard<std::mutex> lk(in_.mu);
    for (auto& n : g.names) {
      auto it = in_.inflight.find(n);
      if (it != in_.inflight.end()) es.push_back(it->second);
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
    std::lock_guard<std::mutex> lk(in_.mu);
    for (size_t i = 0; i < g.names.size(); ++i) {
      auto it = in_.inflight.find(g.names[i]);
      if (it != in_.inflight.end()) {
        es.push_back(it->second);
        continue;
      }
      es.push_back(joinFillEntry(g.fill[i]));
      if (timeline_.enabled()) timeline_.begin(g.names[i], "JOINED");  // runGroup ends it
    }
  }
  runGroup(g, es);
}

void Agreement::runFused(const Entries& ready, bool cached) {
  std::vector<const Meta*> metas;
  metas.reserve(ready.size());
  for (auto& e : ready) metas.push_back(&e->meta);
  for (auto& idx : fuseReady(metas, cfg_.fusion_threshold)) {
    Group g;
    g.type = ready[idx[0]]->meta.type;
    Entries es;
    es.reserve(idx.size());
    for (size_t k : idx) {
      es.push_back(ready[k]);
      if (!cached) g.names.push_back(ready[k]->meta.name);
    }
    // A cached allgather or alltoall runs with the rows it last ran with.
    if (cached && (g.type == CollectiveType::kAllgather || g.type == CollectiveType::kAlltoall))
      g.dim0s.push_back(exec_dim0s_[es[0]->id]);
    runGroup(g, es);
  }
}

void Agreement::runGroup(const Group& g, const Entries& es) {
  if (timeline_.enabled()) {
    const std::string args = voteStatsJson();
    for (auto& e : es) {
      timeline_.end(e->meta.name);
      if (last_vote_.size > 0) timeline_.instant(e->meta.name, "VOTE_STATS", args);
      timeline_.begin(e->meta.name, collectiveName(g.type));
    }
  }
  Status st = exec_.of(es).run(g, es);
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

std::string Agreement::voteStatsJson() const {
  const VoteStats& v = last_vote_;
  return strCat("{\"algo\":\"", voteAlgoName(v.algo), "\",\"ranks\":", v.size,
                ",\"bytes\":", v.bytes, ",\"hops\":", v.hops, ",\"bytes_sent\":", v.bytes_sent,
                "}");
}

void Agreement::finish(const Entries& es, const Status& st) {
  {
    std::lock_guard<std::mutex> lk(in_.mu);
    for (auto& e : es) in_.inflight.erase(e->meta.name);
  }
  for (auto& e : es) {
    if (timeline_.enabled()) timeline_.end(e->meta.name);
    e->done(st);
  }
}

void Agreement::failAll(const Status& s, const std::function<Status(const Entry&)>& per_entry) {
  Entries es;
  {
    std::lock_guard<std::mutex> lk(in_.mu);
    for (auto& kv : in_.inflight) es.push_back(kv.second);
    in_.inflight.clear();
    in_.incoming.clear();
    in_.stopping = true;
  }
  for (auto& f : fast_) f.reset();
  fast_count_ = 0;
  fresh_.waiting().clear();
  for (auto& e : es) e->done(per_entry ? per_entry(*e) : s);
}

}  // namespace runtime
}  // namespace tfring
