// Coordinator: runs on rank 0, in its own thread, and decides what every
// rank executes next.
//
// The coordinator is the slow path: tensors every rank has negotiated
// before run without it (agreement.cc). Each other rank's engine keeps
// one TCP connection to it; rank 0's engine talks to it in process
// (postLocal, and a sink called on the coordinator's thread). When an engine
// sends it a tensor, it sends the tensor's Meta — or, once the coordinator
// has granted the name a cache id and the Meta has not changed, just the id.
// When a name has been submitted by every rank, the coordinator checks that
// the Metas agree (type, dtype, shape, op, root, scales; allgather may
// differ in the first dimension) and appends it to the ready list, or sends
// an error group naming the tensor and the disagreeing ranks. Ready
// tensors go out in Responses: numbered lists of groups that every rank
// executes in the same order, compatible allreduces fused into one group up
// to TFRING_FUSION_THRESHOLD bytes. Engines execute a Response in the first
// round in which every rank holds it. At most two Responses are outstanding
// (ranks report each one done), so tensors that become ready while the ranks
// are busy accumulate and are fused into the next Response; while more
// tensors are pending, a small batch is held up to TFRING_CYCLE_TIME for
// company.
//
// Failure handling. A connection that closes without a goodbye means the
// rank died: every other rank gets an Abort naming it. The coordinator pings
// every rank (pingInterval()) and its reader thread answers; a rank silent
// for 70% of TFRING_TIMEOUT is stopped or hung (SIGSTOP, swapped out), and
// every other rank gets an Abort naming it before their own waits time out
// on whichever neighbour they happened to wait for. Engines likewise give
// up on a coordinator that has sent nothing, not even a ping, for as long. A rank that hits a
// fatal error reports it, and the coordinator relays it as an Abort. Names
// submitted by some ranks only get a stall warning naming the missing ranks
// after TFRING_STALL_CHECK_TIME, and an error at TFRING_TIMEOUT.
//
// Join. A rank that calls join() submits a kJoin request. From then until
// every rank has joined, a name is complete once every rank that has not
// joined submitted it; its group carries the agreed Metas (Group.fill) and
// the joined ranks take part with zeros. Allreduce (any op: the zeros are
// reduced like any input, and Average still divides by the job's size) and
// barrier accept joined ranks; broadcast, allgather, reducescatter and
// alltoall get an error naming the tensor, as in Horovod. When the last
// rank joins, the join completes on every rank with that rank's number.
#pragma once

#include <atomic>
#include <functional>
#include <mutex>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/env.h"
#include "common/rank_labels.h"
#include "runtime/messages.h"

namespace tfring {
namespace runtime {

class Coordinator {
 public:
  // Ping period and silence limit for a job with the given TFRING_TIMEOUT.
  static double pingInterval(double timeout_s);
  static double silenceLimit(double timeout_s);

  // Takes ownership of the accepted connections: fds[r] talks to rank r;
  // fds[0] is -1: rank 0 is served in process through postLocal/setLocalSink.
  Coordinator(std::vector<int> fds, std::vector<std::string> rank_desc,
              const Config& cfg);
  // Rank 0's engine: a message as if read from its connection.
  void postLocal(const std::vector<uint8_t>& msg);
  // Where messages for rank 0 go (called on the coordinator's thread).
  void setLocalSink(std::function<void(const std::vector<uint8_t>&)> sink);
  // A process set's coordinator: the job's rank of each of its ranks, for
  // the culprit an Abort names.
  // How its messages name the ranks (common/rank_labels.h): a process
  // set's coordinator prints its members' global ranks.
  void setRankLabels(RankLabels labels) { label_ = std::move(labels); }
  ~Coordinator();
  void start();
  // Waits (up to timeout_s) for every rank's goodbye, then stops.
  void join(double timeout_s);
  // Waits (up to timeout_s) until an abort has been sent to every rank;
  // false if none was sent by then. Rank 0 calls it before failing its own
  // work on an error of its own, so that its script exiting cannot cut the
  // notice off.
  bool waitAbortSent(double timeout_s) const;

 private:
  struct Pending {
    int32_t id = -1;
    std::vector<Meta> metas;  // per rank
    std::vector<bool> have;
    int count = 0;
    double first_seen = 0;
    bool stall_warned = false;
  };
  struct Ready {
    Meta meta;
    std::vector<int64_t> dim0s;  // allgather
    double since = 0;
    bool fill = false;  // completed without the joined ranks
  };

  void loop();
  void onMessage(int rank, const std::vector<uint8_t>& msg);
  void onMeta(int rank, Meta meta);
  // coordinator_validate.cc: the ranks' Metas of a complete name agree?
  void validate(const std::string& name, Pending& p);
  // Join (coordinator_join.cc).
  bool complete(const Pending& p) const;  // every rank submitted or joined
  void onJoined(int rank);                 // completes what waited for it
  std::string checkJoined(Pending& p, bool* fill);  // error text or ""
  std::string checkAlltoall(const std::string& name, Pending& p,
                            std::vector<int64_t>* matrix);
  void checkStalls();
  void maybeEmit();
  void sendAll(const std::vector<uint8_t>& payload, int except = -1);
  double nextDeadline() const;  // when maybeEmit's fusion hold ends
  void checkLiveness(double now);
  // Tells every rank but `reporter` (default: the culprit), which already
  // knows, that the job fails because of rank `culprit`.
  void abortAll(int culprit, const std::string& msg, int reporter = -1);
  void errorGroup(const std::vector<std::string>& names, const std::string& msg,
                  Group::Kind kind = Group::kError);

  std::vector<int> fds_;
  std::vector<std::string> desc_;
  Config cfg_;
  int size_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> finished_{false};
  std::vector<bool> bye_, gone_;
  std::vector<uint64_t> done_;  // responses completed, per rank
  std::vector<double> last_heard_;  // per rank: when it last sent anything
  uint64_t next_seq_ = 1;
  std::map<std::string, Pending> pending_;
  std::vector<Ready> ready_;
  std::vector<std::pair<int32_t, std::string>> new_ids_;
  std::map<std::string, int32_t> ids_;
  std::vector<std::map<int32_t, Meta>> last_meta_;  // per rank: id -> Meta
  std::vector<Group> errors_;  // error groups waiting for the next Response
  std::vector<bool> joined_;     // ranks that called join(), until all have
  int last_joined_ = -1;
  bool aborted_ = false;
  std::atomic<bool> abort_sent_{false};
  int local_efd_ = -1;  // eventfd: rank 0's engine posted something
  std::mutex local_mu_;
  std::vector<std::vector<uint8_t>> local_in_;
  std::function<void(const std::vector<uint8_t>&)> local_sink_;
  RankLabels label_;  // identity: ranks are the job's
};

}  // namespace runtime
}  // namespace tfring
