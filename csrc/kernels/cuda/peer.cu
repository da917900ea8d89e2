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
__global__ void __launch_bounds__(kThreads)
    peerReduceKernel(S* dst, const PeerSrcs s, size_t begin, size_t count, bool do_scale,
                     typename Factor<S>::type f) {
  using E = Elem<S>;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = begin + static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       i < begin + count; i += stride) {
    S acc = static_cast<const S*>(s.src[0])[i];
    for (int r = 1; r < s.n; ++r)
      acc = E::store(Op::template apply<S>(E::load(acc), E::load(static_cast<const S*>(s.src[r])[i])));
    dst[i] = do_scale ? scaleOne<S>(acc, f) : acc;
  }
}

template <class S, class Op>
void launchPeerReduce(void* dst, const PeerSrcs& s, size_t begin, size_t count, double factor,
                      Stream st) {
  using F = typename Factor<S>::type;
  TFRING_LAUNCH(blocksFor(count), kThreads, st, peerReduceKernel<S, Op>)(
      static_cast<S*>(dst), s, begin, count, factor != 1.0, static_cast<F>(factor));
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
  }
  fail(Code::kInvalidArgument, "unknown dtype ", static_cast<int>(dtype));
}

}  // namespace cuda
}  // namespace kernels
}  // namespace tfring
