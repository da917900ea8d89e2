// The runtime's public API (runtime.h): every call finds its communicator
// in the registry (registry.h), the world being id 0, and hands on.
#include "runtime/runtime.h"

#include <map>

#include "runtime/registry.h"

namespace tfring {
namespace runtime {

namespace {

const char* kNotInitialized = "tfring is not initialized: call tfring.init() first";

Comm* world() { return Registry::get().world(); }

// The communicator a request or a drive names; null when there is none.
std::shared_ptr<Comm> commOf(int id) { return Registry::get().find(id); }

const Config& defaultConfig() {
  static const Config* c = new Config();
  return *c;
}

}  // namespace

Status init(const InitOptions& opts) { return Registry::get().init(opts); }
void shutdown() { Registry::get().shutdown(); }

bool isInitialized() { return Registry::get().initialized(); }

namespace {
const transport::Topology& worldTopo() {
  static const transport::Topology* none = new transport::Topology();
  Comm* w = world();
  return w ? w->topo : *none;
}
}  // namespace

int rank() { return worldTopo().rank; }
int size() { return worldTopo().size; }
int localRank() { return worldTopo().local_rank; }
int localSize() { return worldTopo().local_size; }
int crossRank() { return worldTopo().cross_rank; }
int crossSize() { return worldTopo().cross_size; }
bool isHomogeneous() {
  std::map<std::string, int> per_host;
  for (const auto& p : worldTopo().peers) ++per_host[p.host];
  for (const auto& kv : per_host)
    if (kv.second != per_host.begin()->second) return false;
  return true;
}
const Config& config() {
  Comm* w = world();
  return w ? w->cfg : defaultConfig();
}
std::string transportName() {
  Comm* w = world();
  return w ? w->transport : std::string();
}

StoreModes storeModes(bool large) {
  StoreModes m;
  Comm* w = world();
  if (!w || !w->engine || !w->engine->storeTuner(large)) return m;
  w->engine->storeTuner(large)->snapshot(&m.ordinary_s_per_byte, &m.streaming_s_per_byte,
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
  if (reqs.empty()) return Status::OK();
  const int id = reqs[0].process_set;
  for (auto& r : reqs)
    if (r.process_set != id)
      return Status(Code::kInvalidArgument,
                    strCat("tensors '", reqs[0].name, "' and '", r.name,
                           "' are submitted together but name different process sets (", id,
                           " and ", r.process_set, ")"));
  if (id == 0) {  // the world: no table lookup on the common path
    Comm* w = world();
    if (!w) return Status(Code::kAborted, kNotInitialized);
    return w->enqueue(std::move(reqs), std::move(dones));
  }
  if (!world()) return Status(Code::kAborted, kNotInitialized);
  std::shared_ptr<Comm> c = commOf(id);
  if (!c)
    return Status(Code::kInvalidArgument,
                  strCat(collectiveName(reqs[0].type), " of tensor '", reqs[0].name,
                         "': process set ", id,
                         " does not exist (create it with tfring.add_process_set or "
                         "tfring.init(process_sets=...))"));
  return c->enqueue(std::move(reqs), std::move(dones));
}

void drive(const std::function<bool()>& done, const std::function<void()>& wait,
           int process_set) {
  if (process_set == 0) {
    Comm* w = world();
    if (w) return w->drive(done, wait);
  } else if (std::shared_ptr<Comm> c = commOf(process_set)) {
    return c->drive(done, wait);
  }
  while (!done()) wait();
}

void tryDrive(int process_set) {
  if (process_set == 0) {
    if (Comm* w = world()) w->tryDrive();
  } else if (std::shared_ptr<Comm> c = commOf(process_set)) {
    c->tryDrive();
  }
}

Status addProcessSet(int id, const std::vector<int>& ranks) {
  return Registry::get().addSet(id, ranks);
}

Status removeProcessSet(int id) { return Registry::get().removeSet(id); }

std::vector<int> processSetRanks(int id) {
  std::shared_ptr<Comm> c = id == 0 ? nullptr : commOf(id);
  if (!c || c->removed.load()) return {};
  return c->ranks;
}

std::vector<int> processSetIds() { return Registry::get().setIds(); }
int nextProcessSetId() { return Registry::get().nextSetId(); }

Status failCommunicator(int id, const std::string& message) {
  std::shared_ptr<Comm> c = Registry::get().find(id);
  if (!c || !c->engine)
    return Status(Code::kInvalidArgument,
                  strCat("no communicator ", id, " this rank is a member of"));
  c->engine->injectFailure(Status(Code::kInternal, message));
  return Status::OK();
}

Status startTimeline(const std::string& path) {
  Comm* w = world();
  if (!w || !w->engine) return Status(Code::kAborted, kNotInitialized);
  if (path.empty()) return Status(Code::kInvalidArgument, "the timeline path is empty");
  if (!w->engine->startTimeline(path))
    return Status(Code::kInvalidArgument, strCat("cannot create the timeline file '", path, "'"));
  return Status::OK();
}

Status stopTimeline() {
  Comm* w = world();
  if (!w || !w->engine) return Status(Code::kAborted, kNotInitialized);
  w->engine->stopTimeline();
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
