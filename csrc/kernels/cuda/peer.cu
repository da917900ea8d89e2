// The peer-read allreduce kernels: a flag barrier between processes and an
// n-way reduce in rank order (see peer.h).
#include "kernels/cuda/elements.cuh"
#include "kernels/cuda/peer.h"

#ifdef TFRING_CUDA_EMULATION
#include <chrono>
#endif

namespace tfring {
namespace kernels {
namespace cuda {
namespace detail {
namespace {

__device__ __forceinline__ uint64_t globalTimerNs() {
#ifdef TFRING_CUDA_EMULATION
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
#else
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
#endif
}

__global__ void peerBarrierKernel(const PeerFlags f, uint64_t value, const int32_t* abort,
                                  int32_t* status, uint64_t timeout_ns) {
  const int t = threadIdx.x;
  // Release: everything this rank's stream wrote before is visible to the
  // peers before they can see the flag.
  __threadfence_system();
  *reinterpret_cast<volatile uint64_t*>(f.flag[f.me]) = value;
  if (t >= f.n || t == f.me) return;
  const volatile uint64_t* peer = f.flag[t];
  const volatile int32_t* ab = abort;
  uint64_t start = 0;
  for (uint32_t spin = 0; *peer < value; ++spin) {
    if ((spin & 1023) != 1023) continue;
    const uint64_t now = globalTimerNs();
    if (!start) start = now;
    if (*ab || now - start > timeout_ns) {
      *reinterpret_cast<volatile int32_t*>(status) = 1 + t;
      __threadfence_system();
      return;
    }
  }
  // Acquire: the reads of the peer's data come after the flag was seen.
  __threadfence_system();
}

template <class S, class Op>
__device__ __forceinline__ S reduceOne(S acc, S x) {
  using E = Elem<S>;
  return E::store(Op::template apply<S>(E::load(acc), E::load(x)));
}

// Elements [begin, begin + count): `nvec` 16-byte packs from begin + head,
// the head before them and the tail after them element by element.
template <class S, class Op>
__global__ void __launch_bounds__(kThreads)
    peerReduceKernel(S* dst, const PeerSrcs s, size_t begin, size_t count, size_t head,
                     size_t nvec, bool do_scale, typename Factor<S>::type f) {
  constexpr int V = Pack16<S>::kN;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  const size_t tid = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t vbase = begin + head;
  for (size_t i = tid; i < nvec; i += stride) {
    Pack16<S> acc, x;
    acc.raw = reinterpret_cast<const uint4*>(static_cast<const S*>(s.src[0]) + vbase)[i];
    for (int r = 1; r < s.n; ++r) {
      x.raw = reinterpret_cast<const uint4*>(static_cast<const S*>(s.src[r]) + vbase)[i];
#pragma unroll
      for (int k = 0; k < V; ++k) acc.e[k] = reduceOne<S, Op>(acc.e[k], x.e[k]);
    }
    if (do_scale) {
#pragma unroll
      for (int k = 0; k < V; ++k) acc.e[k] = scaleOne<S>(acc.e[k], f);
    }
    reinterpret_cast<uint4*>(dst + vbase)[i] = acc.raw;
  }
  const size_t tail = head + nvec * V;
  const size_t nscalar = head + (count - tail);
  for (size_t i = tid; i < nscalar; i += stride) {
    const size_t j = begin + (i < head ? i : tail + (i - head));
    S acc = static_cast<const S*>(s.src[0])[j];
    for (int r = 1; r < s.n; ++r) acc = reduceOne<S, Op>(acc, static_cast<const S*>(s.src[r])[j]);
    dst[j] = do_scale ? scaleOne<S>(acc, f) : acc;
  }
}

template <class S, class Op>
void launchPeerReduce(void* dst, const PeerSrcs& s, size_t begin, size_t count, double factor,
                      Stream st) {
  // Packs only where every source and dst reach 16-byte alignment together.
  constexpr size_t V = Pack16<S>::kN;
  size_t head = headToAlign<S>(static_cast<const S*>(s.src[0]) + begin);
  bool ok = head != SIZE_MAX && head <= count;
  for (int r = 1; ok && r < s.n; ++r)
    ok = aligned16(static_cast<const S*>(s.src[r]) + begin + head);
  ok = ok && aligned16(static_cast<const S*>(dst) + begin + head);
  const size_t nvec = ok ? (count - head) / V : 0;
  if (!ok) head = count;
  const size_t scalar = count - nvec * V;
  using F = typename Factor<S>::type;
  TFRING_LAUNCH(blocksFor(nvec > scalar ? nvec : scalar), kThreads, st, peerReduceKernel<S, Op>)(
      static_cast<S*>(dst), s, begin, count, head, nvec, factor != 1.0, static_cast<F>(factor));
  checkLaunch("peer reduce");
}

template <class S>
void dispatchOp(void* dst, const PeerSrcs& s, size_t begin, size_t count, ReduceOp op,
                double factor, Stream st) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAverage: return launchPeerReduce<S, OpSum>(dst, s, begin, count, factor, st);
    case ReduceOp::kMin: return launchPeerReduce<S, OpMin>(dst, s, begin, count, factor, st);
    case ReduceOp::kMax: return launchPeerReduce<S, OpMax>(dst, s, begin, count, factor, st);
    case ReduceOp::kProduct:
      return launchPeerReduce<S, OpProduct>(dst, s, begin, count, factor, st);
  }
  fail(Code::kInvalidArgument, "unknown reduce op ", static_cast<int>(op));
}

}  // namespace
}  // namespace detail

void peerBarrier(const PeerFlags& flags, uint64_t value, const int32_t* abort, int32_t* status,
                 uint64_t timeout_ns, Stream stream) {
  TFRING_LAUNCH(1, 32, stream, detail::peerBarrierKernel)(flags, value, abort, status, timeout_ns);
  detail::checkLaunch("peer barrier");
}

void peerReduce(void* dst, const PeerSrcs& srcs, size_t begin, size_t count, DataType dtype,
                ReduceOp op, double factor, Stream stream) {
  if (count == 0) return;
  using namespace detail;
  switch (dtype) {
    case DataType::kFloat16: return dispatchOp<Half>(dst, srcs, begin, count, op, factor, stream);
    case DataType::kBFloat16: return dispatchOp<BF16>(dst, srcs, begin, count, op, factor, stream);
    case DataType::kFloat32: return dispatchOp<float>(dst, srcs, begin, count, op, factor, stream);
    case DataType::kFloat64: return dispatchOp<double>(dst, srcs, begin, count, op, factor, stream);
    case DataType::kInt32: return dispatchOp<int32_t>(dst, srcs, begin, count, op, factor, stream);
    case DataType::kInt64: return dispatchOp<int64_t>(dst, srcs, begin, count, op, factor, stream);
    case DataType::kUInt8: return dispatchOp<uint8_t>(dst, srcs, begin, count, op, factor, stream);
    case DataType::kInt8: return dispatchOp<int8_t>(dst, srcs, begin, count, op, factor, stream);
    case DataType::kBool: return dispatchOp<Bool>(dst, srcs, begin, count, op, factor, stream);
    case DataType::kInt16: return dispatchOp<int16_t>(dst, srcs, begin, count, op, factor, stream);
    case DataType::kUInt16: return dispatchOp<uint16_t>(dst, srcs, begin, count, op, factor, stream);
  }
  fail(Code::kInvalidArgument, "unknown dtype ", static_cast<int>(dtype));
}

}  // namespace cuda
}  // namespace kernels
}  // namespace tfring
