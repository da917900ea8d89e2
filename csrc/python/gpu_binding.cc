// tfring._core GPU support: collectives on objects exposing
// __cuda_array_interface__ (CuPy, PyTorch, Numba, CudaArray), the CudaArray
// result type, CUDA/NCCL/backend queries, the CUDA kernels (tests and
// benchmarks) and the GPU backend choice on described ranks.
//
// Collectives on GPU arrays (see submitCuda):
//   allreduce(x) / broadcast(x)      -> out= (any CUDA array of x's size and
//                                       dtype, may be x) or a new CudaArray
//   allgather(x) / reducescatter(x)  -> a new CudaArray
// CudaArray exposes __cuda_array_interface__ (v3), so cupy.asarray(y) or
// torch.as_tensor(y, device="cuda") wrap it without a copy; y.to_numpy()
// copies it to the host. The input's producer stream (the interface's
// "stream" entry) is honoured: tfring reads the input only after the work
// queued on it before the call; results are complete on the device when
// wait() returns, so they may be used on any stream.
//
//   cuda_available() -> bool          built with CUDA and a GPU is usable
//   cuda_built() -> bool
//   cuda_emulated() -> bool           the test-only CUDA emulation build
//   cuda_device_count() -> int
//   cuda_unavailable_reason() -> str
//   cuda_describe(device) -> str
//   gpu_backend() -> str | None       "nccl", "ring-ipc", "ring-host" or
//                                     "local", once a GPU collective ran
//   gpu_allreduce_algorithms() -> dict  allreduces run per CUDA-IPC algorithm
//   nccl_info() -> dict               where NCCL was found, or why not
//   choose_gpu_backend(requested, ranks, autotune=True) -> (name, calibrate, reason)
//   cuda_reduce / cuda_scale / cuda_cast / cuda_batched_copy (kernels)
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <mutex>

#include "gpu/backend_select.h"
#include "gpu/device.h"
#include "gpu/executor.h"
#include "gpu/nccl_loader.h"
#include "runtime/stream_completion.h"
#include "python/bindings.h"
#include "python/completion.h"
#include "python/errors.h"
#include "python/gpu_binding.h"
#include "runtime/runtime.h"

namespace py = pybind11;

namespace tfring {
namespace python {

namespace {

// --------------------------------------------------------------- dtypes ----

// The array-interface typestr of a tfring dtype (bfloat16 travels as u2).
const char* typestrOf(DataType t) {
  switch (t) {
    case DataType::kFloat16: return "<f2";
    case DataType::kBFloat16: return "<u2";
    case DataType::kFloat32: return "<f4";
    case DataType::kFloat64: return "<f8";
    case DataType::kInt32: return "<i4";
    case DataType::kInt64: return "<i8";
    case DataType::kUInt8: return "|u1";
    case DataType::kInt8: return "|i1";
    case DataType::kBool: return "|b1";
    case DataType::kInt16: return "<i2";
    case DataType::kUInt16: return "<u2";
  }
  return "|u1";
}

// The numpy dtype to copy a tfring dtype into on the host.
py::dtype numpyDtypeOf(DataType t) {
  return py::dtype(t == DataType::kBFloat16 ? std::string("uint16") : std::string(dtypeName(t)));
}

bool dtypeOfTypestr(const std::string& ts, DataType* out) {
  if (ts.size() < 3) return false;
  const std::string k = ts.substr(1);
  if (ts[0] == '>') return false;  // big-endian data
  if (k == "f2") *out = DataType::kFloat16;
  else if (k == "f4") *out = DataType::kFloat32;
  else if (k == "f8") *out = DataType::kFloat64;
  else if (k == "i4") *out = DataType::kInt32;
  else if (k == "i8") *out = DataType::kInt64;
  else if (k == "u1") *out = DataType::kUInt8;
  else if (k == "i1") *out = DataType::kInt8;
  else if (k == "b1") *out = DataType::kBool;
  else return false;
  return true;
}

// ------------------------------------------------------------ CudaArray ----

// Device memory owned by Python: a collective's result.
class CudaArray {
 public:
  CudaArray(std::vector<int64_t> shape, DataType dtype, int device, void* ptr)
      : shape_(std::move(shape)), dtype_(dtype), device_(device), ptr_(ptr) {}
  static std::shared_ptr<CudaArray> empty(std::vector<int64_t> shape, DataType dtype, int device) {
    size_t n = 1;
    for (auto d : shape) n *= static_cast<size_t>(d);
    void* p = gpu::deviceAlloc(device, n * dtypeSize(dtype));
    return std::make_shared<CudaArray>(std::move(shape), dtype, device, p);
  }
  ~CudaArray() { gpu::deviceFree(device_, ptr_); }

  size_t size() const {
    size_t n = 1;
    for (auto d : shape_) n *= static_cast<size_t>(d);
    return n;
  }
  size_t nbytes() const { return size() * dtypeSize(dtype_); }
  void* ptr() const { return ptr_; }
  int device() const { return device_; }
  DataType dtype() const { return dtype_; }
  const std::vector<int64_t>& shape() const { return shape_; }

  py::dict interface() const {
    py::dict d;
    py::tuple shape(shape_.size());
    for (size_t i = 0; i < shape_.size(); ++i) shape[i] = shape_[i];
    d["shape"] = shape;
    d["typestr"] = typestrOf(dtype_);
    d["data"] = py::make_tuple(reinterpret_cast<uintptr_t>(ptr_), false);
    d["version"] = 3;
    d["strides"] = py::none();
    d["stream"] = py::none();  // complete: no synchronization needed
    return d;
  }

  py::array toNumpy() const {
    std::vector<py::ssize_t> shape(shape_.begin(), shape_.end());
    py::array out(numpyDtypeOf(dtype_), shape);
    gpu::copyToHost(out.mutable_data(), ptr_, nbytes(), device_);
    return out;
  }

 private:
  std::vector<int64_t> shape_;
  DataType dtype_;
  int device_;
  void* ptr_;
};

// ----------------------------------------------- __cuda_array_interface__ ----

struct CudaView {
  void* ptr = nullptr;
  std::vector<int64_t> shape;
  std::string typestr;
  size_t itemsize = 0;
  bool readonly = false;
  void* stream = nullptr;  // the producer's stream; null: no sync needed
  size_t count() const {
    size_t n = 1;
    for (auto d : shape) n *= static_cast<size_t>(d);
    return n;
  }
};

CudaView viewOf(const py::object& obj, const char* what) {
  // Our own arrays: the same facts without building the interface dict.
  if (py::isinstance<CudaArray>(obj)) {
    const CudaArray& a = obj.cast<const CudaArray&>();
    CudaView v;
    v.shape = a.shape();
    v.typestr = typestrOf(a.dtype());
    v.ptr = a.ptr();
    v.itemsize = dtypeSize(a.dtype());
    return v;
  }
  py::dict cai = obj.attr("__cuda_array_interface__").cast<py::dict>();
  CudaView v;
  for (auto d : cai["shape"].cast<py::tuple>()) v.shape.push_back(d.cast<int64_t>());
  v.typestr = cai["typestr"].cast<std::string>();
  auto data = cai["data"].cast<py::tuple>();
  v.ptr = reinterpret_cast<void*>(data[0].cast<uintptr_t>());
  v.readonly = data[1].cast<bool>();
  v.itemsize = static_cast<size_t>(std::stoul(v.typestr.substr(2)));
  if (cai.contains("mask") && !cai["mask"].is_none())
    throw py::value_error(strCat(what, ": masked CUDA arrays are not supported"));
  if (cai.contains("strides") && !cai["strides"].is_none()) {
    auto strides = cai["strides"].cast<py::tuple>();
    int64_t expect = static_cast<int64_t>(v.itemsize);
    for (int i = static_cast<int>(v.shape.size()) - 1; i >= 0; --i) {
      if (v.shape[i] > 1 && strides[i].cast<int64_t>() != expect)
        throw py::value_error(strCat(what, ": the CUDA array must be C-contiguous"));
      expect *= v.shape[i];
    }
  }
  if (cai.contains("stream") && !cai["stream"].is_none()) {
    auto s = cai["stream"].cast<uintptr_t>();
    if (s == 0)
      throw py::value_error(strCat(what, ": __cuda_array_interface__ stream 0 is not allowed"));
    v.stream = reinterpret_cast<void*>(s);
  }
  return v;
}

DataType resolveCudaDtype(const CudaView& v, const py::object& dtype) {
  DataType dt;
  if (!dtype.is_none()) {
    std::string name = py::str(dtype);
    if (!parseDataType(name, &dt))
      throw py::type_error(strCat("tfring does not support dtype ", name));
    if (dtypeSize(dt) != v.itemsize)
      throw py::type_error(strCat("dtype ", name, " needs ", dtypeSize(dt),
                                  "-byte elements but the array has ", v.itemsize));
    return dt;
  }
  if (!dtypeOfTypestr(v.typestr, &dt))
    throw py::type_error(strCat("tfring does not support CUDA arrays of typestr '", v.typestr,
                                "' (bfloat16 data: pass a uint16 array with dtype='bfloat16')"));
  return dt;
}

// The device an array object names itself, for arrays without memory:
// tfring's CudaArray, CuPy (device.id), PyTorch (device.index); -1 if none.
int declaredDevice(const py::object& obj) {
  try {
    if (py::isinstance<CudaArray>(obj)) return obj.cast<const CudaArray&>().device();
    if (!py::hasattr(obj, "device")) return -1;
    py::object d = obj.attr("device");
    for (const char* attr : {"id", "index"})
      if (py::hasattr(d, attr)) {
        py::object i = d.attr(attr);
        if (py::isinstance<py::int_>(i)) return i.cast<int>();
      }
  } catch (const py::error_already_set&) {
  }
  return -1;
}

int deviceOfView(const CudaView& v, const py::object& obj, const char* what) {
  // Without CUDA (or a GPU) leave the verdict to the engine, whose error
  // says why GPU tensors cannot be used here.
  if (!gpu::builtWithCuda() || gpu::deviceCount() == 0) return 0;
  // Our own arrays were allocated on the device they name.
  if (py::isinstance<CudaArray>(obj)) return obj.cast<const CudaArray&>().device();
  // Empty arrays may have no memory at all (CuPy, PyTorch: pointer 0): they
  // are on the device the array names, else on the process's GPU if it has
  // one yet, else on the current device.
  if (v.count() == 0) {
    const int declared = declaredDevice(obj);
    if (declared >= 0) return declared;
    const int bound = gpu::boundDevice();
    return bound >= 0 ? bound : gpu::currentDevice();
  }
  try {
    return gpu::pointerDevice(v.ptr, what);
  } catch (const Error& e) {
    throw py::value_error(e.what());
  }
}

// ----------------------------------------------------------- GpuHandle ----

struct GpuState : Completion {
  // Engine-allocated output (allgather, reducescatter): device memory.
  std::vector<int64_t> out_shape;
  void* out_ptr = nullptr;
  int device = 0;
  ~GpuState() { gpu::deviceFree(device, out_ptr); }
};

class GpuHandle {
 public:
  GpuHandle(std::shared_ptr<GpuState> st, py::object input, py::object output, DataType dt)
      : st_(std::move(st)), input_(std::move(input)), output_(std::move(output)), dt_(dt) {}
  ~GpuHandle() { st_->waitQuietly(); }
  bool poll() { return st_->poll(); }
  py::object wait(double timeout) {
    st_->wait(timeout);
    if (st_->out_ptr) {
      auto arr = std::make_shared<CudaArray>(st_->out_shape, dt_, st_->device, st_->out_ptr);
      st_->out_ptr = nullptr;
      output_ = py::cast(arr);
    }
    return output_;
  }

 private:
  std::shared_ptr<GpuState> st_;
  py::object input_, output_;
  DataType dt_;
};

}  // namespace

bool isCudaArray(const py::object& obj) {
  // hasattr evaluates the property (CudaArray builds a dict for it): ask
  // the cheap questions first. numpy arrays never have the attribute.
  if (py::isinstance<CudaArray>(obj)) return true;
  if (py::isinstance<py::array>(obj)) return false;
  return py::hasattr(obj, "__cuda_array_interface__");
}

py::object submitCuda(CollectiveType type, const py::object& input, const std::string& name,
                      ReduceOp op, int root, double prescale, double postscale,
                      const py::object& dtype_override, const py::object& out) {
  CudaView in = viewOf(input, "input");
  DataType dt = resolveCudaDtype(in, dtype_override);
  if (type != CollectiveType::kAllgather && type != CollectiveType::kBroadcast &&
      dt == DataType::kBool)
    throw py::type_error(strCat(collectiveName(type), " does not support bool tensors"));
  // out= is checked before any pointer is looked at, like the input.
  const bool takes_out = type == CollectiveType::kAllreduce || type == CollectiveType::kBroadcast;
  CudaView o;
  if (takes_out && !out.is_none()) {
    if (!isCudaArray(out))
      throw py::value_error("out= must be a CUDA array (it holds the result of a GPU input)");
    o = viewOf(out, "out");
    if (o.readonly || o.count() != in.count() || o.itemsize != in.itemsize ||
        (dtype_override.is_none() && o.typestr.substr(1) != in.typestr.substr(1)))
      throw py::value_error("out= must be a writable C-contiguous CUDA array like the input");
  }
  const int device = deviceOfView(in, input, "input");
  const bool usable = gpu::builtWithCuda() && gpu::deviceCount() > 0;
  auto st = std::make_shared<GpuState>();
  st->device = device;
  runtime::Request req;
  req.name = name;
  req.type = type;
  req.dtype = dt;
  req.shape = in.shape;
  req.op = op;
  req.root = root;
  req.prescale = prescale;
  req.postscale = postscale;
  req.input = in.ptr;
  req.device = device;
  req.stream = in.stream;
  py::object output = py::none();
  if (takes_out) {
    if (!out.is_none()) {
      if (usable && deviceOfView(o, out, "out") != device)
        throw py::value_error("out= must be on the same GPU as the input");
      req.output = o.ptr;
      output = out;
    } else if (usable) {
      auto arr = CudaArray::empty(in.shape, dt, device);
      req.output = arr->ptr();
      output = py::cast(arr);
    }
  } else if (usable) {
    GpuState* raw = st.get();
    req.allocate = [raw, dt, device](const std::vector<int64_t>& shape, void** data) {
      size_t n = 1;
      for (auto d : shape) n *= static_cast<size_t>(d);
      try {
        raw->out_ptr = gpu::deviceAlloc(device, n * dtypeSize(dt));
      } catch (const Error& e) {
        return e.status();
      }
      raw->out_shape = shape;
      *data = raw->out_ptr;
      return Status::OK();
    };
  }
  Status s;
  {
    py::gil_scoped_release nogil;
    s = runtime::enqueue(std::move(req), [st](const Status& status) { st->finish(status); });
  }
  if (!s.ok()) throwStatus(s);
  return py::cast(std::unique_ptr<GpuHandle>(new GpuHandle(st, input, output, dt)));
}

namespace {

// Kernel arguments: a CUDA array's pointer, element count and dtype.
struct KernelArg {
  CudaView v;
  DataType dt;
  int device;
};

KernelArg kernelArg(const py::object& obj, const py::object& dtype, const char* what) {
  if (!isCudaArray(obj)) throw py::type_error(strCat(what, " must be a CUDA array"));
  KernelArg a;
  a.v = viewOf(obj, what);
  a.dt = resolveCudaDtype(a.v, dtype);
  a.device = a.v.count() == 0 ? gpu::currentDevice() : gpu::pointerDevice(a.v.ptr, what);
  return a;
}

void* streamOf(const py::object& s) {
  return s.is_none() ? nullptr : reinterpret_cast<void*>(s.cast<uintptr_t>());
}

ReduceOp opOf(const std::string& s) {
  ReduceOp op;
  if (!parseReduceOp(s, &op))
    throw py::value_error(strCat("unknown reduce op '", s, "' (expected sum, average, min, max or product)"));
  return op;
}

void sameShape(const KernelArg& a, const KernelArg& b) {
  if (a.v.count() != b.v.count() || a.device != b.device)
    throw py::value_error("CUDA arrays must have the same size and device");
}

}  // namespace

void bindGpu(py::module_& m) {
  // NCCL from pip wheels: tell the loader where Python's packages are.
  try {
    std::vector<std::string> dirs;
    for (auto p : py::module_::import("sys").attr("path")) dirs.push_back(py::str(p));
    gpu::nccl::setSearchPaths(dirs);
  } catch (const py::error_already_set&) {
  }

  py::class_<CudaArray, std::shared_ptr<CudaArray>>(m, "CudaArray",
                                                    "Device memory holding a GPU collective's result.")
      .def_property_readonly("__cuda_array_interface__", &CudaArray::interface)
      .def_property_readonly("shape", [](const CudaArray& a) {
        py::tuple t(a.shape().size());
        for (size_t i = 0; i < a.shape().size(); ++i) t[i] = a.shape()[i];
        return t;
      })
      .def_property_readonly("dtype", [](const CudaArray& a) { return dtypeName(a.dtype()); })
      .def_property_readonly("nbytes", &CudaArray::nbytes)
      .def_property_readonly("size", &CudaArray::size)
      .def_property_readonly("device", &CudaArray::device)
      .def_property_readonly("ptr", [](const CudaArray& a) { return reinterpret_cast<uintptr_t>(a.ptr()); })
      .def("to_numpy", &CudaArray::toNumpy, "Copies the data to a new numpy array.")
      .def_static(
          "from_numpy",
          [](py::array a, int device, py::object dtype) {
            py::array c = py::array::ensure(a, py::array::c_style);
            std::string name = dtype.is_none() ? std::string(py::str(c.dtype().attr("name")))
                                               : std::string(py::str(dtype));
            DataType dt;
            if (!parseDataType(name, &dt) || dtypeSize(dt) != static_cast<size_t>(c.itemsize()))
              throw py::type_error(strCat("unsupported dtype ", name));
            std::vector<int64_t> shape(c.shape(), c.shape() + c.ndim());
            auto arr = CudaArray::empty(shape, dt, device);
            gpu::copyToDevice(arr->ptr(), c.data(), arr->nbytes(), device);
            return arr;
          },
          py::arg("array"), py::arg("device") = 0, py::arg("dtype") = py::none(),
          "Copies a numpy array to a new CudaArray on `device`.")
      .def("__len__", [](const CudaArray& a) { return a.shape().empty() ? 0 : a.shape()[0]; })
      .def("__repr__", [](const CudaArray& a) {
        std::string s = "CudaArray(shape=(";
        for (size_t i = 0; i < a.shape().size(); ++i) s += strCat(i ? ", " : "", a.shape()[i]);
        if (a.shape().size() == 1) s += ",";
        return strCat(s, "), dtype=", dtypeName(a.dtype()), ", device=", a.device(), ")");
      });

  py::class_<GpuHandle>(m, "GpuHandle")
      .def("wait", &GpuHandle::wait, py::arg("timeout") = -1.0,
           "Blocks until the collective finishes; returns its output or raises.")
      .def("poll", &GpuHandle::poll, "True once the collective has finished.");

  m.def("cuda_built", &gpu::builtWithCuda, "Whether this build has CUDA support.");
  m.def("cuda_emulated", &gpu::cudaEmulated,
        "True in the CUDA emulation build (tests only: GPU work runs on host threads).");
  m.def("cuda_available", [] { return gpu::builtWithCuda() && gpu::deviceCount() > 0; },
        "Whether GPU tensors can be used: built with CUDA and a GPU is usable.");
  m.def("cuda_device_count", &gpu::deviceCount);
  m.def("cuda_unavailable_reason", &gpu::unavailableReason);
  m.def("cuda_describe", [](int device) {
    try {
      return gpu::describeDevice(device);
    } catch (const Error& e) {
      throwStatus(e.status());
    }
  });
  m.def("gpu_backend", []() -> py::object {
    std::string b = gpu::activeBackend();
    if (b.empty()) return py::none();
    return py::str(b);
  }, "The GPU backend of this process ('nccl', 'ring-ipc', 'ring-host', 'local'), "
     "or None before the first GPU collective.");
  m.def("gpu_allreduce_algorithms", [](int process_set) {
    auto s = commStats(process_set);
    py::dict d;
    for (const char* a : {"ring", "oneshot", "twoshot", "staged"})
      d[a] = gpu::allreduceAlgorithmCount(*s, a);
    return d;
  }, py::arg("process_set") = 0,
     "How many GPU allreduces communicator `process_set` (0: the world) ran with each "
     "CUDA-IPC algorithm; raises if this rank is not in the set.");
  m.def("nccl_info", [] {
    const gpu::nccl::Library& lib = gpu::nccl::load();
    py::dict d;
    d["loaded"] = lib.api != nullptr;
    d["path"] = lib.path;
    d["version"] = lib.version;
    d["error"] = lib.error;
    d["searched"] = lib.searched;
    return d;
  }, "Loads NCCL if needed; says from where, or why it could not.");
  m.def("nccl_candidates", &gpu::nccl::candidates);
  m.def(
      "choose_gpu_backend",
      [](const std::string& requested, const std::vector<py::dict>& ranks, bool autotune) {
        std::vector<gpu::RankGpu> facts;
        for (auto& d : ranks) {
          gpu::RankGpu f;
          f.host = d["host"].cast<std::string>();
          f.gpu = d["gpu"].cast<std::string>();
          f.nccl_ok = d.contains("nccl_ok") ? d["nccl_ok"].cast<bool>() : false;
          f.nccl_error = d.contains("nccl_error") ? d["nccl_error"].cast<std::string>()
                                                  : std::string("not found");
          f.ipc_ok = d.contains("ipc_ok") ? d["ipc_ok"].cast<bool>() : true;
          facts.push_back(f);
        }
        gpu::Choice c;
        try {
          c = gpu::chooseBackend(requested, facts, autotune);
        } catch (const Error& e) {
          throwStatus(e.status());
        }
        return py::make_tuple(gpu::backendName(c.backend), c.calibrate,
                              c.calibrate ? gpu::backendName(c.alternative) : "", c.reason);
      },
      py::arg("requested"), py::arg("ranks"), py::arg("autotune") = true,
      "The GPU backend decision for ranks described as dicts (host, gpu, nccl_ok, ipc_ok): "
      "(backend, calibrate, alternative, reason). Raises like the runtime would.");

  m.def(
      "cuda_reduce",
      [](py::object dst, py::object a, py::object b, const std::string& op, double factor,
         py::object dtype, py::object stream) {
        auto d = kernelArg(dst, dtype, "dst"), x = kernelArg(a, dtype, "a"),
             y = kernelArg(b, dtype, "b");
        sameShape(d, x);
        sameShape(d, y);
        gpu::launchReduce(d.device, d.v.ptr, x.v.ptr, y.v.ptr, d.v.count(), d.dt, opOf(op), factor,
                          streamOf(stream));
      },
      py::arg("dst"), py::arg("a"), py::arg("b"), py::arg("op") = "sum", py::arg("factor") = 1.0,
      py::arg("dtype") = py::none(), py::arg("stream") = py::none(),
      "dst = op(a, b) * factor on the GPU (queued on `stream`, a cudaStream_t as int; "
      "None: the legacy default stream).");
  m.def(
      "cuda_scale",
      [](py::object dst, py::object src, double factor, py::object dtype, py::object stream) {
        auto d = kernelArg(dst, dtype, "dst"), s = kernelArg(src, dtype, "src");
        sameShape(d, s);
        gpu::launchScale(d.device, d.v.ptr, s.v.ptr, d.v.count(), d.dt, factor, streamOf(stream));
      },
      py::arg("dst"), py::arg("src"), py::arg("factor"), py::arg("dtype") = py::none(),
      py::arg("stream") = py::none(), "dst = src * factor on the GPU.");
  m.def(
      "cuda_cast",
      [](py::object dst, py::object src, py::object dst_dtype, py::object src_dtype,
         py::object stream) {
        auto d = kernelArg(dst, dst_dtype, "dst"), s = kernelArg(src, src_dtype, "src");
        sameShape(d, s);
        gpu::launchCast(d.device, d.v.ptr, d.dt, s.v.ptr, s.dt, d.v.count(), streamOf(stream));
      },
      py::arg("dst"), py::arg("src"), py::arg("dst_dtype") = py::none(),
      py::arg("src_dtype") = py::none(), py::arg("stream") = py::none(),
      "Float conversion on the GPU (fp16 compression: float32 -> float16 and back).");
  m.def(
      "cuda_batched_copy",
      [](const std::vector<std::pair<py::object, py::object>>& pairs, py::object stream) {
        std::vector<gpu::Copy> copies;
        int device = -1;
        for (auto& p : pairs) {
          auto d = kernelArg(p.first, py::none(), "dst");
          auto s = kernelArg(p.second, py::none(), "src");
          size_t bytes = s.v.count() * s.v.itemsize;
          if (d.v.count() * d.v.itemsize < bytes)
            throw py::value_error("cuda_batched_copy: a destination is smaller than its source");
          if (device >= 0 && d.device != device)
            throw py::value_error("cuda_batched_copy: all arrays must be on one GPU");
          device = d.device;
          copies.push_back({d.v.ptr, s.v.ptr, bytes});
        }
        if (!copies.empty()) gpu::launchBatchedCopy(device, copies, streamOf(stream));
      },
      py::arg("pairs"), py::arg("stream") = py::none(),
      "Copies each (dst, src) pair's bytes in as few launches as possible (fusion pack/unpack).");
  m.def(
      "cuda_stream_create",
      [](int device) { return reinterpret_cast<uintptr_t>(gpu::streamCreate(device)); },
      py::arg("device") = 0,
      "A new non-blocking CUDA stream on `device`, as an int (for stream= arguments and the "
      "array interface's 'stream'); free it with cuda_stream_destroy.");
  m.def(
      "cuda_stream_destroy",
      [](uintptr_t stream, int device) {
        gpu::streamDestroy(device, reinterpret_cast<void*>(stream));
      },
      py::arg("stream"), py::arg("device") = 0);
  m.def(
      "cuda_synchronize", [](int device, py::object stream) { gpu::synchronize(device, streamOf(stream)); },
      py::arg("device") = 0, py::arg("stream") = py::none());
  py::class_<gpu::StreamGate, std::shared_ptr<gpu::StreamGate>>(
      m, "CudaStreamGate",
      "A stream gate (TFRING_GPU_COMPLETION=stream): the stream's later work waits on the "
      "device until open().")
      .def("open", &gpu::StreamGate::open, py::call_guard<py::gil_scoped_release>());
  m.def(
      "cuda_stream_gate",
      [](py::object stream, int device) { return gpu::closeStream(device, streamOf(stream)); },
      py::arg("stream"), py::arg("device") = 0,
      "Queues a gate's wait on `stream` and returns the gate: work queued on the stream after "
      "this call runs once the gate is opened.");
  m.def(
      "cuda_allreduce_gated",
      [](const std::vector<py::object>& inputs, const std::vector<py::object>& outputs,
         const std::vector<std::string>& names, py::object stream, const std::string& op,
         int root, int process_set) {
        // What an XLA GPU call does with TFRING_GPU_COMPLETION=stream: one
        // batch of allreduces (or, with root >= 0, one broadcast) submitted
        // on `stream`, returning at once with a gate on the stream that the
        // engine opens when they are done.
        if (inputs.size() != outputs.size() || inputs.size() != names.size())
          throw py::value_error("inputs, outputs and names must have the same length");
        if (root >= 0 && inputs.size() != 1)
          throw py::value_error("a gated broadcast takes one tensor");
        void* st = streamOf(stream);
        std::vector<runtime::Request> reqs(inputs.size());
        int device = 0;
        for (size_t i = 0; i < inputs.size(); ++i) {
          CudaView in = viewOf(inputs[i], "input"), o = viewOf(outputs[i], "out");
          if (o.count() != in.count() || o.itemsize != in.itemsize)
            throw py::value_error("each output must have its input's size");
          device = deviceOfView(in, inputs[i], "input");
          runtime::Request& r = reqs[i];
          r.name = names[i];
          r.type = root >= 0 ? CollectiveType::kBroadcast : CollectiveType::kAllreduce;
          r.root = root >= 0 ? root : 0;
          r.dtype = resolveCudaDtype(in, py::none());
          r.shape = in.shape;
          r.op = opOf(op);
          r.input = in.ptr;
          r.output = o.ptr;
          r.device = device;
          r.stream = st;
          r.process_set = process_set;
        }
        Status s;
        {
          py::gil_scoped_release nogil;
          s = runtime::submitGated(std::move(reqs), device, st);
        }
        if (!s.ok()) throwStatus(s);
      },
      py::arg("inputs"), py::arg("outputs"), py::arg("names"), py::arg("stream"),
      py::arg("op") = "sum", py::arg("root") = -1, py::arg("process_set") = 0,
      "Allreduces inputs into outputs as one batch completed on `stream` (stream gate), or "
      "with root >= 0 broadcasts the one input from `root` (a global rank), on "
      "`process_set` as XLA's calls do: returns once submitted; work queued on `stream` "
      "afterwards sees the results.");
  m.def(
      "cuda_grouped_allreduce",
      [](const std::vector<py::object>& inputs, const std::vector<py::object>& outputs,
         const std::string& name, const std::string& op, double prescale, double postscale) {
        // What TF's GPU kernel and XLA's CUDA target do with a grouped
        // allreduce of one dtype: one request, a part per tensor
        // (runtime::setParts), negotiated and fused as one tensor.
        if (inputs.empty() || inputs.size() != outputs.size())
          throw py::value_error("inputs and outputs must have the same, nonzero length");
        runtime::Request req;
        std::vector<runtime::Request::Part> parts;
        std::vector<std::vector<int64_t>> shapes;
        for (size_t i = 0; i < inputs.size(); ++i) {
          CudaView in = viewOf(inputs[i], "input"), o = viewOf(outputs[i], "out");
          if (o.count() != in.count() || o.itemsize != in.itemsize || o.readonly)
            throw py::value_error("each output must be writable and have its input's size");
          const DataType dt = resolveCudaDtype(in, py::none());
          const int device = deviceOfView(in, inputs[i], "input");
          if (i == 0) {
            req.dtype = dt;
            req.device = device;
            req.stream = in.stream;
          } else if (dt != req.dtype || device != req.device) {
            throw py::value_error("a group's tensors must share one dtype and one GPU");
          }
          parts.push_back({in.ptr, o.ptr, static_cast<int64_t>(in.count())});
          shapes.push_back(in.shape);
        }
        req.name = name;
        req.type = CollectiveType::kAllreduce;
        req.op = opOf(op);
        req.prescale = prescale;
        req.postscale = postscale;
        runtime::setParts(&req, std::move(parts), shapes);
        auto st = std::make_shared<GpuState>();
        st->device = req.device;
        Status s;
        {
          py::gil_scoped_release nogil;
          s = runtime::enqueue(std::move(req), [st](const Status& status) { st->finish(status); });
        }
        if (!s.ok()) throwStatus(s);
        st->wait(-1.0);
      },
      py::arg("inputs"), py::arg("outputs"), py::arg("name"), py::arg("op") = "sum",
      py::arg("prescale") = 1.0, py::arg("postscale") = 1.0,
      "Allreduces CUDA arrays into outputs as one grouped request (a part per tensor), as "
      "TensorFlow's grouped GPU op does; returns when the outputs are complete.");
  m.def(
      "cuda_gated_error",
      [](int process_set) -> py::object {
        Status s = runtime::streamCompletionError(process_set);
        if (s.ok()) return py::none();
        return py::str(s.message());
      },
      py::arg("process_set") = 0,
      "The error of a gated collective on `process_set` that failed after its submission "
      "returned (None if none).");
  m.def(
      "cuda_stream_gates_supported",
      [](int device) {
        std::string why;
        bool ok = gpu::streamGatesSupported(device, &why);
        return py::make_tuple(ok, why);
      },
      py::arg("device") = 0, "(True, '') when stream gates work on `device`, else (False, why).");
}

}  // namespace python
}  // namespace tfring
