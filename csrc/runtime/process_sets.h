// What runtime.cc calls of the process-set table (process_sets.cc); the
// public API is in runtime.h.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/env.h"
#include "rendezvous/store.h"
#include "runtime/runtime.h"
#include "transport/ring_links.h"

namespace tfring {
namespace runtime {

// After the world is up: keeps what later sets are built from.
void processSetsInit(std::shared_ptr<rendezvous::Store> store, const std::string& secret,
                     const Config& cfg, const transport::Topology& world);
// Before the world shuts down: stops every set's communicator.
void processSetsShutdown();

Status processSetEnqueue(std::vector<Request> reqs, std::vector<DoneCallback> dones);
void processSetDrive(int id, const std::function<bool()>& done,
                     const std::function<void()>& wait);
void processSetTryDrive(int id);

}  // namespace runtime
}  // namespace tfring
