// tfring._core's CUDA arrays (gpu_arrays.h) and the collectives on objects
// exposing __cuda_array_interface__ (CuPy, PyTorch, Numba, CudaArray; see
// submitCuda):
//   allreduce(x) / broadcast(x)      -> out= (any CUDA array of x's size and
//                                       dtype, may be x) or a new CudaArray
//   allgather(x) / reducescatter(x)  -> a new CudaArray
// CudaArray exposes __cuda_array_interface__ (v3), so cupy.asarray(y) or
// torch.as_tensor(y, device="cuda") wrap it without a copy; y.to_numpy()
// copies it to the host. The input's producer stream (the interface's
// "stream" entry) is honoured: tfring reads the input only after the work
// queued on it before the call; results are complete on the device when
// wait() returns, so they may be used on any stream.
#include "python/gpu_arrays.h"

#include <pybind11/stl.h>

#include <cstring>
#include <utility>

#include "gpu/executor.h"
#include "python/bindings.h"
#include "python/errors.h"
#include "python/gpu_binding.h"
#include "runtime/runtime.h"

namespace py = pybind11;

namespace tfring {
namespace python {

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

namespace {

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

}  // namespace

py::dict CudaArray::interface() const {
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

py::array CudaArray::toNumpy() const {
  std::vector<py::ssize_t> shape(shape_.begin(), shape_.end());
  py::array out(numpyDtypeOf(dtype_), shape);
  gpu::copyToHost(out.mutable_data(), ptr_, nbytes(), device_);
  return out;
}

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

namespace {

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

}  // namespace

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

void* streamOf(const py::object& s) {
  return s.is_none() ? nullptr : reinterpret_cast<void*>(s.cast<uintptr_t>());
}

ReduceOp opOf(const std::string& s) {
  ReduceOp op;
  if (!parseReduceOp(s, &op))
    throw py::value_error(strCat("unknown reduce op '", s, "' (expected sum, average, min, max or product)"));
  return op;
}

namespace {

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

void bindGpuArrays(py::module_& m) {
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
}

}  // namespace python
}  // namespace tfring
