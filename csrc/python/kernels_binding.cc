// tfring._core.kernels: the CPU reduce kernels on numpy arrays, for tests
// and benchmarks.
//
//   reduce(dst, src, op, dtype=None)      dst = op(dst, src), in place
//   reduce3(dst, a, b, op, dtype=None)    dst = op(a, b); dst may be a or b
//   scale(arr, factor, dtype=None)        arr *= factor, in place
//   copy_streaming(dst, src, dst_offset=0, src_offset=0, nbytes=None)
//                                         bytes copied with streaming stores
//   isa() -> str                          kernel set in use
//   set_isa(name)                         force "scalar" | "avx2" | "avx512"
//                                         ("" = back to the startup choice)
//   isa_supported(name) -> bool
//
// op: "sum", "average" (= sum), "min", "max", "product". dtype: a tfring
// dtype name; None derives it from the array. bfloat16 data may come as a
// uint16 array with dtype="bfloat16" (or as an ml_dtypes bfloat16 array).
// Arrays must be C-contiguous numpy arrays of equal size and dtype.
//
// And, at the top level of tfring._core, for the GPU benchmark:
//   cuda_bench_pack(fused, parts, iters=100, unpack=False, stream=None) -> float
//     seconds per launch of the fusion pack (parts -> fused, back to back)
//     or unpack (fused -> parts) batched copy, the copy descriptors built
//     once and CUDA events around the launches alone (gpu::timeLaunches).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "common/types.h"
#include "gpu/device.h"
#include "kernels/cpu/copy.h"
#include "kernels/cpu/reduce.h"
#include "python/bindings.h"

namespace tfring {
namespace python {
namespace {

namespace py = pybind11;

std::string numpyName(const py::array& a) { return py::str(a.dtype()).cast<std::string>(); }

// The tfring dtype of a numpy array, if it has one.
bool dtypeOfArray(const py::array& a, DataType* out) {
  const py::dtype dt = a.dtype();
  const char kind = dt.kind();
  const auto size = dt.itemsize();
  if (numpyName(a) == "bfloat16" && size == 2) *out = DataType::kBFloat16;
  else if (kind == 'f' && size == 2) *out = DataType::kFloat16;
  else if (kind == 'f' && size == 4) *out = DataType::kFloat32;
  else if (kind == 'f' && size == 8) *out = DataType::kFloat64;
  else if (kind == 'i' && size == 4) *out = DataType::kInt32;
  else if (kind == 'i' && size == 8) *out = DataType::kInt64;
  else if (kind == 'i' && size == 1) *out = DataType::kInt8;
  else if (kind == 'u' && size == 1) *out = DataType::kUInt8;
  else if (kind == 'i' && size == 2) *out = DataType::kInt16;
  else if (kind == 'u' && size == 2) *out = DataType::kUInt16;
  else if (kind == 'b' && size == 1) *out = DataType::kBool;
  else return false;
  return true;
}

py::array asArray(const py::object& obj, const char* what) {
  if (!py::isinstance<py::array>(obj))
    throw py::value_error(std::string(what) + " must be a numpy array, got " +
                          py::str(py::type::of(obj)).cast<std::string>());
  auto a = py::reinterpret_borrow<py::array>(obj);
  if (!(a.flags() & py::array::c_style))
    throw py::value_error(std::string(what) + " must be C-contiguous");
  return a;
}

// The dtype the kernel runs with: the one named, which must fit the array
// (bfloat16 also fits uint16), or the array's own.
DataType resolveDtype(const py::array& a, const py::object& dtype, const char* what) {
  DataType own;
  const bool has_own = dtypeOfArray(a, &own);
  if (dtype.is_none()) {
    if (!has_own)
      throw py::value_error(std::string(what) + " has numpy dtype " + numpyName(a) +
                            ", which has no tfring dtype; pass dtype=");
    return own;
  }
  // A name, or anything numpy takes as a dtype (np.float32, "f4", ...).
  const std::string name = py::isinstance<py::str>(dtype)
                               ? dtype.cast<std::string>()
                               : py::str(py::dtype::from_args(dtype).attr("name"))
                                     .cast<std::string>();
  DataType want;
  if (!parseDataType(name, &want))
    throw py::value_error("unknown dtype '" + name +
                          "'; expected one of float16, bfloat16, float32, float64, "
                          "int32, int64, uint8, int8, int16, uint16, bool");
  const bool bf16_as_uint16 = want == DataType::kBFloat16 && a.dtype().kind() == 'u' &&
                              a.dtype().itemsize() == 2;
  if (!bf16_as_uint16 && !(has_own && own == want))
    throw py::value_error("dtype '" + name + "' does not match " + what +
                          " with numpy dtype " + numpyName(a));
  return want;
}

ReduceOp resolveOp(const std::string& name) {
  ReduceOp op;
  if (!parseReduceOp(name, &op))
    throw py::value_error("unknown op '" + name +
                          "'; expected one of sum, average, min, max, product");
  return op;
}

void checkWritable(const py::array& a, const char* what) {
  if (!a.writeable()) throw py::value_error(std::string(what) + " is read-only");
}

void checkSameShape(const py::array& a, const char* a_name, const py::array& b,
                    const char* b_name) {
  if (!a.dtype().is(b.dtype()) && !a.dtype().equal(b.dtype()))
    throw py::value_error(std::string(a_name) + " has dtype " + numpyName(a) + " but " +
                          b_name + " has dtype " + numpyName(b));
  if (a.size() != b.size())
    throw py::value_error(std::string(a_name) + " has " + std::to_string(a.size()) +
                          " elements but " + b_name + " has " + std::to_string(b.size()));
}

// The kernels allow an output that is exactly an input, not a partial overlap.
void checkNoPartialOverlap(const py::array& dst, const py::array& src, const char* src_name) {
  auto d = reinterpret_cast<uintptr_t>(dst.data());
  auto s = reinterpret_cast<uintptr_t>(src.data());
  auto n = static_cast<uintptr_t>(dst.nbytes());
  if (d != s && n > 0 && d < s + n && s < d + n)
    throw py::value_error(std::string("dst partially overlaps ") + src_name +
                          "; it must be the same buffer or a disjoint one");
}

void pyReduce(const py::object& dst_obj, const py::object& src_obj, const std::string& op_name,
              const py::object& dtype) {
  py::array dst = asArray(dst_obj, "dst"), src = asArray(src_obj, "src");
  checkWritable(dst, "dst");
  checkSameShape(dst, "dst", src, "src");
  checkNoPartialOverlap(dst, src, "src");
  const ReduceOp op = resolveOp(op_name);
  const DataType dt = resolveDtype(dst, dtype, "dst");
  void* d = dst.mutable_data();
  const void* s = src.data();
  const size_t n = static_cast<size_t>(dst.size());
  py::gil_scoped_release nogil;
  kernels::reduce(d, s, n, dt, op);
}

void pyReduce3(const py::object& dst_obj, const py::object& a_obj, const py::object& b_obj,
               const std::string& op_name, const py::object& dtype) {
  py::array dst = asArray(dst_obj, "dst"), a = asArray(a_obj, "a"), b = asArray(b_obj, "b");
  checkWritable(dst, "dst");
  checkSameShape(dst, "dst", a, "a");
  checkSameShape(dst, "dst", b, "b");
  checkNoPartialOverlap(dst, a, "a");
  checkNoPartialOverlap(dst, b, "b");
  const ReduceOp op = resolveOp(op_name);
  const DataType dt = resolveDtype(dst, dtype, "dst");
  void* d = dst.mutable_data();
  const void* pa = a.data();
  const void* pb = b.data();
  const size_t n = static_cast<size_t>(dst.size());
  py::gil_scoped_release nogil;
  kernels::reduce3(d, pa, pb, n, dt, op);
}

void pyScale(const py::object& arr_obj, double factor, const py::object& dtype) {
  py::array arr = asArray(arr_obj, "arr");
  checkWritable(arr, "arr");
  const DataType dt = resolveDtype(arr, dtype, "arr");
  void* p = arr.mutable_data();
  const size_t n = static_cast<size_t>(arr.size());
  py::gil_scoped_release nogil;
  kernels::scale(p, n, dt, factor);
}

void pySetIsa(const std::string& name) {
  if (!kernels::setIsa(name.c_str()))
    throw py::value_error("ISA '" + name +
                          "' is unknown or not supported by this CPU/build "
                          "(known: scalar, avx2, avx512)");
}

// (device pointer, bytes) of a C-contiguous object exposing
// __cuda_array_interface__.
std::pair<void*, size_t> cudaBuffer(const py::object& obj, const std::string& what) {
  if (!py::hasattr(obj, "__cuda_array_interface__"))
    throw py::value_error(what + " must expose __cuda_array_interface__ (a GPU array)");
  py::dict cai = obj.attr("__cuda_array_interface__");
  if (cai.contains("strides") && !cai["strides"].is_none())
    throw py::value_error(what + " must be C-contiguous");
  const std::string ts = cai["typestr"].cast<std::string>();
  size_t bytes = std::stoul(ts.substr(2));
  for (auto d : cai["shape"].cast<py::tuple>()) bytes *= d.cast<size_t>();
  auto* p = reinterpret_cast<void*>(cai["data"].cast<py::tuple>()[0].cast<uintptr_t>());
  return {p, bytes};
}

double pyCudaBenchPack(const py::object& fused, const py::list& parts, int iters, bool unpack,
                       const py::object& stream) {
  if (iters < 1) throw py::value_error("cuda_bench_pack: iters must be >= 1");
  auto [base, capacity] = cudaBuffer(fused, "fused");
  const int device = gpu::pointerDevice(base, "cuda_bench_pack: fused");
  std::vector<gpu::Copy> copies;
  size_t offset = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    const std::string what = "parts[" + std::to_string(i) + "]";
    auto [p, bytes] = cudaBuffer(parts[i], what);
    if (gpu::pointerDevice(p, "cuda_bench_pack: " + what) != device)
      throw py::value_error("cuda_bench_pack: " + what + " is not on fused's GPU " +
                            std::to_string(device));
    if (offset + bytes > capacity)
      throw py::value_error("cuda_bench_pack: fused holds " + std::to_string(capacity) +
                            " bytes, fewer than the parts up to " + what);
    char* slot = static_cast<char*>(base) + offset;
    copies.push_back(unpack ? gpu::Copy{p, slot, bytes} : gpu::Copy{slot, p, bytes});
    offset += bytes;
  }
  void* st = stream.is_none() ? nullptr : reinterpret_cast<void*>(stream.cast<uintptr_t>());
  py::gil_scoped_release nogil;
  return gpu::timeLaunches(device, st, iters,
                           [&] { gpu::launchBatchedCopy(device, copies, st); });
}

// Byte offsets let tests reach every alignment of either side.
void pyCopyStreaming(py::array dst, const py::array& src, size_t dst_offset, size_t src_offset,
                     const py::object& nbytes) {
  if (!(dst.flags() & py::array::c_style) || !(src.flags() & py::array::c_style))
    throw py::value_error("copy_streaming: arrays must be C-contiguous");
  if (!dst.writeable()) throw py::value_error("copy_streaming: dst is read-only");
  const size_t dn = static_cast<size_t>(dst.nbytes()), sn = static_cast<size_t>(src.nbytes());
  if (dst_offset > dn || src_offset > sn)
    throw py::value_error("copy_streaming: offset past the end of an array");
  const size_t n = nbytes.is_none() ? std::min(dn - dst_offset, sn - src_offset)
                                    : nbytes.cast<size_t>();
  if (dst_offset + n > dn || src_offset + n > sn)
    throw py::value_error("copy_streaming: nbytes past the end of an array");
  char* d = static_cast<char*>(dst.mutable_data()) + dst_offset;
  const char* s = static_cast<const char*>(src.data()) + src_offset;
  py::gil_scoped_release nogil;
  kernels::copyStreaming(d, s, n);
}

}  // namespace

void bindKernels(pybind11::module_& m) {
  namespace py = pybind11;
  using py::arg;
  auto k = m.def_submodule("kernels", "CPU reduce kernels on numpy arrays");
  k.def("reduce", &pyReduce, arg("dst"), arg("src"), arg("op"), arg("dtype") = py::none(),
        "dst = op(dst, src) elementwise, in place.");
  k.def("reduce3", &pyReduce3, arg("dst"), arg("a"), arg("b"), arg("op"),
        arg("dtype") = py::none(), "dst = op(a, b) elementwise; dst may be a or b.");
  k.def("scale", &pyScale, arg("arr"), arg("factor"), arg("dtype") = py::none(),
        "arr *= factor in place (integers: in double, truncated toward zero).");
  k.def("copy_streaming", &pyCopyStreaming, arg("dst"), arg("src"), arg("dst_offset") = 0,
        arg("src_offset") = 0, arg("nbytes") = py::none(),
        "Copies nbytes (default: all that fits) from src+src_offset to dst+dst_offset "
        "with streaming stores.");
  k.def("isa", &kernels::isaName, "The kernel set in use: avx512, avx2 or scalar.");
  k.def("set_isa", &pySetIsa, arg("name"),
        "Force a kernel set (scalar, avx2, avx512); '' restores the startup choice.");
  k.def(
      "isa_supported",
      [](const std::string& name) { return kernels::isaSupported(name.c_str()); },
      arg("name"), "Whether this CPU and build can run the named kernel set.");
  m.def("cuda_bench_pack", &pyCudaBenchPack, arg("fused"), arg("parts"), arg("iters") = 100,
        arg("unpack") = false, arg("stream") = py::none(),
        "Seconds per launch of the fusion pack (parts -> fused) or unpack batched copy, "
        "descriptors built once, timed with CUDA events around the launches alone.");
}

}  // namespace python
}  // namespace tfring
