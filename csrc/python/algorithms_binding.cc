// tfring._core allreduce algorithms outside the engine, for tests and
// benchmarks that measure an algorithm by itself:
//
//   allreduce_algorithm_counts() -> dict   allreduce calls per algorithm in
//                                          this process (ring, oneshot,
//                                          small, hier, recdbl,
//                                          rabenseifner), engine calls
//                                          included
//   allreduce_algorithm_stats() -> dict    per algorithm: calls, hops and
//                                          bytes_sent summed over them
//   last_collective_stats() -> dict        the last allreduce of this
//                                          process: algo, ranks, bytes, hops
//                                          (sequential message steps on its
//                                          critical path), bytes_sent (by
//                                          this rank); see AllreduceStats
//   last_vote_stats() -> dict              the last agreement round's vote
//                                          of this process (runtime/vote.h):
//                                          algo (ring or recdbl), ranks,
//                                          bytes (one rank's vote), hops,
//                                          bytes_sent, and rounds (this
//                                          process's rounds with that algo)
//   DirectAllreduce(store, rank, size, secret)
//       connects this rank's own ring links and host segment through `store`
//       (TFRING_* tunables read as at init), with no engine or coordinator.
//     .allreduce(arr, algo="auto")   in-place float32 sum allreduce
//     .time(nbytes, algo, iters)     seconds per call, back to back, float32
//     .algorithm(nbytes, algo="auto") the algorithm that size would take
//     .close()
// Every rank must make the same calls in the same order.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <sched.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "collectives/allreduce.h"
#include "common/env.h"
#include "python/bindings.h"
#include "python/errors.h"
#include "rendezvous/store.h"
#include "runtime/vote.h"
#include "transport/ring_links.h"

namespace py = pybind11;

namespace tfring {
namespace python {
namespace {

class DirectAllreduce {
 public:
  DirectAllreduce(std::shared_ptr<rendezvous::Store> store, int rank, int size,
                  const std::string& secret)
      : store_(std::move(store)), cfg_(Config::fromEnv()) {
    links_ = transport::RingLinks::connect(store_.get(), rank, size, secret, cfg_);
    waiter_.reset(new transport::Waiter(links_->bell(), links_->right(), links_->left()));
    comm_ = collectives::makeRingComm(*links_, waiter_.get(), cfg_);
    default_algo_ = comm_.host->algo;
    // Waits spin only where every local rank has a core, as in the engine.
    cpu_set_t cpus;
    int ncpu = sched_getaffinity(0, sizeof(cpus), &cpus) == 0 ? CPU_COUNT(&cpus) : 1;
    transport::setSpinning(links_->topology().local_size <= ncpu);
  }

  void run(float* data, size_t count, const std::string& algo) {
    live();
    comm_.host->algo = algo == "auto" ? default_algo_ : algo;
    collectives::allreduce(comm_, data, data, count, DataType::kFloat32, ReduceOp::kSum, 1.0);
    comm_.host->algo = default_algo_;
  }

  std::string algorithm(size_t nbytes, const std::string& algo) {
    live();
    comm_.host->algo = algo == "auto" ? default_algo_ : algo;
    auto a = collectives::chooseAllreduce(comm_, nbytes);
    comm_.host->algo = default_algo_;
    return collectives::allreduceAlgoName(a);
  }

  double time(size_t nbytes, const std::string& algo, int iters) {
    std::vector<float> buf(nbytes / 4, 1.0f);
    run(buf.data(), buf.size(), algo);  // warm up
    double t0 = nowSeconds();
    for (int i = 0; i < iters; ++i) run(buf.data(), buf.size(), algo);
    return (nowSeconds() - t0) / iters;
  }

  void close() { links_.reset(); }

 private:
  void live() {
    if (!links_) fail(Code::kAborted, "DirectAllreduce is closed");
  }
  std::shared_ptr<rendezvous::Store> store_;
  Config cfg_;
  std::unique_ptr<transport::RingLinks> links_;
  std::unique_ptr<transport::Waiter> waiter_;
  collectives::RingComm comm_;
  std::string default_algo_;
};

}  // namespace

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
  m.def("last_collective_stats", [] {
    const collectives::AllreduceStats st = collectives::lastAllreduceStats();
    py::dict d;
    d["collective"] = "allreduce";
    d["algo"] = collectives::allreduceAlgoName(st.algo);
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
  using Release = py::call_guard<py::gil_scoped_release>;
  py::class_<DirectAllreduce>(m, "DirectAllreduce")
      .def(py::init<std::shared_ptr<rendezvous::Store>, int, int, const std::string&>(),
           py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("secret"), Release())
      .def("allreduce",
           [](DirectAllreduce& d, py::array_t<float, py::array::c_style> arr,
              const std::string& algo) {
             float* p = arr.mutable_data();
             size_t n = static_cast<size_t>(arr.size());
             py::gil_scoped_release nogil;
             d.run(p, n, algo);
           },
           py::arg("arr"), py::arg("algo") = "auto")
      .def("time", &DirectAllreduce::time, py::arg("nbytes"), py::arg("algo"),
           py::arg("iters"), Release())
      .def("algorithm", &DirectAllreduce::algorithm, py::arg("nbytes"),
           py::arg("algo") = "auto")
      .def("close", &DirectAllreduce::close, Release());
}

}  // namespace python
}  // namespace tfring
