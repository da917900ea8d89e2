// A communicator: one ring of ranks with its engine and, on its first rank,
// its coordinator. The world is the first (id 0); every process set is
// another over some of the world's ranks (runtime/registry.h holds them
// all). connectComm() is the collective that builds one from a store:
// every member calls it with its place in the ring.
//
// A communicator's protocol only knows its members' places in its ring
// (0..n-1). Its messages name members by their global ranks all the same:
// connectComm hands the rank labels (common/rank_labels.h) to its links,
// engine and coordinator. Its edge translates a broadcast root given as a
// global rank into the member's place, and prefixes a process set's errors
// with the set.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "common/abort.h"
#include "common/env.h"
#include "rendezvous/store.h"
#include "runtime/coordinator.h"
#include "runtime/engine.h"
#include "runtime/runtime.h"
#include "runtime/stream_completion.h"

namespace tfring {
namespace runtime {

struct Comm {
  int id = 0;              // 0: the world
  std::vector<int> ranks;  // the members' global ranks, in ring order
  int index = -1;          // this process's place in `ranks`; -1: not a member
  Config cfg;              // with rank 0's fusion settings
  transport::Topology topo;
  std::string transport;
  // This communicator's failure state: its links and engine wait on it and
  // set it, and no other communicator's failure does (common/abort.h).
  // Members only; declared before the engine, which it outlives.
  std::unique_ptr<AbortState> abort;
  // Its collectives' and votes' statistics (members only).
  std::shared_ptr<collectives::CommStats> stats;
  // Its stream-completed collectives' first failure and warmed-up kinds
  // (runtime/stream_completion.h); shared with their pending callbacks.
  std::shared_ptr<GatedState> gated = std::make_shared<GatedState>();
  std::unique_ptr<Engine> engine;            // members only
  std::unique_ptr<Coordinator> coordinator;  // on the first member only
  std::atomic<bool> removed{false};

  bool member() const { return index >= 0; }
  bool isWorld() const { return id == 0; }
  // "process set 2 (ranks [0, 1])"; "the world" for id 0.
  std::string label() const;

  // Queues requests on this communicator (runtime.h's enqueueBatch): every
  // request names this communicator; broadcast roots are global ranks.
  Status enqueue(std::vector<Request> reqs, std::vector<DoneCallback> dones);
  void drive(const std::function<bool()>& done, const std::function<void()>& wait);
  void tryDrive();

  // Starts the coordinator (first member) and the engine's threads.
  void start();
  // Stops the engine, then waits briefly for the other ranks' goodbyes.
  // The links stay mapped until the Comm is destroyed, so a thread still
  // inside the engine (a caller driving it) can leave safely.
  void stop();
  ~Comm();  // the engine first: it talks to the coordinator

 private:
  // The error a caller sees: a process set's is named by the set.
  Status describe(const Status& st) const;
};

// Joins the ring of `size` ranks as `rank` through `store`, connects to the
// coordinator (rank 0 accepts a connection from every other rank) and
// creates the engine, not yet started. `labels`, when given, names each
// rank in the coordinator's messages (process sets: the world's ranks).
// Throws Error.
std::unique_ptr<Comm> connectComm(rendezvous::Store* store, int rank, int size,
                                  const std::string& secret, const Config& cfg,
                                  const std::vector<int>* labels = nullptr);

}  // namespace runtime
}  // namespace tfring
