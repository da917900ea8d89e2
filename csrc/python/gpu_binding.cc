// tfring._core GPU support: CUDA/NCCL/backend queries, the GPU backend
// choice on described ranks, the CUDA kernels and streams (tests and
// benchmarks). The CUDA arrays and the collectives on them are in
// gpu_arrays.cc, stream-ordered completion in gpu_stream_binding.cc.
//
//   cuda_available() -> bool          built with CUDA and a GPU is usable
//   cuda_built() -> bool
//   cuda_emulated() -> bool           the test-only CUDA emulation build
//   cuda_device_count() -> int
//   cuda_unavailable_reason() -> str
//   cuda_describe(device) -> str
//   gpu_backend(process_set=0) -> str | None  a communicator's GPU backend:
//                                     "nccl", "ring-ipc", "ring-host" or
//                                     "local", once a GPU collective ran
//   gpu_allreduce_algorithms(process_set=0) -> dict  a communicator's GPU
//                                     allreduces per CUDA-IPC algorithm
//   nccl_info() -> dict               where NCCL was found, or why not
//   choose_gpu_backend(requested, ranks, autotune=True) -> (name, calibrate, reason)
//   cuda_reduce / cuda_scale / cuda_cast / cuda_batched_copy (kernels)
//   cuda_stream_create / cuda_stream_destroy / cuda_synchronize
#include <pybind11/stl.h>

#include <string>
#include <vector>

#include "gpu/backend_select.h"
#include "gpu/device.h"
#include "gpu/executor.h"
#include "gpu/nccl_loader.h"
#include "python/bindings.h"
#include "python/errors.h"
#include "python/gpu_arrays.h"
#include "python/gpu_binding.h"

namespace py = pybind11;

namespace tfring {
namespace python {

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
  m.def("gpu_backend", [](int process_set) -> py::object {
    std::string b = commStats(process_set)->gpuBackend();
    if (b.empty()) return py::none();
    return py::str(b);
  }, py::arg("process_set") = 0,
     "The GPU backend of communicator `process_set` (0: the world): 'nccl', 'ring-ipc', "
     "'ring-host' or 'local', or None before its first GPU collective.");
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
}

}  // namespace python
}  // namespace tfring
