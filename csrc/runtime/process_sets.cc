// Process sets: communicators over some of the world's ranks (runtime.h).
//
// A set is a sub-job. Its members build it with the same collective that
// builds the world (connectComm), through the world's store under the
// prefix "pset/<id>/": a ring over the members in the order of their
// global ranks, an engine with its own threads, and a coordinator on the
// set's first rank. So each set negotiates, caches and fuses on its own,
// and its rounds never involve a rank outside it: two disjoint sets run
// their collectives at the same time. The protocol is unchanged; only the
// ranks in it are the set's (0..n-1). This file translates at the edge:
// a broadcast root given as a global rank becomes the set's index, and an
// error from the set's engine is prefixed with the set and has its rank
// numbers turned back into global ranks.
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
#include "runtime/process_sets.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <map>
#include <mutex>

#include "common/logging.h"
#include "runtime/comm.h"

namespace tfring {
namespace runtime {

namespace {

struct Set {
  int id = 0;
  std::vector<int> ranks;  // sorted global ranks
  int index = -1;          // this rank's place in `ranks`; -1: not a member
  std::shared_ptr<Comm> comm;  // members only
  std::atomic<bool> removed{false};

  std::string label() const {
    std::string s = strCat("process set ", id, " (ranks [");
    for (size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
    return s + "])";
  }
};

struct Table {
  std::mutex mu;
  std::shared_ptr<rendezvous::Store> store;
  std::string secret;
  Config cfg;
  int world_rank = 0, world_size = 1;
  std::map<int, std::shared_ptr<Set>> sets;  // live and removed (flagged)
};

Table& T() {
  static Table* t = new Table();
  return *t;
}

std::shared_ptr<Set> find(int id) {
  Table& t = T();
  std::lock_guard<std::mutex> lk(t.mu);
  auto it = t.sets.find(id);
  return it == t.sets.end() ? nullptr : it->second;
}

std::shared_ptr<Comm> commOf(int id) {
  auto s = find(id);
  if (!s || s->removed.load()) return nullptr;
  Table& t = T();
  std::lock_guard<std::mutex> lk(t.mu);
  return s->comm;
}

// Rewrites the rank numbers of a message from the set's engine (indices
// into the set) as global ranks: "rank 1", "ranks [0, 1]", "rank 0: 1, 2"
// and, in a root mismatch, the root after "vs".
std::string globalRanks(const std::string& msg, const std::vector<int>& ranks) {
  const bool root_mismatch = msg.find("root rank") != std::string::npos;
  std::string out;
  size_t i = 0;
  auto mapNumber = [&](size_t* p) {
    size_t b = *p;
    while (*p < msg.size() && std::isdigit(static_cast<unsigned char>(msg[*p]))) ++*p;
    if (*p == b) return false;
    long v = std::stol(msg.substr(b, *p - b));
    out += (v >= 0 && v < static_cast<long>(ranks.size())) ? std::to_string(ranks[v])
                                                             : msg.substr(b, *p - b);
    return true;
  };
  auto mapList = [&](size_t* p) {  // "1, 2, 3"
    while (mapNumber(p)) {
      if (msg.compare(*p, 2, ", ") != 0 || *p + 2 >= msg.size() ||
          !std::isdigit(static_cast<unsigned char>(msg[*p + 2])))
        break;
      out += ", ";
      *p += 2;
    }
  };
  while (i < msg.size()) {
    const bool word_start = i == 0 || !std::isalpha(static_cast<unsigned char>(msg[i - 1]));
    if (word_start && msg.compare(i, 6, "ranks ") == 0) {
      out += "ranks ";
      i += 6;
      if (i < msg.size() && msg[i] == '[') {
        out += '[';
        ++i;
        mapList(&i);
      } else {
        mapList(&i);
      }
      continue;
    }
    if (word_start && msg.compare(i, 5, "rank ") == 0) {
      out += "rank ";
      i += 5;
      if (mapNumber(&i) && msg.compare(i, 2, ": ") == 0 && i + 2 < msg.size() &&
          std::isdigit(static_cast<unsigned char>(msg[i + 2]))) {
        out += ": ";
        i += 2;
        mapList(&i);
      }
      continue;
    }
    if (root_mismatch && word_start && msg.compare(i, 3, "vs ") == 0) {
      out += "vs ";
      i += 3;
      mapNumber(&i);
      continue;
    }
    out += msg[i++];
  }
  return out;
}

// The error a caller sees for a request on set `s`: named by the set, its
// rank numbers global where they come from the set's own protocol.
Status describe(const Set& s, const Status& st) {
  if (st.ok()) return st;
  std::string msg = st.message();
  if (st.code() == Code::kMismatch || st.code() == Code::kAborted ||
      st.code() == Code::kInvalidArgument)
    msg = globalRanks(msg, s.ranks);
  return Status(st.code(), strCat(s.label(), ": ", msg));
}

}  // namespace

void processSetsInit(std::shared_ptr<rendezvous::Store> store, const std::string& secret,
                     const Config& cfg, const transport::Topology& world) {
  Table& t = T();
  std::lock_guard<std::mutex> lk(t.mu);
  t.store = std::move(store);
  t.secret = secret;
  t.cfg = cfg;
  // A set's engine spins as the world's does: the host runs all the world's
  // local ranks, whatever the set. The timeline is the world's alone.
  t.cfg.host_procs = world.local_size;
  t.cfg.timeline.clear();
  t.world_rank = world.rank;
  t.world_size = world.size;
  t.sets.clear();
}

void processSetsShutdown() {
  Table& t = T();
  std::map<int, std::shared_ptr<Set>> sets;
  {
    std::lock_guard<std::mutex> lk(t.mu);
    sets.swap(t.sets);
    t.store.reset();
  }
  // In id order on every rank, so a set's members stop it at about the same
  // time.
  for (auto& kv : sets) {
    kv.second->removed = true;
    if (kv.second->comm) kv.second->comm->stop();
  }
}

Status addProcessSet(int id, const std::vector<int>& ranks) {
  Table& t = T();
  std::shared_ptr<Set> s = std::make_shared<Set>();
  s->id = id;
  s->ranks = ranks;
  std::shared_ptr<rendezvous::Store> store;
  Config cfg;
  std::string secret;
  {
    std::lock_guard<std::mutex> lk(t.mu);
    if (!isInitialized())
      return Status(Code::kAborted, "tfring is not initialized: call tfring.init() first");
    if (id <= 0)
      return Status(Code::kInvalidArgument, strCat("process set id ", id, " is not positive"));
    if (t.sets.count(id))
      return Status(Code::kInvalidArgument,
                    strCat("process set id ", id, " is already in use by ", t.sets[id]->label()));
    if (ranks.empty())
      return Status(Code::kInvalidArgument, strCat(s->label(), " has no ranks"));
    for (size_t i = 0; i < ranks.size(); ++i) {
      if (ranks[i] < 0 || ranks[i] >= t.world_size)
        return Status(Code::kInvalidArgument,
                      strCat(s->label(), ": rank ", ranks[i], " is not in [0, ", t.world_size,
                             ") (the job's ranks)"));
      if (i > 0 && ranks[i] <= ranks[i - 1])
        return Status(Code::kInvalidArgument,
                      strCat(s->label(), ": ranks must be sorted and distinct"));
    }
    auto it = std::find(ranks.begin(), ranks.end(), t.world_rank);
    if (it != ranks.end()) s->index = static_cast<int>(it - ranks.begin());
    store = t.store;
    cfg = t.cfg;
    secret = t.secret;
  }
  if (s->index >= 0) {
    try {
      std::shared_ptr<rendezvous::Store> sub;
      if (store) sub = std::make_shared<rendezvous::PrefixStore>(strCat("pset/", id), store);
      auto c = connectComm(sub.get(), s->index, static_cast<int>(ranks.size()), secret, cfg,
                           &s->ranks);
      c->start();
      s->comm = std::shared_ptr<Comm>(c.release());
    } catch (const Error& e) {
      return Status(e.status().code(),
                    strCat("creating ", s->label(), " on rank ", t.world_rank, ": ",
                           e.status().message()));
    }
  }
  std::lock_guard<std::mutex> lk(t.mu);
  t.sets[id] = s;
  TFRING_LOG(kDebug, "added ", s->label(), s->index >= 0 ? "" : " (not a member)");
  return Status::OK();
}

Status removeProcessSet(int id) {
  Table& t = T();
  std::shared_ptr<Set> s = find(id);
  if (!s) return Status(Code::kInvalidArgument, strCat("process set ", id, " does not exist"));
  if (s->removed.exchange(true))
    return Status(Code::kInvalidArgument, strCat(s->label(), " has already been removed"));
  std::shared_ptr<Comm> comm;
  std::shared_ptr<rendezvous::Store> store;
  {
    std::lock_guard<std::mutex> lk(t.mu);
    comm = s->comm;
    store = t.store;
  }
  if (!comm) return Status::OK();
  comm->engine->expectStop();
  try {
    if (store && s->ranks.size() > 1) {
      rendezvous::PrefixStore sub(strCat("pset/", id), store);
      transport::storeBarrier(sub, "remove", s->index, static_cast<int>(s->ranks.size()),
                              t.cfg.timeout_s);
    }
  } catch (const Error& e) {
    comm->stop();
    return Status(e.status().code(),
                  strCat("removing ", s->label(), ": ", e.status().message()));
  }
  comm->stop();
  {
    std::lock_guard<std::mutex> lk(t.mu);
    s->comm.reset();  // freed here unless a caller still drives it
  }
  return Status::OK();
}

std::vector<int> processSetRanks(int id) {
  auto s = find(id);
  if (!s || s->removed.load()) return {};
  return s->ranks;
}

Status processSetEnqueue(std::vector<Request> reqs, std::vector<DoneCallback> dones) {
  const int id = reqs[0].process_set;
  const std::string& name = reqs[0].name;
  const char* what = collectiveName(reqs[0].type);
  for (auto& r : reqs)
    if (r.process_set != id)
      return Status(Code::kInvalidArgument,
                    strCat("tensors '", name, "' and '", r.name,
                           "' are submitted together but name different process sets (", id,
                           " and ", r.process_set, ")"));
  std::shared_ptr<Set> s = find(id);
  if (!s)
    return Status(Code::kInvalidArgument,
                  strCat(what, " of tensor '", name, "': process set ", id,
                         " does not exist (create it with tfring.add_process_set or "
                         "tfring.init(process_sets=...))"));
  if (s->removed.load())
    return Status(Code::kInvalidArgument, strCat(what, " of tensor '", name, "' on ",
                                                 s->label(), ": the set has been removed"));
  if (s->index < 0)
    return Status(Code::kInvalidArgument,
                  strCat(what, " of tensor '", name, "' on ", s->label(), ": rank ",
                         T().world_rank, " is not in the set, so it cannot take part"));
  for (auto& r : reqs) {
    if (r.type != CollectiveType::kBroadcast) continue;
    auto it = std::find(s->ranks.begin(), s->ranks.end(), r.root);
    if (it == s->ranks.end()) {
      // Failed on every member by the set's coordinator (validate.cc).
      r.error = strCat("broadcast of tensor '", r.name, "': root_rank=", r.root,
                       " is not a member of the set");
      r.root = 0;
      continue;
    }
    r.root = static_cast<int>(it - s->ranks.begin());
  }
  std::shared_ptr<Comm> comm = commOf(id);
  if (!comm)
    return Status(Code::kInvalidArgument, strCat(what, " of tensor '", name, "' on ",
                                                 s->label(), ": the set has been removed"));
  for (auto& d : dones) {
    DoneCallback inner = std::move(d);
    d = [s, inner](const Status& st) { inner(describe(*s, st)); };
  }
  return describe(*s, comm->engine->enqueue(std::move(reqs), std::move(dones)));
}

void processSetDrive(int id, const std::function<bool()>& done,
                     const std::function<void()>& wait) {
  std::shared_ptr<Comm> comm = commOf(id);
  if (!comm) {
    while (!done()) wait();
    return;
  }
  comm->engine->drive(done, wait);
}

void processSetTryDrive(int id) {
  std::shared_ptr<Comm> comm = commOf(id);
  if (comm) comm->engine->tryDrive();
}

}  // namespace runtime
}  // namespace tfring
