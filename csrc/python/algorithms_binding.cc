// tfring._core allreduce algorithms outside the engine, for tests and
// benchmarks that measure an algorithm by itself:
//
// The statistics are a communicator's: each reader takes process_set=0 (the
// world's id, the default; a set's id for that set's), and raises if this
// rank is not in the set. (tfring._core_testing's DirectAllreduce has its own.)
//
//   allreduce_algorithm_counts() -> dict   allreduce calls per algorithm
//                                          (ring, oneshot, small, hier,
//                                          recdbl, rabenseifner)
//   allreduce_algorithm_stats() -> dict    per algorithm: calls, hops and
//                                          bytes_sent summed over them
//   last_collective_stats() -> dict        the last allreduce, allgather or
//                                          broadcast:
//                                          collective, algo, ranks, bytes,
//                                          hops (sequential message steps on
//                                          its critical path), bytes_sent (by
//                                          this rank); see CollectiveStats
//   collective_algorithm_stats() -> dict   {"allgather": {algo: {calls, hops,
//                                          bytes_sent}}, "broadcast": ...}
//   last_vote_stats() -> dict              the last agreement round's vote
//                                          (runtime/vote.h): algo (ring,
//                                          recdbl or host), ranks, bytes (one
//                                          rank's vote), hops, bytes_sent,
//                                          and rounds (the communicator's
//                                          rounds with that algo)
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "collectives/allgather.h"
#include "collectives/allreduce.h"
#include "collectives/broadcast.h"
#include "python/bindings.h"
#include "python/errors.h"
#include "python/stats_dict.h"
#include "runtime/registry.h"
#include "runtime/vote.h"

namespace py = pybind11;

namespace tfring {
namespace python {

// Before init, and after shutdown, the world's statistics are all zero.
std::shared_ptr<const collectives::CommStats> commStats(int process_set) {
  auto c = runtime::Registry::get().find(process_set);
  if (!c) {
    if (process_set == 0) return std::make_shared<collectives::CommStats>();
    fail(Code::kInvalidArgument, "process set ", process_set,
         " does not exist (tfring.add_process_set)");
  }
  if (!c->stats)
    fail(Code::kInvalidArgument, c->label(), ": rank ",
         runtime::Registry::get().world()->topo.rank,
         " is not in the set, so it has no statistics of it");
  return c->stats;
}

void bindAlgorithms(py::module_& m) {
  m.def("allreduce_algorithm_counts", [](int process_set) {
    auto s = commStats(process_set);
    std::map<std::string, uint64_t> out;
    for (int i = 0; i < collectives::kNumAllreduceAlgos; ++i) {
      auto a = static_cast<collectives::AllreduceAlgo>(i);
      out[collectives::allreduceAlgoName(a)] = collectives::allreduceCalls(*s, a);
    }
    return out;
  }, py::arg("process_set") = 0);
  m.def("allreduce_algorithm_stats", [](int process_set) {
    auto s = commStats(process_set);
    py::dict out;
    for (int i = 0; i < collectives::kNumAllreduceAlgos; ++i) {
      auto a = static_cast<collectives::AllreduceAlgo>(i);
      py::dict d;
      d["calls"] = collectives::allreduceCalls(*s, a);
      d["hops"] = collectives::allreduceHops(*s, a);
      d["bytes_sent"] = collectives::allreduceBytesSent(*s, a);
      out[collectives::allreduceAlgoName(a)] = d;
    }
    return out;
  }, py::arg("process_set") = 0);
  m.def("collective_algorithm_stats", [](int process_set) {
    auto s = commStats(process_set);
    py::dict ag, bc;
    for (int i = 0; i < collectives::kNumAllgatherAlgos; ++i) {
      auto a = static_cast<collectives::AllgatherAlgo>(i);
      py::dict d;
      d["calls"] = collectives::allgatherCalls(*s, a);
      d["hops"] = collectives::allgatherHops(*s, a);
      d["bytes_sent"] = collectives::allgatherBytesSent(*s, a);
      ag[collectives::allgatherAlgoName(a)] = d;
    }
    for (int i = 0; i < collectives::kNumBroadcastAlgos; ++i) {
      auto a = static_cast<collectives::BroadcastAlgo>(i);
      py::dict d;
      d["calls"] = collectives::broadcastCalls(*s, a);
      d["hops"] = collectives::broadcastHops(*s, a);
      d["bytes_sent"] = collectives::broadcastBytesSent(*s, a);
      bc[collectives::broadcastAlgoName(a)] = d;
    }
    py::dict out;
    out["allgather"] = ag;
    out["broadcast"] = bc;
    return out;
  }, py::arg("process_set") = 0);
  m.def("last_collective_stats", [](int process_set) {
    return collectiveDict(collectives::lastCollectiveStats(*commStats(process_set)));
  }, py::arg("process_set") = 0);
  m.def("last_vote_stats", [](int process_set) {
    auto s = commStats(process_set);
    const runtime::VoteStats st = runtime::lastVoteStats(*s);
    py::dict d;
    d["collective"] = "vote";
    d["algo"] = runtime::voteAlgoName(st.algo);
    d["ranks"] = st.size;
    d["bytes"] = st.bytes;
    d["hops"] = st.hops;
    d["bytes_sent"] = st.bytes_sent;
    d["rounds"] = runtime::voteRounds(*s, st.algo);
    return d;
  }, py::arg("process_set") = 0);
}

}  // namespace python
}  // namespace tfring
