// tfring._core_testing.DirectAllreduce: the collective algorithms outside
// the engine, for tests and benchmarks that measure an algorithm by itself.
//
//   DirectAllreduce(store, rank, size, secret)
//       connects this rank's own ring links and host segment through `store`
//       (a tfring._core store; TFRING_* tunables read as at init), with no
//       engine or coordinator.
//     .allreduce(arr, algo="auto", wire=None, op="sum", postscale=1.0)
//                                    in-place float32 allreduce; wire
//                                    "float16"/"bfloat16": 16-bit words on
//                                    the links, float32 sums
//     .allgather(arr, algo="auto")   uint8 blocks of every rank, in rank
//                                    order (ragged: sizes exchanged first)
//     .broadcast(arr, root, algo="auto") in place, from rank `root`
//     .time(nbytes, algo, iters, collective="allreduce")
//                                    seconds per call, back to back; nbytes
//                                    is the buffer (allgather: per rank)
//     .algorithm(nbytes, algo="auto") the algorithm that size would take
//     .close()
// Every rank must make the same calls in the same order.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "collectives/allgather.h"
#include "collectives/allreduce.h"
#include "collectives/broadcast.h"
#include "common/abort.h"
#include "common/env.h"
#include "python/stats_dict.h"
#include "python/testing/testing.h"
#include "rendezvous/store.h"
#include "transport/ring_links.h"

namespace py = pybind11;

namespace tfring {
namespace python {
namespace testing {
namespace {

class DirectAllreduce {
 public:
  DirectAllreduce(std::shared_ptr<rendezvous::Store> store, int rank, int size,
                  const std::string& secret)
      : store_(std::move(store)), cfg_(Config::fromEnv()) {
    links_ = transport::RingLinks::connect(store_.get(), rank, size, secret, cfg_, &abort_);
    waiter_.reset(
        new transport::Waiter(links_->bell(), links_->right(), links_->left(), &abort_));
    comm_ = collectives::makeRingComm(*links_, waiter_.get(), cfg_);
    default_algo_ = comm_.host->policy.allreduce_algo;
    default_allgather_ = comm_.host->policy.allgather_algo;
    default_broadcast_ = comm_.host->policy.broadcast_algo;
    // Waits spin only where every local rank has a core, as in the engine.
    transport::setSpinning(links_->topology().local_size <= transport::usableCores());
  }

  // The last collective of these links (they are a communicator of their
  // own, with their own statistics).
  collectives::CollectiveStats lastStats() const {
    return collectives::lastCollectiveStats(*comm_.stats);
  }

  void run(float* data, size_t count, const std::string& algo,
           WireType wire = WireType::kNone, ReduceOp op = ReduceOp::kSum,
           double postscale = 1.0) {
    live();
    comm_.host->policy.allreduce_algo = algo == "auto" ? default_algo_ : algo;
    collectives::allreduce(comm_, data, data, count, DataType::kFloat32,
                           op == ReduceOp::kAverage ? ReduceOp::kSum : op,
                           op == ReduceOp::kAverage ? postscale / comm_.size : postscale, wire);
    comm_.host->policy.allreduce_algo = default_algo_;
  }

  // The allgather of this rank's `mine` bytes; every rank's size travels
  // first in a fixed-size allgather, as the engine's negotiation would.
  std::vector<char> allgather(const char* mine, size_t n, const std::string& algo) {
    live();
    std::vector<size_t> sizes(comm_.size, 0);
    const int me = comm_.ring[comm_.pos];
    sizes[me] = n;
    collectives::ringAllgather(comm_, sizes.data(),
                               std::vector<size_t>(comm_.size, sizeof(size_t)));
    std::vector<size_t> rank_bytes(sizes.begin(), sizes.end());
    size_t off = 0, total = 0;
    for (int r = 0; r < comm_.size; ++r) {
      if (r < me) off += rank_bytes[r];
      total += rank_bytes[r];
    }
    std::vector<char> out(total);
    if (n) std::memcpy(out.data() + off, mine, n);
    comm_.host->policy.allgather_algo = algo == "auto" ? default_allgather_ : algo;
    collectives::allgather(comm_, out.data(), rank_bytes);
    comm_.host->policy.allgather_algo = default_allgather_;
    return out;
  }

  void broadcast(char* data, size_t n, int root, const std::string& algo) {
    live();
    if (root < 0 || root >= comm_.size)
      fail(Code::kInvalidArgument, "broadcast root ", root, " is not a rank of ", comm_.size);
    comm_.host->policy.broadcast_algo = algo == "auto" ? default_broadcast_ : algo;
    collectives::broadcast(comm_, data, n, root);
    comm_.host->policy.broadcast_algo = default_broadcast_;
  }

  std::string algorithm(size_t nbytes, const std::string& algo) {
    live();
    comm_.host->policy.allreduce_algo = algo == "auto" ? default_algo_ : algo;
    auto a = collectives::chooseAllreduce(comm_, nbytes);
    comm_.host->policy.allreduce_algo = default_algo_;
    return collectives::allreduceAlgoName(a);
  }

  double time(size_t nbytes, const std::string& algo, int iters, const std::string& what) {
    std::vector<float> buf(nbytes / 4, 1.0f);
    std::vector<char> out(nbytes * comm_.size);
    std::vector<size_t> rank_bytes(comm_.size, nbytes);
    auto once = [&]() {
      if (what == "allreduce") {
        run(buf.data(), buf.size(), algo);
      } else if (what == "allgather") {
        live();
        comm_.host->policy.allgather_algo = algo == "auto" ? default_allgather_ : algo;
        collectives::allgather(comm_, out.data(), rank_bytes);
        comm_.host->policy.allgather_algo = default_allgather_;
      } else if (what == "broadcast") {
        broadcast(reinterpret_cast<char*>(buf.data()), nbytes, 0, algo);
      } else {
        fail(Code::kInvalidArgument, "unknown collective '", what, "'");
      }
    };
    once();  // warm up
    if (what == "broadcast") {
      // Back-to-back broadcasts overlap (the root never waits for anyone),
      // so each one starts after a barrier and only its own time counts,
      // as in osu_bcast: the slowest rank's mean is the latency to the last
      // receiver.
      double sum = 0;
      for (int i = 0; i < iters; ++i) {
        barrier();
        double t0 = nowSeconds();
        once();
        sum += nowSeconds() - t0;
      }
      return sum / iters;
    }
    double t0 = nowSeconds();
    for (int i = 0; i < iters; ++i) once();
    return (nowSeconds() - t0) / iters;
  }

  // Every rank leaves within about one hop of the others: a one-float
  // allreduce by recursive doubling where the links exist.
  void barrier() {
    float x = 0;
    comm_.host->policy.allreduce_algo = comm_.host->want_peers ? "recdbl" : default_algo_;
    collectives::allreduce(comm_, &x, &x, 1, DataType::kFloat32, ReduceOp::kSum, 1.0);
    comm_.host->policy.allreduce_algo = default_algo_;
  }

  void close() { links_.reset(); }

 private:
  void live() {
    if (!links_) fail(Code::kAborted, "DirectAllreduce is closed");
  }
  std::shared_ptr<rendezvous::Store> store_;
  Config cfg_;
  AbortState abort_;  // the links' failure state; outlives them
  std::unique_ptr<transport::RingLinks> links_;
  std::unique_ptr<transport::Waiter> waiter_;
  collectives::RingComm comm_;
  std::string default_algo_, default_allgather_, default_broadcast_;
};

}  // namespace

void bindDirectAllreduce(py::module_& m) {
  using Release = py::call_guard<py::gil_scoped_release>;
  py::class_<DirectAllreduce>(m, "DirectAllreduce")
      .def(py::init<std::shared_ptr<rendezvous::Store>, int, int, const std::string&>(),
           py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("secret"), Release())
      .def("allreduce",
           [](DirectAllreduce& d, py::array_t<float, py::array::c_style> arr,
              const std::string& algo, const py::object& wire, const std::string& op,
              double postscale) {
             WireType w = WireType::kNone;
             if (!wire.is_none() && !parseWireType(py::str(wire), &w))
               throw py::value_error("unknown wire '" + std::string(py::str(wire)) + "'");
             ReduceOp o;
             if (!parseReduceOp(op, &o)) throw py::value_error("unknown op '" + op + "'");
             float* p = arr.mutable_data();
             size_t n = static_cast<size_t>(arr.size());
             py::gil_scoped_release nogil;
             d.run(p, n, algo, w, o, postscale);
           },
           py::arg("arr"), py::arg("algo") = "auto", py::arg("wire") = py::none(),
           py::arg("op") = "sum", py::arg("postscale") = 1.0)
      .def("allgather",
           [](DirectAllreduce& d, py::array_t<uint8_t, py::array::c_style> arr,
              const std::string& algo) {
             const char* p = reinterpret_cast<const char*>(arr.data());
             size_t n = static_cast<size_t>(arr.size());
             std::vector<char> out;
             {
               py::gil_scoped_release nogil;
               out = d.allgather(p, n, algo);
             }
             py::array_t<uint8_t> res(static_cast<py::ssize_t>(out.size()));
             if (!out.empty()) std::memcpy(res.mutable_data(), out.data(), out.size());
             return res;
           },
           py::arg("arr"), py::arg("algo") = "auto")
      .def("broadcast",
           [](DirectAllreduce& d, py::array_t<uint8_t, py::array::c_style> arr, int root,
              const std::string& algo) {
             char* p = reinterpret_cast<char*>(arr.mutable_data());
             size_t n = static_cast<size_t>(arr.size());
             py::gil_scoped_release nogil;
             d.broadcast(p, n, root, algo);
           },
           py::arg("arr").noconvert(), py::arg("root"), py::arg("algo") = "auto")
      .def("time", &DirectAllreduce::time, py::arg("nbytes"), py::arg("algo"),
           py::arg("iters"), py::arg("collective") = "allreduce", Release())
      .def("algorithm", &DirectAllreduce::algorithm, py::arg("nbytes"),
           py::arg("algo") = "auto")
      .def("last_collective_stats",
           [](DirectAllreduce& d) { return python::collectiveDict(d.lastStats()); })
      .def("close", &DirectAllreduce::close, Release());
}

}  // namespace testing
}  // namespace python
}  // namespace tfring
