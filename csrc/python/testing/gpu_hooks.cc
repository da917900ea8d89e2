// tfring._core_testing GPU hooks:
//
//   emulate_pull_ring(kind, ring, inputs, dtype, op="sum", postscale=1.0,
//                     root=0, rank_counts=[], chunk_bytes=64, num_events=4,
//                     repeats=2) -> [bytes]
//       the CUDA-IPC ring's schedule and counter protocol (gpu/pull_ring.h)
//       run on host threads, one per rank; each rank's final buffer.
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <string>
#include <vector>

#include "common/types.h"
#include "gpu/pull_ring.h"
#include "python/testing/testing.h"

namespace py = pybind11;

namespace tfring {
namespace python {
namespace testing {
namespace {

std::vector<char> bytesOf(const py::array& a) {
  py::array c = py::array::ensure(a, py::array::c_style);
  const char* p = static_cast<const char*>(c.data());
  return std::vector<char>(p, p + c.nbytes());
}

}  // namespace

void bindGpuHooks(py::module_& m) {
  m.def(
      "emulate_pull_ring",
      [](const std::string& kind, const std::vector<int>& ring, const std::vector<py::array>& inputs,
         const std::string& dtype, const std::string& op, double postscale, int root,
         const std::vector<size_t>& rank_counts, size_t chunk_bytes, int num_events, int repeats) {
        DataType dt;
        if (!parseDataType(dtype, &dt)) throw py::type_error("unknown dtype " + dtype);
        ReduceOp rop;
        if (!parseReduceOp(op, &rop)) throw py::value_error("unknown reduce op '" + op +
                                "' (expected sum, average, min, max or product)");
        std::vector<std::vector<char>> in;
        for (auto& a : inputs) in.push_back(bytesOf(a));
        std::vector<std::vector<char>> out;
        {
          py::gil_scoped_release nogil;
          try {
            out = gpu::emulatePullRing(kind, ring, in, dt, rop, postscale, root, rank_counts,
                                       chunk_bytes, num_events, repeats);
          } catch (const Error& e) {
            py::gil_scoped_acquire gil;
            throwStatus(e.status());
          }
        }
        py::list res;
        for (auto& b : out) res.append(py::bytes(b.data(), b.size()));
        return res;
      },
      py::arg("kind"), py::arg("ring"), py::arg("inputs"), py::arg("dtype"), py::arg("op") = "sum",
      py::arg("postscale") = 1.0, py::arg("root") = 0, py::arg("rank_counts") = std::vector<size_t>{},
      py::arg("chunk_bytes") = 64, py::arg("num_events") = 4, py::arg("repeats") = 2,
      "The CUDA-IPC ring's schedule and counter protocol run on host threads; "
      "returns each rank's final buffer as bytes.");
}

}  // namespace testing
}  // namespace python
}  // namespace tfring
