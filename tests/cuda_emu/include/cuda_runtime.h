// CUDA emulation (TFRING_WITH_CUDA=EMU): what csrc/kernels/cuda needs from
// <cuda_runtime.h> beyond the runtime API, so that the unchanged kernel
// sources compile with the host compiler and run on the fake runtime's
// stream threads (tests/cuda_emu/streams.cc). See tests/cuda_emu/README.md.
//
// A launch (TFRING_LAUNCH in kernels/cuda/elements.cuh) copies the kernel's
// arguments at launch time, as CUDA does, and queues the whole grid on the
// stream: the stream's thread then calls the kernel once per (block, thread)
// with blockIdx/threadIdx set. That is faithful for kernels with no shared
// memory and no __syncthreads, which is all of ours: every thread's work is
// independent of the order in which threads run. A thread may spin on memory
// another process writes (the peer barrier of kernels/cuda/peer.cu) as long
// as what it waits for does not depend on a later thread of its own grid;
// the streams of different processes run concurrently, as on a GPU.
#pragma once

#include <cstring>
#include <functional>
#include <tuple>
#include <type_traits>
#include <utility>

#include "cuda_runtime_api.h"

#ifndef CUDART_VERSION
#define CUDART_VERSION 13000
#endif

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __launch_bounds__(...)
#define __grid_constant__

namespace tfring_emu {

struct GridContext {
  uint3 blockIdx{0, 0, 0};
  uint3 threadIdx{0, 0, 0};
  dim3 blockDim;
  dim3 gridDim;
};
inline thread_local GridContext grid_context;

// Runs body() once per thread of a 1-D or 3-D grid, in order.
template <class Body>
void runGrid(dim3 grid, dim3 block, Body&& body) {
  GridContext& g = grid_context;
  g.gridDim = grid;
  g.blockDim = block;
  for (unsigned bz = 0; bz < grid.z; ++bz)
    for (unsigned by = 0; by < grid.y; ++by)
      for (unsigned bx = 0; bx < grid.x; ++bx)
        for (unsigned tz = 0; tz < block.z; ++tz)
          for (unsigned ty = 0; ty < block.y; ++ty)
            for (unsigned tx = 0; tx < block.x; ++tx) {
              g.blockIdx = uint3{bx, by, bz};
              g.threadIdx = uint3{tx, ty, tz};
              body();
            }
}

template <class... P>
struct Launch {
  void (*kernel)(P...);
  dim3 grid, block;
  cudaStream_t stream;

  template <class... A>
  void operator()(A&&... a) const {
    // The arguments are converted to the kernel's parameter types and copied
    // now, like CUDA's launch; the caller's variables may change right after.
    std::tuple<std::decay_t<P>...> args(std::forward<A>(a)...);
    if (grid.x == 0 || grid.y == 0 || grid.z == 0 || block.x == 0 || block.y == 0 ||
        block.z == 0 || block.x * block.y * block.z > 1024) {
      setLastError(cudaErrorInvalidConfiguration);
      return;
    }
    auto k = kernel;
    dim3 g = grid, b = block;
    cudaError_t e = enqueue(stream, [k, g, b, args]() {
      runGrid(g, b, [&] { std::apply(k, args); });
    });
    if (e != cudaSuccess) setLastError(e);
  }
};

template <class... P>
Launch<P...> launcher(dim3 grid, dim3 block, cudaStream_t stream, void (*kernel)(P...)) {
  return Launch<P...>{kernel, grid, block, stream};
}

}  // namespace tfring_emu

#define blockIdx (::tfring_emu::grid_context.blockIdx)
#define threadIdx (::tfring_emu::grid_context.threadIdx)
#define blockDim (::tfring_emu::grid_context.blockDim)
#define gridDim (::tfring_emu::grid_context.gridDim)

// Orders this thread's memory accesses for every observer (other processes
// included), like CUDA's system-scope fence.
inline void __threadfence_system() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }

inline float __uint_as_float(unsigned int u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
inline unsigned int __float_as_uint(float f) {
  unsigned int u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
