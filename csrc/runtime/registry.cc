// The table of this process's communicators (registry.h): building the
// world at init, process sets over it, and tearing all down at shutdown.
//
// A process set is a sub-job. Its members build it with the same
// collective that builds the world (connectComm), through the world's
// store under the prefix "pset/<id>/": a ring over the members in the
// order of their global ranks, an engine with its own threads, and a
// coordinator on the set's first rank. So each set negotiates, caches and
// fuses on its own, and its rounds never involve a rank outside it: two
// disjoint sets run their collectives at the same time. Ranks outside a
// set hold an entry without an engine, so their requests on it are
// refused naming the set.
//
// Cost per set and member: one more engine thread (plus a reader thread,
// or the coordinator's thread on the set's first rank), its shared-memory
// inbox (TFRING_SHM_BUFFER) and host segment, and a TCP connection to the
// set's coordinator (and TCP ring links where the set spans hosts).
//
// Removal: every member first marks its engine as stopping, then meets the
// others at a store barrier, and only then stops: a member's goodbye that
// reaches another is then expected, not a failure of that member's waits
// (which would also fail its waits on the world's ring).
#include "runtime/registry.h"

#include <algorithm>

#include "common/abort.h"
#include "common/logging.h"
#include "runtime/stream_completion.h"
#include "transport/ring_links.h"

namespace tfring {
namespace runtime {

Registry& Registry::get() {
  static Registry* r = new Registry();  // never destroyed: threads may outlive main
  return *r;
}

Status Registry::init(const InitOptions& opts) {
  std::lock_guard<std::mutex> life(lifecycle_);
  if (initialized()) return Status::OK();
  try {
    if (opts.size < 1 || opts.rank < 0 || opts.rank >= opts.size)
      fail(Code::kInvalidArgument, "invalid rank ", opts.rank, " for world size ", opts.size);
    if (opts.size > 1 && !opts.store)
      fail(Code::kInvalidArgument, "a store is required for world size ", opts.size);
    Config cfg = Config::fromEnv();
    log::setLevel(cfg.log_level);
    log::setRank(opts.rank);
    // A new world (an elastic reset): a gated collective's failure in the
    // old one must not fail every collective of this one.
    resetStreamCompletion();

    std::shared_ptr<Comm> world(
        connectComm(opts.store.get(), opts.rank, opts.size, opts.secret, cfg).release());
    world->id = 0;
    world->start();
    // A set's engine spins as the world's does: the host runs all the
    // world's local ranks, whatever the set. The timeline is the world's
    // alone.
    set_cfg_ = world->cfg;
    set_cfg_.host_procs = world->topo.local_size;
    set_cfg_.timeline.clear();
    store_ = opts.store;
    secret_ = opts.secret;
    {
      std::lock_guard<std::mutex> lk(mu_);
      comms_.clear();
      comms_[0] = world;
    }
    world_.store(world.get(), std::memory_order_release);
    TFRING_LOG(kDebug, "initialized: rank ", opts.rank, "/", opts.size, " transport ",
               world->transport);
    return Status::OK();
  } catch (const Error& e) {
    return e.status();
  } catch (const std::exception& e) {
    return Status(Code::kInternal, e.what());
  }
}

void Registry::shutdown() {
  std::lock_guard<std::mutex> life(lifecycle_);
  if (!initialized()) return;
  std::map<int, std::shared_ptr<Comm>> comms;
  {
    std::lock_guard<std::mutex> lk(mu_);
    comms.swap(comms_);
  }
  // The sets first, in id order on every rank, so a set's members stop it
  // at about the same time; then the world, whose ranks are theirs too.
  for (auto& kv : comms) {
    if (kv.first == 0) continue;
    kv.second->removed = true;
    kv.second->stop();
  }
  std::shared_ptr<Comm> world = comms[0];
  world->stop();
  world_.store(nullptr, std::memory_order_release);
  store_.reset();
  // Freed here unless a caller still drives one of them.
  comms.clear();
  world.reset();
}

std::shared_ptr<Comm> Registry::find(int id) const {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = comms_.find(id);
  return it == comms_.end() ? nullptr : it->second;
}

std::vector<int> Registry::setIds() const {
  std::vector<int> ids;
  std::lock_guard<std::mutex> lk(mu_);
  for (const auto& kv : comms_)
    if (kv.first != 0 && !kv.second->removed.load()) ids.push_back(kv.first);
  return ids;
}

int Registry::nextSetId() const {
  std::lock_guard<std::mutex> lk(mu_);
  if (comms_.empty()) return 0;
  return comms_.rbegin()->first + 1;  // removed sets stay as tombstones
}

Status Registry::addSet(int id, const std::vector<int>& ranks) {
  std::lock_guard<std::mutex> life(lifecycle_);
  Comm* w = world();
  if (!w) return Status(Code::kAborted, "tfring is not initialized: call tfring.init() first");
  std::shared_ptr<Comm> s = std::make_shared<Comm>();
  s->id = id;
  s->ranks = ranks;
  if (id <= 0)
    return Status(Code::kInvalidArgument, strCat("process set id ", id, " is not positive"));
  if (auto old = find(id))
    return Status(Code::kInvalidArgument,
                  strCat("process set id ", id, " is already in use by ", old->label()));
  if (ranks.empty()) return Status(Code::kInvalidArgument, strCat(s->label(), " has no ranks"));
  const int world_size = w->topo.size, world_rank = w->topo.rank;
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (ranks[i] < 0 || ranks[i] >= world_size)
      return Status(Code::kInvalidArgument,
                    strCat(s->label(), ": rank ", ranks[i], " is not in [0, ", world_size,
                           ") (the job's ranks)"));
    if (i > 0 && ranks[i] <= ranks[i - 1])
      return Status(Code::kInvalidArgument,
                    strCat(s->label(), ": ranks must be sorted and distinct"));
  }
  auto it = std::find(ranks.begin(), ranks.end(), world_rank);
  if (it != ranks.end()) {
    const int index = static_cast<int>(it - ranks.begin());
    try {
      std::shared_ptr<rendezvous::Store> sub;
      if (store_) sub = std::make_shared<rendezvous::PrefixStore>(strCat("pset/", id), store_);
      auto c = connectComm(sub.get(), index, static_cast<int>(ranks.size()), secret_, set_cfg_,
                           &s->ranks);
      c->id = id;
      c->start();
      s = std::shared_ptr<Comm>(c.release());
    } catch (const Error& e) {
      return Status(e.status().code(), strCat("creating ", s->label(), " on rank ", world_rank,
                                              ": ", e.status().message()));
    }
  }
  std::lock_guard<std::mutex> lk(mu_);
  comms_[id] = s;
  TFRING_LOG(kDebug, "added ", s->label(), s->member() ? "" : " (not a member)");
  return Status::OK();
}

Status Registry::removeSet(int id) {
  std::lock_guard<std::mutex> life(lifecycle_);
  std::shared_ptr<Comm> s = id == 0 ? nullptr : find(id);
  if (!s) return Status(Code::kInvalidArgument, strCat("process set ", id, " does not exist"));
  if (s->removed.exchange(true))
    return Status(Code::kInvalidArgument, strCat(s->label(), " has already been removed"));
  if (!s->member()) return Status::OK();
  s->engine->expectStop();
  try {
    if (store_ && s->ranks.size() > 1) {
      rendezvous::PrefixStore sub(strCat("pset/", id), store_);
      transport::storeBarrier(sub, "remove", s->index, static_cast<int>(s->ranks.size()),
                              set_cfg_.timeout_s);
    }
  } catch (const Error& e) {
    s->stop();
    return Status(e.status().code(), strCat("removing ", s->label(), ": ", e.status().message()));
  }
  s->stop();
  // What stays in the table is a tombstone, so later requests on the id
  // are told the set was removed; the links and threads go with `s` (here,
  // unless a caller still drives its engine).
  auto tomb = std::make_shared<Comm>();
  tomb->id = id;
  tomb->ranks = s->ranks;
  tomb->index = s->index;
  tomb->removed = true;
  std::lock_guard<std::mutex> lk(mu_);
  comms_[id] = tomb;
  return Status::OK();
}

}  // namespace runtime
}  // namespace tfring
