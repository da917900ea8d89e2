// A communicator: one ring of ranks with its engine and, on its first rank,
// its coordinator. The world is one (runtime.cc); every process set is
// another (process_sets.cc). connectComm() is the collective that builds
// one from a store: every member calls it with its rank in the ring.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common/env.h"
#include "rendezvous/store.h"
#include "runtime/coordinator.h"
#include "runtime/engine.h"

namespace tfring {
namespace runtime {

struct Comm {
  Config cfg;  // with rank 0's fusion settings
  transport::Topology topo;
  std::string transport;
  std::unique_ptr<Engine> engine;
  std::unique_ptr<Coordinator> coordinator;  // on rank 0 only

  // Starts the coordinator (rank 0) and the engine's threads.
  void start();
  // Stops the engine, then waits briefly for the other ranks' goodbyes.
  // The links stay mapped until the Comm is destroyed, so a thread still
  // inside the engine (a caller driving it) can leave safely.
  void stop();
  ~Comm();  // the engine first: it talks to the coordinator
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
