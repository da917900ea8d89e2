// tfring._core counters of the collective algorithms, for tests and
// benchmarks that check which algorithm ran and what it cost:
//
//   allreduce_algorithm_counts() -> dict   allreduce calls per algorithm in
//                                          this process (ring, oneshot,
//                                          small, hier, recdbl,
//                                          rabenseifner), engine calls
//                                          included
//   allreduce_algorithm_stats() -> dict    per algorithm: calls, hops and
//                                          bytes_sent summed over them
//   last_collective_stats() -> dict        the last allreduce, allgather or
//                                          broadcast of this process:
//                                          collective, algo, ranks, bytes,
//                                          hops (sequential message steps on
//                                          its critical path), bytes_sent (by
//                                          this rank); see CollectiveStats
//   collective_algorithm_stats() -> dict   {"allgather": {algo: {calls, hops,
//                                          bytes_sent}}, "broadcast": ...}
//   last_vote_stats() -> dict              the last agreement round's vote
//                                          of this process (runtime/vote.h):
//                                          algo (ring or recdbl), ranks,
//                                          bytes (one rank's vote), hops,
//                                          bytes_sent, and rounds (this
//                                          process's rounds with that algo)
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <map>
#include <string>
#include <vector>

#include "collectives/allgather.h"
#include "collectives/allreduce.h"
#include "collectives/broadcast.h"
#include "python/bindings.h"
#include "runtime/vote.h"

namespace py = pybind11;

namespace tfring {
namespace python {

void bindAlgorithms(py::module_& m) {
  m.def("allreduce_algorithm_counts", [] {
    std::map<std::string, uint64_t> out;
    for (int i = 0; i < collectives::kNumAllreduceAlgos; ++i) {
      auto a = static_cast<collectives::AllreduceAlgo>(i);
      out[collectives::allreduceAlgoName(a)] = collectives::allreduceCalls(a);
    }
    return out;
  });
  m.def("allreduce_algorithm_stats", [] {
    py::dict out;
    for (int i = 0; i < collectives::kNumAllreduceAlgos; ++i) {
      auto a = static_cast<collectives::AllreduceAlgo>(i);
      py::dict d;
      d["calls"] = collectives::allreduceCalls(a);
      d["hops"] = collectives::allreduceHops(a);
      d["bytes_sent"] = collectives::allreduceBytesSent(a);
      out[collectives::allreduceAlgoName(a)] = d;
    }
    return out;
  });
  m.def("collective_algorithm_stats", [] {
    py::dict ag, bc;
    for (int i = 0; i < collectives::kNumAllgatherAlgos; ++i) {
      auto a = static_cast<collectives::AllgatherAlgo>(i);
      py::dict d;
      d["calls"] = collectives::allgatherCalls(a);
      d["hops"] = collectives::allgatherHops(a);
      d["bytes_sent"] = collectives::allgatherBytesSent(a);
      ag[collectives::allgatherAlgoName(a)] = d;
    }
    for (int i = 0; i < collectives::kNumBroadcastAlgos; ++i) {
      auto a = static_cast<collectives::BroadcastAlgo>(i);
      py::dict d;
      d["calls"] = collectives::broadcastCalls(a);
      d["hops"] = collectives::broadcastHops(a);
      d["bytes_sent"] = collectives::broadcastBytesSent(a);
      bc[collectives::broadcastAlgoName(a)] = d;
    }
    py::dict out;
    out["allgather"] = ag;
    out["broadcast"] = bc;
    return out;
  });
  m.def("last_collective_stats", [] {
    const collectives::CollectiveStats st = collectives::lastCollectiveStats();
    py::dict d;
    d["collective"] = st.collective;
    d["algo"] = st.algo;
    d["ranks"] = st.size;
    d["bytes"] = st.bytes;
    d["hops"] = st.hops;
    d["bytes_sent"] = st.bytes_sent;
    return d;
  });
  m.def("last_vote_stats", [] {
    const runtime::VoteStats st = runtime::lastVoteStats();
    py::dict d;
    d["collective"] = "vote";
    d["algo"] = runtime::voteAlgoName(st.algo);
    d["ranks"] = st.size;
    d["bytes"] = st.bytes;
    d["hops"] = st.hops;
    d["bytes_sent"] = st.bytes_sent;
    d["rounds"] = runtime::voteRounds(st.algo);
    return d;
  });
}

}  // namespace python
}  // namespace tfring
