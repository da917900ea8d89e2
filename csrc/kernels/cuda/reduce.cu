// Reduce and scale kernels: dst = op(a, b) [* factor] and dst = src * factor
// for every dtype, generated from one template per shape (see elements.cuh
// for the arithmetic). Each thread moves 16 bytes per operand per iteration
// when the pointers can be aligned together; the unaligned head and the
// tail run element by element in the same launch.
#include <cstring>

#include "kernels/cuda/elements.cuh"
#include "kernels/cuda/kernels.h"

namespace tfring {
namespace kernels {
namespace cuda {
namespace detail {

int maxBlocks() {
  constexpr int kMaxDevices = 64;
  static int cache[kMaxDevices] = {0};
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= kMaxDevices) return 1024;
  int v = __atomic_load_n(&cache[dev], __ATOMIC_RELAXED);
  if (v) return v;
  int sms = 0, threads = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  cudaDeviceGetAttribute(&threads, cudaDevAttrMaxThreadsPerMultiProcessor, dev);
  v = (sms > 0 ? sms : 80) * ((threads > 0 ? threads : 2048) / kThreads);
  __atomic_store_n(&cache[dev], v, __ATOMIC_RELAXED);
  return v;
}

namespace {

template <class S, class Op>
__device__ __forceinline__ S binaryOne(S x, S y, bool do_scale, typename Factor<S>::type f) {
  using E = Elem<S>;
  S r = E::store(Op::template apply<S>(E::load(x), E::load(y)));
  return do_scale ? scaleOne<S>(r, f) : r;
}

// Elements [0, head) and [head + nvec*V, n) element-wise, the rest as nvec
// 16-byte packs starting at element `head`.
template <class S, class Op>
__global__ void __launch_bounds__(kThreads)
    binaryKernel(S* dst, const S* a, const S* b, size_t n, size_t head, size_t nvec,
                 bool do_scale, typename Factor<S>::type f) {
  constexpr int V = Pack16<S>::kN;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  const size_t tid = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const uint4* av = reinterpret_cast<const uint4*>(a + head);
  const uint4* bv = reinterpret_cast<const uint4*>(b + head);
  uint4* dv = reinterpret_cast<uint4*>(dst + head);
  for (size_t i = tid; i < nvec; i += stride) {
    Pack16<S> x, y, r;
    x.raw = av[i];
    y.raw = bv[i];
#pragma unroll
    for (int k = 0; k < V; ++k) r.e[k] = binaryOne<S, Op>(x.e[k], y.e[k], do_scale, f);
    dv[i] = r.raw;
  }
  const size_t tail = head + nvec * V;
  const size_t nscalar = head + (n - tail);
  for (size_t i = tid; i < nscalar; i += stride) {
    size_t j = i < head ? i : tail + (i - head);
    dst[j] = binaryOne<S, Op>(a[j], b[j], do_scale, f);
  }
}

template <class S>
__global__ void __launch_bounds__(kThreads)
    scaleKernel(S* dst, const S* src, size_t n, size_t head, size_t nvec,
                typename Factor<S>::type f) {
  constexpr int V = Pack16<S>::kN;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  const size_t tid = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const uint4* sv = reinterpret_cast<const uint4*>(src + head);
  uint4* dv = reinterpret_cast<uint4*>(dst + head);
  for (size_t i = tid; i < nvec; i += stride) {
    Pack16<S> x, r;
    x.raw = sv[i];
#pragma unroll
    for (int k = 0; k < V; ++k) r.e[k] = scaleOne<S>(x.e[k], f);
    dv[i] = r.raw;
  }
  const size_t tail = head + nvec * V;
  const size_t nscalar = head + (n - tail);
  for (size_t i = tid; i < nscalar; i += stride) {
    size_t j = i < head ? i : tail + (i - head);
    dst[j] = scaleOne<S>(src[j], f);
  }
}

// Splits n elements into an element-wise head, 16-byte packs and a tail;
// all packs only if every pointer reaches 16-byte alignment at the same
// element.
template <class S>
void splitAligned(size_t n, const void* const* ptrs, int nptrs, size_t* head, size_t* nvec) {
  constexpr size_t V = Pack16<S>::kN;
  size_t h = headToAlign<S>(ptrs[0]);
  bool ok = h != SIZE_MAX && h <= n;
  for (int i = 1; ok && i < nptrs; ++i)
    ok = aligned16(static_cast<const S*>(ptrs[i]) + h);
  if (!ok) {
    *head = n;
    *nvec = 0;
    return;
  }
  *head = h;
  *nvec = (n - h) / V;
}

template <class S, class Op>
void launchBinary(void* dst, const void* a, const void* b, size_t n, double factor, Stream st) {
  const void* ptrs[3] = {dst, a, b};
  size_t head, nvec;
  splitAligned<S>(n, ptrs, 3, &head, &nvec);
  size_t work = nvec > (n - nvec * Pack16<S>::kN) ? nvec : (n - nvec * Pack16<S>::kN);
  using F = typename Factor<S>::type;
  TFRING_LAUNCH(blocksFor(work), kThreads, st, binaryKernel<S, Op>)(
      static_cast<S*>(dst), static_cast<const S*>(a), static_cast<const S*>(b), n, head, nvec,
      factor != 1.0, static_cast<F>(factor));
  checkLaunch("reduce");
}

template <class S>
void launchReduce(void* dst, const void* a, const void* b, size_t n, ReduceOp op, double f,
                  Stream st) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAverage: return launchBinary<S, OpSum>(dst, a, b, n, f, st);
    case ReduceOp::kMin: return launchBinary<S, OpMin>(dst, a, b, n, f, st);
    case ReduceOp::kMax: return launchBinary<S, OpMax>(dst, a, b, n, f, st);
    case ReduceOp::kProduct: return launchBinary<S, OpProduct>(dst, a, b, n, f, st);
  }
  fail(Code::kInvalidArgument, "unknown reduce op ", static_cast<int>(op));
}

template <class S>
void launchScale(void* dst, const void* src, size_t n, double factor, Stream st) {
  const void* ptrs[2] = {dst, src};
  size_t head, nvec;
  splitAligned<S>(n, ptrs, 2, &head, &nvec);
  size_t work = nvec > (n - nvec * Pack16<S>::kN) ? nvec : (n - nvec * Pack16<S>::kN);
  using F = typename Factor<S>::type;
  TFRING_LAUNCH(blocksFor(work), kThreads, st, scaleKernel<S>)(
      static_cast<S*>(dst), static_cast<const S*>(src), n, head, nvec, static_cast<F>(factor));
  checkLaunch("scale");
}

// Calls fn.template operator()<S>() with S the storage type of `dtype`.
template <class Fn>
void dispatchDtype(DataType dtype, Fn&& fn) {
  switch (dtype) {
    case DataType::kFloat16: return fn(Half{});
    case DataType::kBFloat16: return fn(BF16{});
    case DataType::kFloat32: return fn(float{});
    case DataType::kFloat64: return fn(double{});
    case DataType::kInt32: return fn(int32_t{});
    case DataType::kInt64: return fn(int64_t{});
    case DataType::kUInt8: return fn(uint8_t{});
    case DataType::kInt8: return fn(int8_t{});
    case DataType::kBool: return fn(Bool{});
    case DataType::kInt16: return fn(int16_t{});
    case DataType::kUInt16: return fn(uint16_t{});
  }
  fail(Code::kInvalidArgument, "unknown dtype ", static_cast<int>(dtype));
}

}  // namespace
}  // namespace detail

void reduce(void* dst, const void* a, const void* b, size_t count, DataType dtype, ReduceOp op,
            double factor, Stream stream) {
  if (count == 0) return;
  detail::dispatchDtype(dtype, [&](auto tag) {
    using S = decltype(tag);
    detail::launchReduce<S>(dst, a, b, count, op, factor, stream);
  });
}

void scale(void* dst, const void* src, size_t count, DataType dtype, double factor,
           Stream stream) {
  if (count == 0) return;
  if (factor == 1.0) {
    if (dst == src) return;
    cudaError_t e = cudaMemcpyAsync(dst, src, count * dtypeSize(dtype), cudaMemcpyDeviceToDevice,
                                    stream);
    if (e != cudaSuccess)
      fail(Code::kInternal, "cudaMemcpyAsync in scale: ", cudaGetErrorString(e));
    return;
  }
  detail::dispatchDtype(dtype, [&](auto tag) {
    using S = decltype(tag);
    detail::launchScale<S>(dst, src, count, factor, stream);
  });
}

}  // namespace cuda
}  // namespace kernels
}  // namespace tfring
