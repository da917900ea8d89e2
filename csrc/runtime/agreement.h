// Agreement: the rounds in which all ranks agree on what to execute next
// (the protocol: agreement.cc).
//
// The driver (engine.h) calls round() when hasNews() or peerStartedRound()
// says there is something to agree on; one thread at a time (the driver's
// seat). The Agreement owns what rounds remember: the cache ids granted by
// the coordinator and the Meta each last ran with, the tensors waiting on
// the fast path, the fresh names (fresh_names.h), the rider (rider.h) and
// how the vote travels (vote_channel.h).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <unordered_map>
#include <vector>

#include "collectives/ring.h"
#include "common/env.h"
#include "runtime/ctrl_link.h"
#include "runtime/entry.h"
#include "runtime/executor.h"
#include "runtime/fresh_names.h"
#include "runtime/inbox.h"
#include "runtime/rider.h"
#include "runtime/timeline.h"
#include "runtime/vote.h"
#include "runtime/vote_channel.h"
#include "runtime/vote_words.h"
#include "transport/ring_links.h"

namespace tfring {
namespace runtime {

class Agreement {
 public:
  Agreement(const Config& cfg, collectives::RingComm& comm, transport::RingLinks& links,
            Timeline& timeline, Inbox& in, CtrlLink& ctrl, Executors exec);
  // Whether this rank has something a round should see: submissions or
  // coordinator news since the last round, or a tensor that has waited on
  // the fast path past agingLimit().
  bool hasNews();
  // Whether a peer started a round this rank has not joined.
  bool peerStartedRound() { return channel_.peerStartedRound(); }
  // One round: takes in the news, votes, and executes what the tally says
  // every rank executes now. Throws on a local failure (fatal to the job).
  void round();
  // Fails every queued entry with `s`, or with per_entry(entry) when given;
  // no new work is accepted after.
  void failAll(const Status& s, const std::function<Status(const Entry&)>& per_entry = nullptr);

  // For the idle wait (idle_wait.h).
  const VoteChannel& channel() const { return channel_; }
  void addPollFds(std::vector<struct pollfd>* fds) const { channel_.addPollFds(fds); }
  uint64_t seenNews() const { return seen_news_; }
  // When a tensor waiting on the fast path ages (1e300: none will).
  double agingDue() const;

 private:
  double agingLimit() const;
  size_t waitingCount() const { return fast_count_ + fresh_.waiting().size(); }
  // Sorts new entries: a cache id's fast path, the fresh names, or the
  // coordinator.
  void classify(Entries& fresh);
  void sendSlow(const Entries& es);  // to the coordinator
  void runRider();
  void executeResponse(const Response& resp);
  void runSlowGroup(const Group& g);
  // Fuses entries every rank has alike (fuseReady) and runs the groups.
  void runFused(const Entries& ready, bool cached);
  void runGroup(const Group& g, const Entries& es);
  void finish(const Entries& es, const Status& st);
  std::string voteStatsJson() const;

  const Config& cfg_;
  collectives::RingComm& comm_;
  Timeline& timeline_;
  Inbox& in_;
  CtrlLink& ctrl_;
  Executors exec_;
  VoteChannel channel_;
  VoteWords vote_;
  FreshNames fresh_;
  Rider rider_;
  VoteStats last_vote_;  // this engine's last round, for the timeline

  uint64_t seen_news_ = 0;
  uint64_t exec_seq_ = 0;  // last response executed
  size_t slow_outstanding_ = 0;
  bool aged_ = false;      // a fast tensor waited past agingLimit()
  std::unordered_map<std::string, int32_t> ids_;  // granted cache ids
  std::vector<Meta> exec_meta_;                   // id -> last run meta
  std::vector<std::vector<int64_t>> exec_dim0s_;  // id -> allgather rows
  Entries fast_;                                  // id -> waiting entry
  size_t fast_count_ = 0;
  double fast_oldest_ = 1e300;                    // oldest submitted
  std::unordered_map<std::string, Meta> sent_;    // last Meta sent per name
};

}  // namespace runtime
}  // namespace tfring
