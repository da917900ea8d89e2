// tfring._core.alltoall and tfring._core.join on numpy arrays (blocking).
//
// alltoall(array, splits=None, name=None, process_set=0) -> (output,
// received_splits): splits[i] rows of dim 0 go to rank i of the process set
// (None: an even split); the output holds the rows received from every rank
// of the set in its rank order, and
// received_splits (int64) how many came from each. join() -> int: blocks
// until every rank has joined, taking part meanwhile in the others'
// allreduces with zeros; returns the last rank to join.
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <memory>

#include "python/bindings.h"
#include "python/completion.h"
#include "python/errors.h"
#include "runtime/runtime.h"

namespace py = pybind11;

namespace tfring {
namespace python {

namespace {

struct AlltoallState : Completion {
  std::vector<int64_t> out_shape;
  std::unique_ptr<std::vector<char>> out_buf;
  std::vector<int64_t> received;
};

bool dtypeOf(const py::dtype& d, DataType* dt) {
  std::string name = py::str(d.attr("name"));
  return parseDataType(name, dt) && dtypeSize(*dt) == static_cast<size_t>(d.itemsize());
}

py::tuple alltoall(py::object a, py::object splits, py::object name, int process_set) {
  py::array in = py::array::ensure(a, py::array::c_style);
  if (!in) throw py::type_error("expected an array-like input");
  DataType dt;
  if (!dtypeOf(in.dtype(), &dt))
    throw py::type_error(strCat("tfring alltoall does not support dtype ",
                                std::string(py::str(in.dtype().attr("name")))));
  auto st = std::make_shared<AlltoallState>();
  st->process_set = process_set;  // wait() drives that set's engine
  runtime::Request req;
  req.process_set = process_set;
  req.name = autoName("alltoall", name);
  req.type = CollectiveType::kAlltoall;
  req.dtype = dt;
  for (py::ssize_t i = 0; i < in.ndim(); ++i) req.shape.push_back(in.shape(i));
  if (!splits.is_none())
    for (auto v : splits) req.splits.push_back(py::cast<int64_t>(v));
  req.input = in.data();
  req.received_splits = &st->received;
  AlltoallState* raw = st.get();
  req.allocate = [raw, dt](const std::vector<int64_t>& shape, void** data) {
    int64_t n = 1;
    for (auto d : shape) n *= d;
    raw->out_shape = shape;
    raw->out_buf.reset(new std::vector<char>(static_cast<size_t>(n) * dtypeSize(dt) + 1));
    *data = raw->out_buf->data();
    return Status::OK();
  };
  Status s;
  {
    py::gil_scoped_release nogil;
    s = runtime::enqueue(std::move(req), [st](const Status& status) { st->finish(status); });
  }
  if (!s.ok()) throwStatus(s);
  st->wait(-1.0);
  auto* vec = st->out_buf.release();
  py::capsule owner(vec, [](void* p) { delete static_cast<std::vector<char>*>(p); });
  std::vector<py::ssize_t> shape(st->out_shape.begin(), st->out_shape.end());
  py::array out(in.dtype(), shape, vec->data(), owner);
  py::array_t<int64_t> rs(static_cast<py::ssize_t>(st->received.size()));
  for (size_t i = 0; i < st->received.size(); ++i) rs.mutable_at(i) = st->received[i];
  return py::make_tuple(out, rs);
}

int join() {
  auto st = std::make_shared<Completion>();
  auto last = std::make_shared<int32_t>(-1);
  runtime::Request req;
  req.name = "tfring.join";
  req.type = CollectiveType::kJoin;
  req.dtype = DataType::kInt32;
  req.output = last.get();
  Status s;
  {
    py::gil_scoped_release nogil;
    s = runtime::enqueue(std::move(req), [st, last](const Status& status) { st->finish(status); });
  }
  if (!s.ok()) throwStatus(s);
  st->wait(-1.0);
  return *last;
}

}  // namespace

void bindAlltoallJoin(py::module_& m) {
  m.def("alltoall", &alltoall, py::arg("array"), py::arg("splits") = py::none(),
        py::arg("name") = py::none(), py::arg("process_set") = 0,
        "Sends splits[i] rows of dim 0 to rank i of the process set (None: an even "
        "split); returns (output, received_splits).");
  m.def("join", &join,
        "Blocks until every rank has joined, taking part in the others' allreduces with "
        "zeros; returns the last rank to join.");
}

}  // namespace python
}  // namespace tfring
