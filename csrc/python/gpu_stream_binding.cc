// tfring._core: stream-ordered completion (TFRING_GPU_COMPLETION=stream,
// runtime/stream_completion.h) as XLA's GPU calls use it, and the grouped
// GPU allreduce TensorFlow's kernels submit; for tests and benchmarks:
//   CudaStreamGate, cuda_stream_gate(stream)   a gate held on a stream
//   cuda_allreduce_gated(...)                  a gated batch, as an XLA call
//   cuda_grouped_allreduce(...)                one request, a part per tensor
//   cuda_gated_error(process_set=0)            a set's kept gated failure
//   cuda_stream_gates_supported(device)
#include <pybind11/stl.h>

#include <memory>
#include <string>
#include <vector>

#include "gpu/device.h"
#include "python/bindings.h"
#include "python/errors.h"
#include "python/gpu_arrays.h"
#include "runtime/runtime.h"
#include "runtime/stream_completion.h"

namespace py = pybind11;

namespace tfring {
namespace python {

void bindGpuStreams(py::module_& m) {
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
      "communicator `process_set` (0: the world): returns once submitted; work queued on "
      "`stream` afterwards sees the results.");
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
