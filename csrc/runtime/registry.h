// The communicators of this process, keyed by id: the world is 0, each
// process set its own positive id. This table is the one piece of
// process-wide state of the runtime: ids are what callers (the binding, the
// TF and XLA kernels) name a communicator by, so something must map them.
// Everything a communicator owns (links, engine, coordinator, config) lives
// in its Comm.
//
// Lifecycle: init() builds the world; addSet/removeSet build and tear down
// process sets over it, the same calls on every rank; shutdown() stops
// every set, then the world, and empties the table, so a later init()
// starts from nothing (an elastic re-formation, or the next job of a Spark
// or Ray worker).
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/comm.h"
#include "runtime/runtime.h"

namespace tfring {
namespace runtime {

class Registry {
 public:
  static Registry& get();

  Status init(const InitOptions& opts);
  void shutdown();
  bool initialized() const { return world_.load(std::memory_order_acquire) != nullptr; }

  // The world; null before init and after shutdown. The pointer stays valid
  // until shutdown() returns.
  Comm* world() const { return world_.load(std::memory_order_acquire); }
  // The communicator `id` names (the world for 0), removed sets included
  // (flagged); null if the id was never added in this world.
  std::shared_ptr<Comm> find(int id) const;

  Status addSet(int id, const std::vector<int>& ranks);
  Status removeSet(int id);
  // The live process sets' ids, ascending.
  std::vector<int> setIds() const;
  // One past the largest id this world has used; 0 before init.
  int nextSetId() const;

 private:
  Registry() = default;

  std::mutex lifecycle_;  // init, shutdown, add and remove, one at a time
  mutable std::mutex mu_;  // comms_
  std::map<int, std::shared_ptr<Comm>> comms_;
  std::atomic<Comm*> world_{nullptr};
  // What later process sets are built from.
  std::shared_ptr<rendezvous::Store> store_;
  std::string secret_;
  Config set_cfg_;
};

}  // namespace runtime
}  // namespace tfring
