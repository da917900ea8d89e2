// tfring._core runtime functions: init/shutdown/topology, and the four
// collectives on numpy arrays, blocking or async (Handle.wait()).
//
// Buffers: inputs are kept alive by the Python-side Handle; outputs of a
// known shape are numpy arrays allocated up front; allgather/reducescatter
// outputs are allocated by the engine thread in plain C++ memory and wrapped
// into numpy (without copying) in wait(). The engine thread never touches a
// Python object.
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>

#include "python/bindings.h"
#include "python/completion.h"
#include "python/errors.h"
#include "python/gpu_binding.h"
#include "common/tunables.h"
#include "rendezvous/store.h"
#include "runtime/runtime.h"

namespace py = pybind11;

namespace tfring {
namespace python {

namespace {

struct State : Completion {
  std::vector<int64_t> out_shape;
  std::unique_ptr<std::vector<char>> out_buf;  // engine-allocated output
};

class Handle {
 public:
  Handle(std::shared_ptr<State> st, py::object input, py::object output, py::dtype dtype)
      : st_(std::move(st)), input_(std::move(input)), output_(std::move(output)),
        dtype_(std::move(dtype)) {}
  ~Handle() { st_->waitQuietly(); }
  bool poll() { return st_->poll(); }
  py::object wait(double timeout) {
    st_->wait(timeout);
    if (st_->out_buf) {
      auto* vec = st_->out_buf.release();
      py::capsule owner(vec, [](void* p) { delete static_cast<std::vector<char>*>(p); });
      std::vector<py::ssize_t> shape(st_->out_shape.begin(), st_->out_shape.end());
      output_ = py::array(dtype_, shape, vec->data(), owner);
    }
    return output_;
  }

 private:
  std::shared_ptr<State> st_;
  py::object input_, output_;
  py::dtype dtype_;
};

// The common numpy dtypes by kind and size, without asking numpy for the
// name (dtype.name is computed in Python, which costs microseconds).
bool builtinDtype(const py::dtype& d, DataType* dt) {
  const char k = d.kind();
  const auto n = d.itemsize();
  if (k == 'f') {
    if (n == 2) { *dt = DataType::kFloat16; return true; }
    if (n == 4) { *dt = DataType::kFloat32; return true; }
    if (n == 8) { *dt = DataType::kFloat64; return true; }
  } else if (k == 'i') {
    if (n == 1) { *dt = DataType::kInt8; return true; }
    if (n == 2) { *dt = DataType::kInt16; return true; }
    if (n == 4) { *dt = DataType::kInt32; return true; }
    if (n == 8) { *dt = DataType::kInt64; return true; }
  } else if (k == 'u' && n == 1) {
    *dt = DataType::kUInt8;
    return true;
  } else if (k == 'u' && n == 2) {
    *dt = DataType::kUInt16;
    return true;
  } else if (k == 'b' && n == 1) {
    *dt = DataType::kBool;
    return true;
  }
  return false;
}

DataType resolveDtype(const py::array& a, const py::object& dtype) {
  DataType dt;
  if (dtype.is_none() && builtinDtype(a.dtype(), &dt)) return dt;
  std::string name = dtype.is_none() ? std::string(py::str(a.dtype().attr("name")))
                                     : std::string(py::str(dtype));
  if (!parseDataType(name, &dt))
    throw py::type_error(strCat("tfring does not support dtype ", name,
                                " (supported: float16, bfloat16, float32, float64, int32, "
                                "int64, uint8, int8, int16, uint16, bool)"));
  if (dtypeSize(dt) != static_cast<size_t>(a.itemsize()))
    throw py::type_error(strCat("dtype ", name, " needs ", dtypeSize(dt),
                                "-byte elements but the array has ", a.itemsize()));
  return dt;
}

ReduceOp resolveOp(const std::string& s) {
  ReduceOp op;
  if (!parseReduceOp(s, &op))
    throw py::value_error(strCat("unknown reduce op '", s,
                                 "' (expected sum, average, min, max or product)"));
  return op;
}

}  // namespace

// Unnamed collectives are matched across ranks by call order: the n-th
// unnamed call is named after n modulo kAutoNames. A name without a cache id
// is agreed in the engine's round like a cached one (runtime/fresh_names.h), so
// such calls never wait for the coordinator; the names cycle through a
// fixed set, so whatever does reach the coordinator keeps its cache
// bounded. Only a caller with kAutoNames unnamed collectives in flight at
// once would see a duplicate-name error.
constexpr uint64_t kAutoNames = 4096;

// What a mismatch of an unnamed collective adds to its error.
const char kUnnamedHint[] =
    " (an unnamed collective: ranks match unnamed calls by their order, so every rank must "
    "make its unnamed collectives in the same order, or give them names)";

std::string autoName(const char* kind, const py::object& name) {
  static std::atomic<uint64_t> counter{0};
  if (!name.is_none()) return std::string(py::str(name));
  return strCat(kind, ".noname.", counter++ % kAutoNames);
}

namespace {

std::unique_ptr<Handle> submit(CollectiveType type, py::array input, const std::string& name,
                               ReduceOp op, int root, double prescale, double postscale,
                               const py::object& dtype_override, py::object out,
                               int process_set, WireType wire, bool blocking = false) {
  py::array in = py::array::ensure(input, py::array::c_style);
  if (!in) throw py::type_error("expected an array-like input");
  DataType dt = resolveDtype(in, dtype_override);
  auto st = std::make_shared<State>();
  st->process_set = process_set;
  runtime::Request req;
  req.process_set = process_set;
  req.name = name;
  req.type = type;
  req.dtype = dt;
  for (py::ssize_t i = 0; i < in.ndim(); ++i) req.shape.push_back(in.shape(i));
  req.op = op;
  req.root = root;
  req.prescale = prescale;
  req.postscale = postscale;
  req.wire = wire;
  req.input = in.data();
  req.caller_drives = blocking;
  py::object output = py::none();
  if (type == CollectiveType::kAllreduce || type == CollectiveType::kBroadcast) {
    py::array o;
    if (!out.is_none()) {
      o = py::array::ensure(out);
      if (!o || !(o.flags() & py::array::c_style) || !o.writeable() || o.nbytes() != in.nbytes() ||
          !o.dtype().is(in.dtype()))
        throw py::value_error("out= must be a writable C-contiguous array like the input");
    } else {
      o = py::array(in.dtype(), std::vector<py::ssize_t>(in.shape(), in.shape() + in.ndim()));
    }
    req.output = o.mutable_data();
    output = o;
  } else {
    State* raw = st.get();
    req.allocate = [raw, dt](const std::vector<int64_t>& shape, void** data) {
      int64_t n = 1;
      for (auto d : shape) n *= d;
      raw->out_shape = shape;
      raw->out_buf.reset(new std::vector<char>(static_cast<size_t>(n) * dtypeSize(dt) + 1));
      *data = raw->out_buf->data();
      return Status::OK();
    };
  }
  const bool unnamed = name.find(".noname.") != std::string::npos;
  Status s;
  {
    py::gil_scoped_release nogil;
    s = runtime::enqueue(std::move(req), [st, unnamed](const Status& status) {
      if (unnamed && status.code() == Code::kMismatch)
        st->finish(Status(status.code(), status.message() + kUnnamedHint));
      else
        st->finish(status);
    });
  }
  if (!s.ok()) throwStatus(s);
  return std::unique_ptr<Handle>(new Handle(st, in, output, in.dtype()));
}

// A collective's arguments, in the order of its signature:
//   (array, op="sum", name=None, root=0, prescale=1.0, postscale=1.0,
//    dtype=None, out=None, process_set=0, wire=None)
// wire: "float16" or "bfloat16" puts 16-bit words on the links of a float32
// allreduce, accumulating in float32 (docs/compression.md); other dtypes
// ignore it.
// parsed by hand. pybind11 matches keywords by building a Python string per
// parameter on every call, which cost about 0.9 us of a 2.9 us call (a 4 KiB
// allreduce at one rank); here each keyword is compared once, in place.
struct CollArgs {
  py::object array, name = py::none(), dtype = py::none(), out = py::none();
  std::string op = "sum";
  int root = 0, process_set = 0;
  double prescale = 1.0, postscale = 1.0;
  WireType wire = WireType::kNone;
};

constexpr const char* kCollParams[] = {"array",     "op",    "name", "root",       "prescale",
                                       "postscale", "dtype", "out",  "process_set", "wire"};
constexpr int kNumCollParams = sizeof(kCollParams) / sizeof(kCollParams[0]);
const char kCollSignature[] =
    "(array, op='sum', name=None, root=0, prescale=1.0, postscale=1.0, dtype=None, "
    "out=None, process_set=0, wire=None)";

template <typename T>
T argAs(const char* fn, int i, PyObject* v, const char* want) {
  try {
    return py::cast<T>(py::handle(v));
  } catch (const py::cast_error&) {
    throw py::type_error(strCat(fn, "(): argument '", kCollParams[i], "' must be ", want,
                                ", not ", Py_TYPE(v)->tp_name));
  }
}

CollArgs parseCollArgs(const char* fn, const py::args& args, const py::kwargs& kwargs) {
  PyObject* v[kNumCollParams] = {};
  const auto npos = static_cast<int>(args.size());
  if (npos > kNumCollParams)
    throw py::type_error(strCat(fn, "() takes at most ", kNumCollParams,
                                " positional arguments (", npos, " given)"));
  for (int i = 0; i < npos; ++i) v[i] = PyTuple_GET_ITEM(args.ptr(), i);
  PyObject *key, *value;
  Py_ssize_t pos = 0;
  while (kwargs && PyDict_Next(kwargs.ptr(), &pos, &key, &value)) {
    int i = 0;
    while (i < kNumCollParams && PyUnicode_CompareWithASCIIString(key, kCollParams[i]) != 0) ++i;
    if (i == kNumCollParams)
      throw py::type_error(strCat(fn, "() got an unexpected keyword argument '",
                                  std::string(py::str(key)), "'"));
    if (v[i]) throw py::type_error(strCat(fn, "() got multiple values for argument '",
                                          kCollParams[i], "'"));
    v[i] = value;
  }
  if (!v[0]) throw py::type_error(strCat(fn, "() missing required argument 'array'"));
  CollArgs a;
  a.array = py::reinterpret_borrow<py::object>(v[0]);
  if (v[1]) a.op = argAs<std::string>(fn, 1, v[1], "str");
  if (v[2]) a.name = py::reinterpret_borrow<py::object>(v[2]);
  if (v[3]) a.root = argAs<int>(fn, 3, v[3], "int");
  if (v[4]) a.prescale = argAs<double>(fn, 4, v[4], "float");
  if (v[5]) a.postscale = argAs<double>(fn, 5, v[5], "float");
  if (v[6]) a.dtype = py::reinterpret_borrow<py::object>(v[6]);
  if (v[7]) a.out = py::reinterpret_borrow<py::object>(v[7]);
  if (v[8]) a.process_set = argAs<int>(fn, 8, v[8], "int");
  if (v[9] && v[9] != Py_None) {
    const std::string w = argAs<std::string>(fn, 9, v[9], "str or None");
    if (!parseWireType(w, &a.wire))
      throw py::value_error(strCat(fn, "(): unknown wire '", w,
                                   "' (expected None, 'float16' or 'bfloat16')"));
  }
  return a;
}

// The numpy-level CUDA path (gpu_arrays.cc) runs on the world only; TF's
// GPU kernels take process sets.
void cudaProcessSetCheck(int process_set) {
  if (process_set != 0)
    throw py::value_error("tfring._core: CUDA arrays run on the global process set only; use "
                          "the TensorFlow ops for GPU tensors on other process sets");
}

// A 16-bit wire is an allreduce's: the other collectives move data, not sums.
void wireCheck(const char* fn, CollectiveType type, WireType wire) {
  if (wire != WireType::kNone && type != CollectiveType::kAllreduce)
    throw py::value_error(strCat(fn, "(): wire='", wireTypeName(wire),
                                 "' applies to allreduce only"));
}

}  // namespace

void bindRuntime(py::module_& m) {
  py::class_<Handle>(m, "Handle")
      .def("wait", &Handle::wait, py::arg("timeout") = -1.0,
           "Blocks until the collective finishes; returns its output or raises.")
      .def("poll", &Handle::poll, "True once the collective has finished.");

  m.def("init",
        [](int rank, int size, std::shared_ptr<rendezvous::Store> store, const std::string& secret,
           const py::object& config) {
          // The configuration of this init: it takes precedence over the
          // environment until the next init, and every variable is checked
          // now (common/tunables.h).
          if (!runtime::isInitialized()) {
            tunables::setOverrides(configArg(config));
            tunables::validateAll();
          }
          runtime::InitOptions o;
          o.rank = rank;
          o.size = size;
          o.store = std::move(store);
          o.secret = secret;
          Status s;
          {
            py::gil_scoped_release nogil;
            s = runtime::init(o);
          }
          if (!s.ok()) throwStatus(s);
        },
        py::arg("rank") = 0, py::arg("size") = 1, py::arg("store") = nullptr,
        py::arg("secret") = "", py::arg("config") = py::none(),
        "Joins the job. `config`: a mapping of TFRING_* tunables to values that takes "
        "precedence over the environment (tfring._core.tunables() lists them).");
  m.def("shutdown", &runtime::shutdown, py::call_guard<py::gil_scoped_release>());
  m.def("is_initialized", &runtime::isInitialized);
  m.def("rank", &runtime::rank);
  m.def("size", &runtime::size);
  m.def("local_rank", &runtime::localRank);
  m.def("local_size", &runtime::localSize);
  m.def("cross_rank", &runtime::crossRank);
  m.def("cross_size", &runtime::crossSize);
  m.def("is_homogeneous", &runtime::isHomogeneous);
  m.def("transport", &runtime::transportName);
  // {"large": {...}, "medium": {...}}: runtime::storeModes for ring
  // collectives from 8 MiB of output and from 256 KiB.
  m.def("ring_store_modes", []() {
    py::dict out;
    for (bool large : {true, false}) {
      const auto m = runtime::storeModes(large);
      py::dict d;
      d["ordinary_s_per_byte"] = m.ordinary_s_per_byte;
      d["streaming_s_per_byte"] = m.streaming_s_per_byte;
      d["calls"] = m.calls;
      out[large ? "large" : "medium"] = d;
    }
    return out;
  });
  m.def("config", []() {
    const Config& c = runtime::config();
    py::dict d;
    d["fusion_threshold"] = c.fusion_threshold;
    d["cycle_time_ms"] = c.cycle_time_ms;
    d["timeout_s"] = c.timeout_s;
    d["stall_warning_s"] = c.stall_warning_s;
    d["heartbeat_timeout_s"] = c.heartbeat_timeout_s;
    d["chunk_bytes"] = c.chunk_bytes;
    d["shm_buffer_bytes"] = c.shm_buffer_bytes;
    d["transport"] = c.transport;
    d["timeline"] = c.timeline;
    d["iface_addr"] = c.iface_addr;
    d["log_level"] = c.log_level;
    d["cache_enabled"] = c.cache_enabled;
    return d;
  });
  m.def("reducescatter_shape", &runtime::reducescatterShape);
  m.def("start_timeline", [](const std::string& path) {
    Status s = runtime::startTimeline(path);
    if (!s.ok()) throwStatus(s);
  }, py::arg("path"));
  m.def("stop_timeline", []() {
    Status s = runtime::stopTimeline();
    if (!s.ok()) throwStatus(s);
  });

  auto arOpts = [](const char* kind, CollectiveType type, const char* fn) {
    return [kind, type, fn](py::args args, py::kwargs kwargs) -> py::object {
      CollArgs a = parseCollArgs(fn, args, kwargs);
      wireCheck(fn, type, a.wire);
      if (isCudaArray(a.array)) {  // gpu_arrays.cc
        cudaProcessSetCheck(a.process_set);
        return submitCuda(type, a.array, autoName(kind, a.name), resolveOp(a.op), a.root,
                          a.prescale, a.postscale, a.dtype, a.out);
      }
      return py::cast(submit(type, py::array(a.array), autoName(kind, a.name), resolveOp(a.op),
                             a.root, a.prescale, a.postscale, a.dtype, a.out, a.process_set,
                             a.wire));
    };
  };
  // The blocking form waits in C++ on the handle it made, without a Python
  // Handle object in between.
  auto blocking = [](const char* kind, CollectiveType type, const char* fn) {
    return [kind, type, fn](py::args args, py::kwargs kwargs) -> py::object {
      CollArgs a = parseCollArgs(fn, args, kwargs);
      wireCheck(fn, type, a.wire);
      if (isCudaArray(a.array)) {
        cudaProcessSetCheck(a.process_set);
        return submitCuda(type, a.array, autoName(kind, a.name), resolveOp(a.op), a.root,
                          a.prescale, a.postscale, a.dtype, a.out)
            .attr("wait")(-1.0);
      }
      py::array arr = py::isinstance<py::array>(a.array)
                          ? py::reinterpret_borrow<py::array>(a.array)
                          : py::array(a.array);
      auto h = submit(type, arr, autoName(kind, a.name), resolveOp(a.op), a.root, a.prescale,
                      a.postscale, a.dtype, a.out, a.process_set, a.wire, /*blocking=*/true);
      return h->wait(-1.0);
    };
  };
  struct Spec { const char* name; const char* async_name; CollectiveType type; };
  for (Spec sp : {Spec{"allreduce", "allreduce_async", CollectiveType::kAllreduce},
                  Spec{"allgather", "allgather_async", CollectiveType::kAllgather},
                  Spec{"broadcast", "broadcast_async", CollectiveType::kBroadcast},
                  Spec{"reducescatter", "reducescatter_async",
                       CollectiveType::kReducescatter}}) {
    m.def(sp.async_name, arOpts(sp.name, sp.type, sp.async_name),
          strCat(sp.async_name, kCollSignature, " -> Handle").c_str());
    m.def(sp.name, blocking(sp.name, sp.type, sp.name),
          strCat(sp.name, kCollSignature, " -> object").c_str());
  }

  // Process sets (runtime.h): the core holds the sets and hands out their
  // ids; the Python layer (tfring/process_sets.py) checks that every rank
  // passes the same ranks before it adds or removes one.
  m.def("add_process_set",
        [](int id, const std::vector<int>& ranks) {
          Status s;
          {
            py::gil_scoped_release nogil;
            s = runtime::addProcessSet(id, ranks);
          }
          if (!s.ok()) throwStatus(s);
        },
        py::arg("id"), py::arg("ranks"));
  m.def("remove_process_set",
        [](int id) {
          Status s;
          {
            py::gil_scoped_release nogil;
            s = runtime::removeProcessSet(id);
          }
          if (!s.ok()) throwStatus(s);
        },
        py::arg("id"));
  m.def("process_set_ranks", &runtime::processSetRanks, py::arg("id"));
  m.def("process_set_ids", &runtime::processSetIds);
  m.def("next_process_set_id", &runtime::nextProcessSetId);
  // Fault injection for tests (runtime.h): fails communicator `process_set`
  // from this rank; its members' next collectives on it raise.
  m.def(
      "_fail_communicator",
      [](int process_set, const std::string& message) {
        Status s = runtime::failCommunicator(process_set, message);
        if (!s.ok()) throwStatus(s);
      },
      py::arg("process_set"), py::arg("message"));
}

}  // namespace python
}  // namespace tfring
