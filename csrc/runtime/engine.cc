#include "runtime/engine.h"

#include <sys/socket.h>

#include "common/abort.h"
#include "common/logging.h"
#include "common/net.h"

namespace tfring {
namespace runtime {

Engine::Engine(std::unique_ptr<transport::RingLinks> links, int ctrl_fd, const Config& cfg)
    : links_(std::move(links)), ctrl_fd_(ctrl_fd), cfg_(cfg) {
  const auto& T = links_->topology();
  waiter_.reset(new transport::Waiter(links_->bell(), links_->right(), links_->left()));
  comm_.size = T.size;
  comm_.pos = T.ring_pos;
  comm_.ring = T.ring;
  comm_.right = links_->right();
  comm_.left = links_->left();
  comm_.waiter = waiter_.get();
  comm_.chunk_bytes = static_cast<size_t>(cfg.chunk_bytes);
  comm_.timeout_s = cfg.timeout_s;
  if (!cfg.timeline.empty()) timeline_.open(cfg.timeline, T.rank);
}

Engine::~Engine() { stop(); }

void Engine::start() {
  AbortState::get().setWaker([this] {
    links_->wake();
    cv_.notify_all();
  });
  thread_ = std::thread([this] { loop(); });
  reader_ = std::thread([this] { readerLoop(); });
}

Status Engine::enqueue(Request req, DoneCallback done) {
  auto e = std::make_shared<Entry>();
  Meta& m = e->meta;
  m.name = req.name;
  m.type = req.type;
  m.dtype = req.dtype;
  m.shape = req.shape;
  m.op = req.op;
  m.root = req.root;
  m.prescale = req.prescale;
  m.postscale = req.postscale;
  // Ranks agree on host vs GPU; GPU ordinals legitimately differ per rank.
  m.device = req.device < 0 ? -1 : 0;
  for (auto d : req.shape)
    if (d < 0)
      return Status(Code::kInvalidArgument,
                    strCat("tensor '", req.name, "' has a negative dimension ", m.shapeString()));
  e->req = std::move(req);
  e->done = std::move(done);
  if (e->req.device >= 0) {  // without CUDA: "... has no CUDA support ..."
    Status s = acceptGpu(*e);
    if (!s.ok()) return s;
  }
  std::lock_guard<std::mutex> lk(mu_);
  if (AbortState::get().aborted()) return AbortState::get().status();
  if (stopping_) return Status(Code::kAborted, "tfring has been shut down");
  if (inflight_.count(e->meta.name))
    return Status(Code::kInvalidArgument,
                  strCat("a collective named '", e->meta.name,
                         "' is already in flight on this rank; names must be unique "
                         "among outstanding operations"));
  inflight_[e->meta.name] = e;
  incoming_.push_back(e);
  cv_.notify_all();
  return Status::OK();
}

void Engine::sendRequests(std::vector<std::shared_ptr<Entry>>& fresh) {
  wire::Writer w;
  w.put<uint8_t>(kMsgRequests);
  w.put<uint32_t>(static_cast<uint32_t>(fresh.size()));
  for (auto& e : fresh) {
    timeline_.begin(e->meta.name, "NEGOTIATE");
    auto it = sent_.find(e->meta.name);
    auto idit = ids_.find(e->meta.name);
    if (cfg_.cache_enabled && it != sent_.end() && idit != ids_.end() &&
        it->second.second == e->meta) {
      w.put<int32_t>(idit->second);
    } else {
      w.put<int32_t>(-1);
      e->meta.write(w);
      sent_[e->meta.name] = {-1, e->meta};
    }
  }
  wire::sendFrame(ctrl_fd_, w.bytes(), Deadline::in(cfg_.timeout_s), "the coordinator (rank 0)");
}

void Engine::loop() {
  for (;;) {
    std::vector<std::shared_ptr<Entry>> fresh;
    std::deque<Response> todo;
    bool aborted = false;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait_for(lk, std::chrono::milliseconds(100), [&] {
        return !incoming_.empty() || !responses_.empty() || stopping_ ||
               AbortState::get().aborted() || reader_done_;
      });
      fresh.swap(incoming_);
      todo.swap(responses_);
      aborted = AbortState::get().aborted();
      if (stopping_ && fresh.empty() && todo.empty()) break;
    }
    if (aborted) {
      // Errors the coordinator already sent are more precise than the
      // abort: deliver them before failing everything else.
      for (auto& resp : todo)
        for (auto& g : resp.groups)
          if (g.kind == Group::kError) runGroup(g);
      break;
    }
    try {
      if (!fresh.empty()) sendRequests(fresh);
      for (auto& resp : todo) runResponse(resp);
    } catch (const Error& e) {
      reportFatal(e.status());
      break;
    }
  }
  Status s = AbortState::get().aborted() ? AbortState::get().status()
                                         : Status(Code::kAborted, "tfring has been shut down");
  failAll(s);
}

void Engine::runResponse(const Response& resp) {
  for (auto& p : resp.new_ids) ids_[p.second] = p.first;
  for (auto& g : resp.groups) runGroup(g);
  wire::Writer w;
  w.put<uint8_t>(kMsgDone);
  w.put<uint64_t>(resp.seq);
  wire::sendFrame(ctrl_fd_, w.bytes(), Deadline::in(cfg_.timeout_s), "the coordinator (rank 0)");
}

void Engine::runGroup(const Group& g) {
  std::vector<std::shared_ptr<Entry>> es;
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (auto& n : g.names) {
      auto it = inflight_.find(n);
      if (it != inflight_.end()) es.push_back(it->second);
    }
  }
  if (g.kind == Group::kError) {
    // Only this rank's own requests fail; ranks without them just log.
    if (es.empty()) TFRING_LOG(kError, g.error);
    for (auto& e : es) {
      {
        std::lock_guard<std::mutex> lk(mu_);
        inflight_.erase(e->meta.name);
      }
      timeline_.end(e->meta.name);
      e->done(Status(Code::kMismatch, g.error));
    }
    return;
  }
  if (es.size() != g.names.size())
    fail(Code::kInternal, "coordinator scheduled '", g.names[0],
         "' which this rank never submitted");
  for (auto& e : es) {
    timeline_.end(e->meta.name);
    timeline_.begin(e->meta.name, collectiveName(g.type));
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
    }
  }
  for (auto& e : es) {
    timeline_.end(e->meta.name);
    {
      std::lock_guard<std::mutex> lk(mu_);
      inflight_.erase(e->meta.name);
    }
    e->done(st);
  }
}

void Engine::readerLoop() {
  for (;;) {
    std::vector<uint8_t> msg;
    try {
      // No deadline while idle: the coordinator may legitimately be silent.
      msg = wire::recvFrame(ctrl_fd_, Deadline::in(1e9), "the coordinator (rank 0)");
    } catch (const Error&) {
      std::lock_guard<std::mutex> lk(mu_);
      if (!stopping_)
        AbortState::get().abort(Status(
            Code::kPeerFailure,
            "lost the connection to the coordinator (rank 0): rank 0 died, was killed, "
            "or its host failed"));
      reader_done_ = true;
      cv_.notify_all();
      return;
    }
    try {
      wire::Reader rd(msg);
      auto type = rd.get<uint8_t>();
      if (type == kMsgResponse) {
        Response resp = Response::read(rd);
        std::lock_guard<std::mutex> lk(mu_);
        responses_.push_back(std::move(resp));
        cv_.notify_all();
      } else if (type == kMsgStall) {
        TFRING_LOG(kWarning, rd.getStr());
      } else if (type == kMsgAbort) {
        int culprit = rd.get<int32_t>();
        std::string text = rd.getStr();
        AbortState::get().abort(Status(Code::kPeerFailure, strCat("rank ", culprit, ": ", text)));
      }
    } catch (const Error& e) {
      AbortState::get().abort(e.status());
    }
  }
}

void Engine::reportFatal(const Status& s) {
  bool first = AbortState::get().abort(s);
  if (!first) return;  // we are failing because someone told us to
  TFRING_LOG(kError, s.message());
  try {
    wire::Writer w;
    w.put<uint8_t>(kMsgError);
    w.putStr(strCat("rank ", links_->topology().rank, " failed: ", s.message()));
    wire::sendFrame(ctrl_fd_, w.bytes(), Deadline::in(2.0), "the coordinator (rank 0)");
  } catch (const Error&) {
  }
}

void Engine::failAll(const Status& s) {
  std::vector<std::shared_ptr<Entry>> es;
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (auto& kv : inflight_) es.push_back(kv.second);
    inflight_.clear();
    incoming_.clear();
    stopping_ = true;
  }
  for (auto& e : es) e->done(s);
}

void Engine::stop() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!thread_.joinable() && !reader_.joinable()) return;
    stopping_ = true;
    cv_.notify_all();
  }
  if (thread_.joinable()) thread_.join();
  try {
    wire::Writer w;
    w.put<uint8_t>(kMsgBye);
    wire::sendFrame(ctrl_fd_, w.bytes(), Deadline::in(2.0), "the coordinator (rank 0)");
  } catch (const Error&) {
  }
  // Our goodbye is queued ahead of the FIN; closing both directions also
  // wakes the reader thread out of its recv.
  ::shutdown(ctrl_fd_, SHUT_RDWR);
  if (reader_.joinable()) reader_.join();
  net::closeFd(ctrl_fd_);
  ctrl_fd_ = -1;
  AbortState::get().setWaker(nullptr);
}

}  // namespace runtime
}  // namespace tfring
