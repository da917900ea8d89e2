#include "runtime/coordinator.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cerrno>
#include <cstring>

#include "common/clock.h"
#include "common/logging.h"
#include "common/net.h"

namespace tfring {
namespace runtime {

namespace {

// How long an aborted coordinator keeps draining connections (see loop()).
constexpr double kDrainSeconds = 10.0;

}  // namespace

Coordinator::Coordinator(std::vector<int> fds, std::vector<std::string> rank_desc,
                         const Config& cfg)
    : fds_(std::move(fds)), desc_(std::move(rank_desc)), cfg_(cfg) {
  size_ = static_cast<int>(fds_.size());
  bye_.assign(size_, false);
  gone_.assign(size_, false);
  done_.assign(size_, 0);
  last_meta_.resize(size_);
  joined_.assign(size_, false);
  local_efd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  last_heard_.assign(size_, nowSeconds());
}

double Coordinator::pingInterval(double timeout_s) {
  return std::max(0.1, std::min(5.0, timeout_s / 8));
}

double Coordinator::silenceLimit(double timeout_s) { return 0.7 * timeout_s; }

void Coordinator::checkLiveness(double now) {
  for (int r = 0; r < size_; ++r) {
    if (gone_[r] || bye_[r] || fds_[r] < 0) continue;
    double quiet = now - last_heard_[r];
    if (quiet > silenceLimit(cfg_.timeout_s)) {
      abortAll(r, strCat(desc_[r], " has not answered the coordinator for ", int(quiet),
                         " s: the process is stopped or hung (SIGSTOP, swapped out, a debugger)"
                         " although its connection is up"));
      return;
    }
  }
  wire::Writer w;
  w.put<uint8_t>(kMsgPing);
  for (int r = 1; r < size_; ++r) {
    if (gone_[r] || fds_[r] < 0) continue;
    try {
      // Never block on a stopped rank: a ping that does not fit is skipped.
      wire::sendFrame(fds_[r], w.bytes(), Deadline::in(0.05), desc_[r]);
    } catch (const Error&) {
    }
  }
}

Coordinator::~Coordinator() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
  for (int fd : fds_)
    if (fd >= 0) net::closeFd(fd);
  if (local_efd_ >= 0) ::close(local_efd_);
}

void Coordinator::postLocal(const std::vector<uint8_t>& msg) {
  {
    std::lock_guard<std::mutex> lk(local_mu_);
    local_in_.push_back(msg);
  }
  uint64_t one = 1;
  ssize_t rc = ::write(local_efd_, &one, sizeof(one));
  (void)rc;
}

void Coordinator::setLocalSink(std::function<void(const std::vector<uint8_t>&)> sink) {
  local_sink_ = std::move(sink);
}

double Coordinator::nextDeadline() const {
  if (ready_.empty() || !errors_.empty()) return 1e300;
  return ready_.front().since + cfg_.cycle_time_ms * 1e-3;
}

void Coordinator::start() { thread_ = std::thread([this] { loop(); }); }

void Coordinator::join(double timeout_s) {
  // The loop ends by itself once every rank has said goodbye and closed
  // its connection (or after an abort); past the deadline we stop it.
  Deadline d = Deadline::in(timeout_s);
  while (thread_.joinable() && !finished_.load() && !d.expired()) usleep(2000);
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

void Coordinator::sendAll(const std::vector<uint8_t>& payload, int except) {
  // The rank served in process hears last: once it learns (of an abort,
  // say) its script may exit and end this process, and every other rank
  // must have the message in its socket by then, or it would see only rank
  // 0's connection drop and blame rank 0.
  bool local = false;
  for (int r = 0; r < size_; ++r) {
    if (r == except || gone_[r]) continue;
    if (fds_[r] < 0) {
      local = true;
      continue;
    }
    try {
      wire::sendFrame(fds_[r], payload, Deadline::in(cfg_.timeout_s), desc_[r]);
    } catch (const Error&) {
      gone_[r] = true;  // its reader will see the connection drop
    }
  }
  if (local && local_sink_) local_sink_(payload);
}

void Coordinator::abortAll(int culprit, const std::string& msg, int reporter) {
  if (aborted_) return;
  aborted_ = true;
  TFRING_LOG(kError, msg);
  wire::Writer w;
  w.put<uint8_t>(kMsgAbort);
  // Engines print it as "rank <culprit>: ...": the job's rank number.
  w.put<int32_t>(label_(culprit));
  w.putStr(msg);
  sendAll(w.bytes(), reporter >= 0 ? reporter : culprit);  // it knows already
  abort_sent_.store(true);
}

bool Coordinator::waitAbortSent(double timeout_s) const {
  Deadline d = Deadline::in(timeout_s);
  while (!abort_sent_.load() && !finished_.load() && !d.expired()) usleep(1000);
  return abort_sent_.load();
}

void Coordinator::loop() {
  struct Finish {
    std::atomic<bool>& f;
    ~Finish() { f = true; }
  } finish{finished_};
  std::vector<struct pollfd> pfds(size_);
  double next_stall_check = nowSeconds() + 0.5;
  double next_ping = nowSeconds() + pingInterval(cfg_.timeout_s);
  // After an abort the coordinator stays to drain: it keeps reading (and
  // dropping) what ranks still send until they close their connections, so
  // that this process exiting never resets a connection whose Abort the
  // peer has not read yet (a reset discards unread data).
  double drain_until = 0;
  while (!stop_) {
    if (aborted_ && drain_until == 0) drain_until = nowSeconds() + kDrainSeconds;
    if (aborted_ && nowSeconds() >= drain_until) break;
    int n = 0;
    std::vector<int> who;
    for (int r = 0; r < size_; ++r) {
      if (gone_[r]) continue;
      // Rank 0 is served in process: its messages come through the eventfd.
      pfds[n] = {fds_[r] >= 0 ? fds_[r] : local_efd_, POLLIN, 0};
      who.push_back(r);
      ++n;
    }
    if (n == 0) break;
    // Sleep until a message, the end of a fusion hold or the stall check.
    double now = nowSeconds();
    double until = std::min({next_stall_check, next_ping, nextDeadline()});
    int ms = static_cast<int>(std::ceil(std::max(0.0, until - now) * 1e3));
    int rc = ::poll(pfds.data(), n, std::min(ms, 100));
    if (rc < 0 && errno != EINTR) break;
    for (int i = 0; i < n && rc > 0; ++i) {
      if (!(pfds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      int r = who[i];
      std::vector<std::vector<uint8_t>> msgs;
      if (fds_[r] < 0) {
        uint64_t v;
        ssize_t got = ::read(local_efd_, &v, sizeof(v));
        (void)got;
        std::lock_guard<std::mutex> lk(local_mu_);
        msgs.swap(local_in_);
      } else {
        try {
          msgs.push_back(wire::recvFrame(fds_[r], Deadline::in(cfg_.timeout_s), desc_[r]));
        } catch (const Error&) {
          gone_[r] = true;
          if (!bye_[r]) {
            abortAll(r, strCat(desc_[r], " exited or lost its connection to the coordinator"
                                         " (process died, was killed, or its host failed)"));
          }
          continue;
        }
      }
      last_heard_[r] = nowSeconds();
      for (auto& msg : msgs) {
        if (aborted_) {
          if (!msg.empty() && msg[0] == kMsgBye) bye_[r] = true;
        } else {
          try {
            onMessage(r, msg);
          } catch (const Error& e) {
            abortAll(r, strCat("bad control message from ", desc_[r], ": ", e.what()));
          }
        }
        // Rank 0 has no connection to close: its goodbye is its last word.
        if (fds_[r] < 0 && bye_[r]) gone_[r] = true;
      }
    }
    if (aborted_) continue;
    if (nowSeconds() >= next_stall_check) {
      checkStalls();
      next_stall_check = nowSeconds() + 0.5;
    }
    if (nowSeconds() >= next_ping) {
      checkLiveness(nowSeconds());
      next_ping = nowSeconds() + pingInterval(cfg_.timeout_s);
      if (aborted_) continue;
    }
    maybeEmit();
  }
}

void Coordinator::onMessage(int rank, const std::vector<uint8_t>& msg) {
  wire::Reader rd(msg);
  auto type = rd.get<uint8_t>();
  switch (type) {
    case kMsgRequests: {
      uint32_t n = rd.get<uint32_t>();
      for (uint32_t i = 0; i < n; ++i) {
        int32_t id = rd.get<int32_t>();
        if (id >= 0) {
          auto it = last_meta_[rank].find(id);
          if (it == last_meta_[rank].end())
            fail(Code::kInternal, "unknown cache id ", id);
          onMeta(rank, it->second);
        } else {
          onMeta(rank, Meta::read(rd));
        }
      }
      break;
    }
    case kMsgDone:
      done_[rank] = std::max(done_[rank], rd.get<uint64_t>());
      break;
    case kMsgPong:
      break;  // last_heard_ is updated for every message
    case kMsgBye: {
      bye_[rank] = true;
      {
        // Ranks still running must not wait in a round for this one.
        wire::Writer w;
        w.put<uint8_t>(kMsgLeft);
        w.put<int32_t>(rank);
        sendAll(w.bytes(), rank);
      }
      // Nothing that still waits for this rank can ever complete.
      std::vector<std::string> dead;
      for (auto& kv : pending_)
        if (!kv.second.have[rank]) dead.push_back(kv.first);
      for (auto& name : dead) {
        errorGroup({name}, strCat("tensor '", name, "' can never complete: rank ", label_(rank),
                                  " shut down without submitting it"));
        pending_.erase(name);
      }
      break;
    }
    case kMsgError: {
      std::string text = rd.getStr();
      // A rank reporting a broken link names the peer it blames: the abort
      // then names that peer as the culprit, not the rank that noticed.
      const int suspect = rd.get<int32_t>();
      abortAll(suspect >= 0 && suspect < size_ ? suspect : rank, text, rank);
      break;
    }
    default:
      fail(Code::kInternal, "unknown message type ", int(type));
  }
}

void Coordinator::onMeta(int rank, Meta meta) {
  const std::string name = meta.name;
  // Remember what this rank sent so it can use the id next time.
  auto idit = ids_.find(name);
  int32_t id;
  if (idit == ids_.end()) {
    id = static_cast<int32_t>(ids_.size());
    ids_[name] = id;
    new_ids_.emplace_back(id, name);
  } else {
    id = idit->second;
  }
  last_meta_[rank][id] = meta;

  for (int r = 0; r < size_; ++r) {
    if (bye_[r] && r != rank) {
      errorGroup({name}, strCat("tensor '", name, "' can never complete: rank ", label_(r),
                                " has already shut down"));
      return;
    }
  }
  auto& p = pending_[name];
  if (p.metas.empty()) {
    p.id = id;
    p.metas.resize(size_);
    p.have.assign(size_, false);
    p.first_seen = nowSeconds();
  }
  if (p.have[rank]) {
    // The engine rejects duplicates locally; reaching here is a bug.
    fail(Code::kInternal, "rank ", rank, " submitted '", name, "' twice");
  }
  p.have[rank] = true;
  const bool joins = meta.type == CollectiveType::kJoin;
  p.metas[rank] = std::move(meta);
  ++p.count;
  if (joins) onJoined(rank);  // may complete this name too
  auto it = pending_.find(name);
  if (it != pending_.end() && complete(it->second)) {
    validate(name, it->second);
    pending_.erase(it);
  }
}

void Coordinator::errorGroup(const std::vector<std::string>& names, const std::string& msg,
                             Group::Kind kind) {
  Group g;
  g.kind = kind;
  g.names = names;
  g.error = msg;
  errors_.push_back(std::move(g));
}

void Coordinator::checkStalls() {
  double now = nowSeconds();
  std::vector<std::string> expired;
  for (auto& kv : pending_) {
    Pending& p = kv.second;
    double age = now - p.first_seen;
    std::vector<int> missing, have;
    for (int r = 0; r < size_; ++r) (p.have[r] ? have : missing).push_back(r);
    if (age >= cfg_.timeout_s) {
      errorGroup({kv.first}, strCat("tensor '", kv.first, "' was submitted by ranks [",
                                    label_.list(have), "] but not by ranks [", label_.list(missing),
                                    "] within TFRING_TIMEOUT=", cfg_.timeout_s, " s"));
      expired.push_back(kv.first);
    } else if (age >= cfg_.stall_warning_s && !p.stall_warned) {
      p.stall_warned = true;
      std::string msg = strCat("stall: tensor '", kv.first, "' has been waiting ", int(age),
                               " s; submitted by ranks [", label_.list(have),
                               "], missing ranks [", label_.list(missing), "]");
      TFRING_LOG(kWarning, msg);
      wire::Writer w;
      w.put<uint8_t>(kMsgStall);
      w.putStr(msg);
      sendAll(w.bytes());
    }
  }
  for (auto& n : expired) pending_.erase(n);
}

void Coordinator::maybeEmit() {
  if (ready_.empty() && errors_.empty() && new_ids_.empty()) return;
  // Responses every live rank has finished; ranks that left don't count.
  uint64_t min_done = next_seq_ - 1;
  for (int r = 0; r < size_; ++r)
    if (!bye_[r] && !gone_[r]) min_done = std::min(min_done, done_[r]);
  bool busy = (next_seq_ - 1) - min_done >= 2;
  if (busy && errors_.empty()) return;
  if (errors_.empty() && !ready_.empty()) {
    // Hold briefly for fusion only while more tensors are on their way.
    int64_t bytes = 0;
    for (auto& r : ready_) bytes += r.meta.numElements() * dtypeSize(r.meta.dtype);
    bool more_coming = !pending_.empty();
    double age_ms = (nowSeconds() - ready_.front().since) * 1e3;
    if (more_coming && bytes < cfg_.fusion_threshold && age_ms < cfg_.cycle_time_ms) return;
  }
  if (ready_.empty() && errors_.empty()) return;  // ids alone ride with the next one

  Response resp;
  resp.seq = next_seq_++;
  resp.new_ids.swap(new_ids_);
  resp.groups.swap(errors_);
  // Fuse allreduces that agree on dtype, op, scales and device, in order of
  // first readiness, up to the fusion threshold.
  std::vector<bool> used(ready_.size(), false);
  for (size_t i = 0; i < ready_.size(); ++i) {
    if (used[i]) continue;
    used[i] = true;
    const Meta& a = ready_[i].meta;
    Group g;
    g.type = a.type;
    g.names.push_back(a.name);
    if (a.type == CollectiveType::kAllgather || a.type == CollectiveType::kAlltoall ||
        a.type == CollectiveType::kJoin)
      g.dim0s.push_back(ready_[i].dim0s);
    std::vector<size_t> members{i};
    if (a.type == CollectiveType::kAllreduce) {
      int64_t bytes = a.numElements() * dtypeSize(a.dtype);
      for (size_t j = i + 1; j < ready_.size(); ++j) {
        const Meta& b = ready_[j].meta;
        if (used[j] || b.type != a.type || b.dtype != a.dtype || b.op != a.op ||
            b.prescale != a.prescale || b.postscale != a.postscale || b.device != a.device ||
            b.wire != a.wire)
          continue;
        int64_t bb = b.numElements() * dtypeSize(b.dtype);
        if (bytes + bb > cfg_.fusion_threshold) continue;
        bytes += bb;
        used[j] = true;
        g.names.push_back(b.name);
        members.push_back(j);
      }
    }
    // Joined ranks need every name's Meta to take part with zeros.
    bool fill = false;
    for (size_t k : members) fill = fill || ready_[k].fill;
    if (fill)
      for (size_t k : members) g.fill.push_back(ready_[k].meta);
    resp.groups.push_back(std::move(g));
  }
  ready_.clear();
  wire::Writer w;
  w.put<uint8_t>(kMsgResponse);
  resp.write(w);
  sendAll(w.bytes());
}

}  // namespace runtime
}  // namespace tfring
