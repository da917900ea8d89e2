// init/shutdown of the process-wide runtime: joins the ring through the
// store, connects every engine to the coordinator on rank 0 and starts the
// background threads.
#include "runtime/runtime.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <exception>
#include <chrono>
#include <map>
#include <mutex>
#include <thread>

#include "common/abort.h"
#include "common/logging.h"
#include "common/net.h"
#include "common/wire.h"
#include "gpu/stream_completion.h"
#include "runtime/comm.h"
#include "runtime/messages.h"
#include "runtime/process_sets.h"

namespace tfring {
namespace runtime {

namespace {

struct Global {
  std::mutex mu;
  bool initialized = false;
  Config cfg;
  transport::Topology topo;
  std::string transport;
  std::unique_ptr<Engine> engine;
  std::unique_ptr<Coordinator> coordinator;
};

Global& G() {
  static Global* g = new Global();
  return *g;
}

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
  Deadline deadline = Deadline::in(c->cfg.timeout_s);
  auto label = [&](int r) { return labels ? (*labels)[r] : r; };

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
    links = transport::RingLinks::connect(store, rank, size, secret, c->cfg);
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
    if (labels) coord->setRankLabels(*labels);
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
  c->topo = T;
  c->transport = links->transportName();
  c->engine.reset(new Engine(std::move(links), ctrl, coord.get(), c->cfg));
  c->coordinator = std::move(coord);
  return c;
}

void Comm::start() {
  if (coordinator) {
    Engine* eng = engine.get();
    coordinator->setLocalSink([eng](const std::vector<uint8_t>& m) { eng->onCtrlMessage(m); });
    coordinator->start();
  }
  engine->start();
}

void Comm::stop() {
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

Status init(const InitOptions& opts) {
  Global& g = G();
  std::lock_guard<std::mutex> lk(g.mu);
  if (g.initialized) return Status::OK();
  try {
    if (opts.size < 1 || opts.rank < 0 || opts.rank >= opts.size)
      fail(Code::kInvalidArgument, "invalid rank ", opts.rank, " for world size ", opts.size);
    if (opts.size > 1 && !opts.store)
      fail(Code::kInvalidArgument, "a store is required for world size ", opts.size);
    Config cfg = Config::fromEnv();
    log::setLevel(cfg.log_level);
    log::setRank(opts.rank);
    AbortState::get().reset();
    // A new world (an elastic reset): a gated collective's failure in the
    // old one must not fail every collective of this one.
    gpu::resetStreamCompletion();

    auto c = connectComm(opts.store.get(), opts.rank, opts.size, opts.secret, cfg);
    g.cfg = c->cfg;
    g.topo = c->topo;
    g.transport = c->transport;
    g.engine = std::move(c->engine);
    g.coordinator = std::move(c->coordinator);
    if (g.coordinator) {
      Engine* eng = g.engine.get();
      g.coordinator->setLocalSink(
          [eng](const std::vector<uint8_t>& m) { eng->onCtrlMessage(m); });
      g.coordinator->start();
    }
    g.engine->start();
    g.initialized = true;
    processSetsInit(opts.store, opts.secret, g.cfg, g.topo);
    TFRING_LOG(kDebug, "initialized: rank ", opts.rank, "/", opts.size, " transport ", g.transport);
    return Status::OK();
  } catch (const Error& e) {
    g.engine.reset();
    g.coordinator.reset();
    return e.status();
  } catch (const std::exception& e) {
    g.engine.reset();
    g.coordinator.reset();
    return Status(Code::kInternal, e.what());
  }
}

void shutdown() {
  Global& g = G();
  std::lock_guard<std::mutex> lk(g.mu);
  if (!g.initialized) return;
  processSetsShutdown();  // before the world: their rings are its ranks too
  g.engine->stop();
  // Rank 0 waits for the others' goodbyes so that what it sent them is read,
  // but not for ranks that keep running without tfring: they have been told
  // rank 0 left, and anything they still submit fails saying so.
  if (g.coordinator)
    g.coordinator->join(std::min(g.cfg.timeout_s, std::max(1.0, g.cfg.heartbeat_timeout_s)));
  g.engine.reset();
  g.coordinator.reset();
  g.initialized = false;
}

bool isInitialized() { return G().initialized; }
int rank() { return G().topo.rank; }
int size() { return G().topo.size; }
int localRank() { return G().topo.local_rank; }
int localSize() { return G().topo.local_size; }
int crossRank() { return G().topo.cross_rank; }
int crossSize() { return G().topo.cross_size; }
bool isHomogeneous() {
  std::map<std::string, int> per_host;
  for (const auto& p : G().topo.peers) ++per_host[p.host];
  for (const auto& kv : per_host)
    if (kv.second != per_host.begin()->second) return false;
  return true;
}
const Config& config() { return G().cfg; }
std::string transportName() { return G().transport; }

StoreModes storeModes(bool large) {
  StoreModes m;
  Global& g = G();
  if (!g.initialized || !g.engine || !g.engine->storeTuner(large)) return m;
  g.engine->storeTuner(large)->snapshot(&m.ordinary_s_per_byte, &m.streaming_s_per_byte,
                                        &m.calls);
  return m;
}

void setParts(Request* req, std::vector<Request::Part> parts,
              const std::vector<std::vector<int64_t>>& shapes) {
  int64_t total = 0;
  for (const Request::Part& p : parts) total += p.count;
  req->parts = std::move(parts);
  req->input = nullptr;
  req->output = nullptr;
  req->shape = {total};
  req->splits = partLayout(shapes);
}

Status enqueue(Request req, DoneCallback done) {
  std::vector<Request> reqs;
  std::vector<DoneCallback> dones;
  reqs.push_back(std::move(req));
  dones.push_back(std::move(done));
  return enqueueBatch(std::move(reqs), std::move(dones));
}

Status enqueueBatch(std::vector<Request> reqs, std::vector<DoneCallback> dones) {
  if (!reqs.empty() && reqs[0].process_set != 0)  // process_sets.cc
    return processSetEnqueue(std::move(reqs), std::move(dones));
  Global& g = G();
  Engine* e = g.engine.get();
  if (!g.initialized || !e)
    return Status(Code::kAborted, "tfring is not initialized: call tfring.init() first");
  return e->enqueue(std::move(reqs), std::move(dones));
}

void drive(const std::function<bool()>& done, const std::function<void()>& wait,
           int process_set) {
  if (process_set != 0) return processSetDrive(process_set, done, wait);
  Global& g = G();
  Engine* e = g.engine.get();
  if (!g.initialized || !e) {
    while (!done()) wait();
    return;
  }
  e->drive(done, wait);
}

void tryDrive(int process_set) {
  if (process_set != 0) return processSetTryDrive(process_set);
  Global& g = G();
  Engine* e = g.engine.get();
  if (g.initialized && e) e->tryDrive();
}

Status startTimeline(const std::string& path) {
  Global& g = G();
  std::lock_guard<std::mutex> lk(g.mu);
  if (!g.initialized || !g.engine)
    return Status(Code::kAborted, "tfring is not initialized: call tfring.init() first");
  if (path.empty()) return Status(Code::kInvalidArgument, "the timeline path is empty");
  if (!g.engine->startTimeline(path))
    return Status(Code::kInvalidArgument, strCat("cannot create the timeline file '", path, "'"));
  return Status::OK();
}

Status stopTimeline() {
  Global& g = G();
  std::lock_guard<std::mutex> lk(g.mu);
  if (!g.initialized || !g.engine)
    return Status(Code::kAborted, "tfring is not initialized: call tfring.init() first");
  g.engine->stopTimeline();
  return Status::OK();
}

std::vector<int64_t> reducescatterShape(const std::vector<int64_t>& shape, int rank, int size) {
  std::vector<int64_t> out = shape;
  if (out.empty()) return out;
  int64_t d = out[0];
  out[0] = d / size + (rank < d % size ? 1 : 0);
  return out;
}

}  // namespace runtime
}  // namespace tfring
