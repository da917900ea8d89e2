// Building a communicator (connectComm) and its edge: requests in, errors
// out (comm.h).
#include "runtime/comm.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <exception>
#include <thread>

#include "common/logging.h"
#include "common/net.h"
#include "common/wire.h"
#include "runtime/registry.h"

namespace tfring {
namespace runtime {

namespace {

// A process that dies closes its sockets and is noticed at once; a host that
// vanishes without closing them (power loss, partition) is noticed by TCP
// keepalive and TCP_USER_TIMEOUT within TFRING_HEARTBEAT_TIMEOUT seconds.
void setKeepAlive(int fd, double timeout_s) {
  if (timeout_s > 0) net::setLiveness(fd, timeout_s);
}

std::string describeRank(const transport::Topology& T, int r, int label) {
  return strCat("rank ", label, " (host ", T.peers.empty() ? "?" : T.peers[r].addr, ", pid ",
                T.peers.empty() ? 0 : T.peers[r].pid, ")");
}

}  // namespace

std::unique_ptr<Comm> connectComm(rendezvous::Store* store, int rank, int size,
                                  const std::string& secret, const Config& base,
                                  const std::vector<int>* labels) {
  std::unique_ptr<Comm> c(new Comm());
  c->cfg = base;
  c->abort.reset(new AbortState());
  Deadline deadline = Deadline::in(c->cfg.timeout_s);
  const RankLabels label = labels ? RankLabels(*labels) : RankLabels();

  // Coordinator connections: rank 0 accepts one from every other engine;
  // its own engine talks to the coordinator in process. They open before
  // the data links, rank 0 accepting on a thread of its own while it builds
  // its links: a rank connects as soon as it arrives, so the handshakes
  // happen while the job waits for its last rank instead of one after
  // another once everyone is there.
  std::vector<int> fds(size, -1);
  std::thread coord_thread;
  std::atomic<bool> stop_accepting{false};
  std::string accept_error;
  std::exception_ptr connect_error;
  int ctrl = -1;
  if (rank == 0 && size > 1) {
    net::raiseFdLimit(size + 256L);  // a coordinator connection per rank, and the links
    int port = 0;
    // The address rank 0 publishes for its links too: it listens nowhere else.
    const std::string addr = net::localAddress();
    int listen_fd = net::listenOn(addr, 0, &port);
    store->setString("coord/addr", addr);
    store->setString("coord/port", std::to_string(port));
    auto acceptAll = [&](int listen_fd) {
      int got = 1;
      while (got < size && !stop_accepting.load()) {
        int fd = net::acceptWithDeadline(
            listen_fd, Deadline::in(std::min(0.2, std::max(0.0, deadline.remaining()))));
        if (fd < 0) {
          if (!deadline.expired()) continue;
          std::string missing;
          for (int r = 1; r < size; ++r)
            if (fds[r] < 0) missing += (missing.empty() ? "" : ", ") + std::to_string(label(r));
          accept_error = strCat("timed out waiting for ranks [", missing,
                                "] to connect to the coordinator");
          return;
        }
        int who = -1;
        std::string why;
        if (!wire::acceptHello(fd, wire::kPurposeControl, secret, deadline, &who, &why) ||
            who <= 0 || who >= size || fds[who] >= 0) {
          if (why.empty()) why = strCat("duplicate or invalid rank ", who);
          TFRING_LOG(kWarning, "coordinator: ", why);
          net::closeFd(fd);
          continue;
        }
        net::setNoDelay(fd);
        setKeepAlive(fd, c->cfg.heartbeat_timeout_s);
        fds[who] = fd;
        ++got;
      }
    };
    coord_thread = std::thread([&, listen_fd, acceptAll] {
      try {
        acceptAll(listen_fd);
      } catch (...) {
        connect_error = std::current_exception();
      }
      net::closeFd(listen_fd);
    });
  } else if (size > 1) {
    // On a thread too, beside this rank's links, so a link that fails (a
    // wrong secret, a dead neighbour) reports itself first, as it did
    // when the coordinator connection came after the links. The address
    // is read here: the thread does not share the store with the links (a
    // store client opens a connection per concurrent caller and keeps it).
    auto where = store->getMany({"coord/addr", "coord/port"}, c->cfg.timeout_s);
    const std::string addr(where[0].begin(), where[0].end());
    const int port = std::stoi(std::string(where[1].begin(), where[1].end()));
    coord_thread = std::thread([&, addr, port] {
      try {
        // In slices, so a failure of the links (which stops this thread)
        // is not held up by a coordinator that will never answer.
        // (The links' own error is what init reports then.)
        const int fd = net::connectInSlices(addr, port, deadline, [&] {
          if (stop_accepting.load())
            fail(Code::kAborted, "the coordinator connection was given up: the links failed");
        });
        ctrl = fd;
        net::setNoDelay(fd);
        setKeepAlive(fd, c->cfg.heartbeat_timeout_s);
        wire::clientHandshake(fd, wire::kPurposeControl, rank, secret, deadline,
                              strCat("the coordinator (rank ", label(0), ")"));
      } catch (...) {
        connect_error = std::current_exception();
      }
    });
  }
  auto closeCoordinatorLinks = [&] {
    for (int& fd : fds)
      if (fd >= 0) net::closeFd(fd), fd = -1;
    if (ctrl >= 0) net::closeFd(ctrl), ctrl = -1;
  };

  std::unique_ptr<transport::RingLinks> links;
  try {
    links = transport::RingLinks::connect(store, rank, size, secret, c->cfg, c->abort.get(),
                                          label);
  } catch (...) {
    stop_accepting = true;
    if (coord_thread.joinable()) coord_thread.join();
    closeCoordinatorLinks();
    throw;
  }
  if (coord_thread.joinable()) coord_thread.join();
  if (connect_error) {
    closeCoordinatorLinks();
    std::rethrow_exception(connect_error);
  }
  if (!accept_error.empty()) {
    closeCoordinatorLinks();
    fail(Code::kTimeout, accept_error);
  }
  // Rank 0's fusion settings hold for every rank (see HostLinks).
  c->cfg.fusion_threshold = links->host()->policy.fusion_threshold;
  c->cfg.cycle_time_ms = links->host()->policy.cycle_time_ms;
  const auto& T = links->topology();

  std::unique_ptr<Coordinator> coord;
  if (rank == 0) {
    std::vector<std::string> desc;
    for (int r = 0; r < size; ++r) desc.push_back(describeRank(T, r, label(r)));
    coord.reset(new Coordinator(std::move(fds), std::move(desc), c->cfg));
    coord->setRankLabels(label);
  }

  if (log::enabled(log::kDebug) && !links->phases.empty()) {
    // The rendezvous phases, for finding what start-up waits on at scale.
    // Each phase: its end in seconds after the start, then the CPU
    // milliseconds and minor page faults it took.
    const auto& p0 = links->phases.front();
    const double t0 = p0.wall;
    std::string line = strCat("rank ", rank, " init phases (s after ", std::to_string(t0), "):");
    const transport::RingLinks::Phase* prev = &p0;
    for (auto& ph : links->phases) {
      line += strCat(" ", ph.name, " ", ph.wall - t0, " (", 1e3 * (ph.cpu - prev->cpu), " ms cpu, ",
                     ph.minflt - prev->minflt, " faults);");
      prev = &ph;
    }
    const double now = std::chrono::duration<double>(
                           std::chrono::system_clock::now().time_since_epoch()).count();
    TFRING_LOG(kDebug, line, " coordinator ", now - t0);
  }
  c->index = rank;
  for (int r = 0; r < size; ++r) c->ranks.push_back(label(r));
  c->topo = T;
  c->transport = links->transportName();
  c->engine.reset(new Engine(std::move(links), ctrl, coord.get(), c->cfg));
  c->stats = c->engine->stats();
  c->coordinator = std::move(coord);
  return c;
}

void Comm::start() {
  if (!engine) return;
  if (coordinator) {
    Engine* eng = engine.get();
    coordinator->setLocalSink([eng](const std::vector<uint8_t>& m) { eng->onCtrlMessage(m); });
    coordinator->start();
  }
  engine->start();
}

void Comm::stop() {
  if (!engine) return;
  engine->stop();
  // Rank 0 waits for the others' goodbyes so that what it sent them is read,
  // but not for ranks that keep running without tfring: they have been told
  // rank 0 left, and anything they still submit fails saying so.
  if (coordinator)
    coordinator->join(std::min(cfg.timeout_s, std::max(1.0, cfg.heartbeat_timeout_s)));
}

Comm::~Comm() {
  engine.reset();
  coordinator.reset();
}

std::string Comm::label() const {
  if (isWorld()) return "the world";
  std::string s = strCat("process set ", id, " (ranks [");
  for (size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s + "])";
}

namespace {

// The set's protocol already names its members by their global ranks
// (RankLabels): only the set's name is added.
Status describeOn(const std::string& label, const Status& st) {
  if (st.ok()) return st;
  return Status(st.code(), strCat(label, ": ", st.message()));
}

}  // namespace

Status Comm::describe(const Status& st) const {
  return isWorld() ? st : describeOn(label(), st);
}

Status Comm::enqueue(std::vector<Request> reqs, std::vector<DoneCallback> dones) {
  const std::string& name = reqs[0].name;
  const char* what = collectiveName(reqs[0].type);
  if (removed.load())
    return Status(Code::kInvalidArgument, strCat(what, " of tensor '", name, "' on ", label(),
                                                 ": the set has been removed"));
  if (!member())
    return Status(Code::kInvalidArgument,
                  strCat(what, " of tensor '", name, "' on ", label(), ": rank ",
                         Registry::get().world()->topo.rank,
                         " is not in the set, so it cannot take part"));
  if (isWorld()) return engine->enqueue(std::move(reqs), std::move(dones));
  for (auto& r : reqs) {
    if (r.type != CollectiveType::kBroadcast) continue;
    auto it = std::find(ranks.begin(), ranks.end(), r.root);
    if (it == ranks.end()) {
      // Failed on every member by the set's coordinator (validate.cc).
      r.error = strCat("broadcast of tensor '", r.name, "': root_rank=", r.root,
                       " is not a member of the set");
      r.root = 0;
      continue;
    }
    r.root = static_cast<int>(it - ranks.begin());
  }
  // The callbacks may run while this Comm is torn down: they keep their
  // own copy of what they name.
  auto lbl = std::make_shared<const std::string>(label());
  for (auto& d : dones) {
    DoneCallback inner = std::move(d);
    d = [lbl, inner](const Status& st) { inner(describeOn(*lbl, st)); };
  }
  return describe(engine->enqueue(std::move(reqs), std::move(dones)));
}

void Comm::drive(const std::function<bool()>& done, const std::function<void()>& wait) {
  if (!engine) {
    while (!done()) wait();
    return;
  }
  engine->drive(done, wait);
}

void Comm::tryDrive() {
  if (engine) engine->tryDrive();
}

}  // namespace runtime
}  // namespace tfring
