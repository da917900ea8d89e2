// Float casts between float16, bfloat16, float32 and float64 (the fp16
// gradient compression and its inverse). Rounds to nearest even; narrowing
// from float64 rounds once, not through float32.
#include "kernels/cuda/elements.cuh"
#include "kernels/cuda/kernels.h"

namespace tfring {
namespace kernels {
namespace cuda {
namespace detail {
namespace {

template <int Bytes>
struct VecOfSize;
template <>
struct VecOfSize<16> {
  using type = uint4;
};
template <>
struct VecOfSize<8> {
  using type = uint2;
};
template <>
struct VecOfSize<4> {
  using type = uint32_t;
};

template <class Out, class In>
__device__ __forceinline__ Out convertOne(In v) {
  if constexpr (std::is_same<In, double>::value) {
    if constexpr (std::is_same<Out, double>::value) return v;
    else if constexpr (std::is_same<Out, float>::value) return static_cast<float>(v);
    else if constexpr (std::is_same<Out, Half>::value) return Half{__half_as_ushort(__double2half(v))};
    else return BF16{__bfloat16_as_ushort(__double2bfloat16(v))};
  } else {
    auto x = Elem<In>::load(v);  // float or double
    if constexpr (std::is_same<Out, double>::value) return static_cast<double>(x);
    else return Elem<Out>::store(static_cast<float>(x));
  }
}

// Packs of V elements: V * sizeof(In) bytes in, V * sizeof(Out) out, both
// 4, 8 or 16 bytes.
template <class Out, class In>
struct CastPack {
  static constexpr int kBig = sizeof(In) > sizeof(Out) ? sizeof(In) : sizeof(Out);
  static constexpr int V = 16 / kBig;
  using InVec = typename VecOfSize<V * sizeof(In)>::type;
  using OutVec = typename VecOfSize<V * sizeof(Out)>::type;
  union InU {
    InVec raw;
    In e[V];
  };
  union OutU {
    OutVec raw;
    Out e[V];
  };
};

template <class Out, class In>
__global__ void __launch_bounds__(kThreads)
    castKernel(Out* dst, const In* src, size_t n, size_t head, size_t nvec) {
  using P = CastPack<Out, In>;
  constexpr int V = P::V;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  const size_t tid = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const typename P::InVec* sv = reinterpret_cast<const typename P::InVec*>(src + head);
  typename P::OutVec* dv = reinterpret_cast<typename P::OutVec*>(dst + head);
  for (size_t i = tid; i < nvec; i += stride) {
    typename P::InU x;
    typename P::OutU r;
    x.raw = sv[i];
#pragma unroll
    for (int k = 0; k < V; ++k) r.e[k] = convertOne<Out, In>(x.e[k]);
    dv[i] = r.raw;
  }
  const size_t tail = head + nvec * V;
  const size_t nscalar = head + (n - tail);
  for (size_t i = tid; i < nscalar; i += stride) {
    size_t j = i < head ? i : tail + (i - head);
    dst[j] = convertOne<Out, In>(src[j]);
  }
}

template <class Out, class In>
void launchCast(void* dst, const void* src, size_t n, Stream st) {
  using P = CastPack<Out, In>;
  constexpr size_t V = P::V;
  // Head: elements until dst is aligned to its pack size; src must then be
  // aligned to its own.
  constexpr size_t out_align = V * sizeof(Out), in_align = V * sizeof(In);
  uintptr_t d = reinterpret_cast<uintptr_t>(dst);
  size_t head = n, nvec = 0;
  if (d % sizeof(Out) == 0) {
    size_t h = ((out_align - d % out_align) % out_align) / sizeof(Out);
    const In* s = static_cast<const In*>(src) + h;
    if (h <= n && reinterpret_cast<uintptr_t>(s) % in_align == 0) {
      head = h;
      nvec = (n - h) / V;
    }
  }
  size_t scalar = n - nvec * V;
  TFRING_LAUNCH(blocksFor(nvec > scalar ? nvec : scalar), kThreads, st, castKernel<Out, In>)(
      static_cast<Out*>(dst), static_cast<const In*>(src), n, head, nvec);
  checkLaunch("cast");
}

template <class Fn>
void dispatchFloat(DataType t, Fn&& fn) {
  switch (t) {
    case DataType::kFloat16: return fn(Half{});
    case DataType::kBFloat16: return fn(BF16{});
    case DataType::kFloat32: return fn(float{});
    case DataType::kFloat64: return fn(double{});
    default: break;
  }
  fail(Code::kInvalidArgument, "cast supports float16, bfloat16, float32 and float64, not ",
       dtypeName(t));
}

}  // namespace
}  // namespace detail

void cast(void* dst, DataType dst_dtype, const void* src, DataType src_dtype, size_t count,
          Stream stream) {
  if (count == 0) return;
  if (dst_dtype == src_dtype) {
    if (dst == src) return;
    cudaError_t e = cudaMemcpyAsync(dst, src, count * dtypeSize(dst_dtype),
                                    cudaMemcpyDeviceToDevice, stream);
    if (e != cudaSuccess) fail(Code::kInternal, "cudaMemcpyAsync in cast: ", cudaGetErrorString(e));
    return;
  }
  detail::dispatchFloat(dst_dtype, [&](auto out_tag) {
    detail::dispatchFloat(src_dtype, [&](auto in_tag) {
      using Out = decltype(out_tag);
      using In = decltype(in_tag);
      if constexpr (!std::is_same<Out, In>::value)
        detail::launchCast<Out, In>(dst, src, count, stream);
    });
  });
}

}  // namespace cuda
}  // namespace kernels
}  // namespace tfring
