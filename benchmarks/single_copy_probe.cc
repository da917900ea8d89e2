// What a single-copy allreduce between two local processes would cost:
// each rank reads the peer's half of the input with process_vm_readv (the
// kernel's cross-process copy, what MPI's CMA path uses) into a scratch
// block that stays in cache, reduces it with its own half into its output,
// and then reads the peer's reduced half straight into its output. No
// shared staging ring: every byte crosses between processes once. It is a
// probe, not a collective: two ranks, float32 sums, barriers on a shared
// page.
//
//   g++ -O3 -march=native -o /tmp/single_copy_probe benchmarks/single_copy_probe.cc
//   /tmp/single_copy_probe 134 1024     # MB of float32, scratch KiB
//
// Compare with the core in the same minutes:
//   python benchmarks/allreduce_bench.py --np 2 --sizes 128M --no-batch --no-tf
// (docs/training-step.md, "A single copy between ranks").
#include <sys/mman.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <vector>

namespace {

struct Shared {
  std::atomic<int> arrived[2];
  pid_t pid[2];
  float* in[2];
  float* out[2];
};

void barrier(Shared* s, int r, int* gen) {
  ++*gen;
  s->arrived[r].store(*gen);
  while (s->arrived[1 - r].load() < *gen) {
  }
}

bool readPeer(pid_t peer, void* dst, const void* src, size_t bytes) {
  iovec l{dst, bytes}, rm{const_cast<void*>(src), bytes};
  return process_vm_readv(peer, &l, 1, &rm, 1, 0) == static_cast<ssize_t>(bytes);
}

}  // namespace

int main(int argc, char** argv) {
  const size_t n = (argc > 1 ? atol(argv[1]) : 134) * 1000000 / 4;
  const size_t block = (argc > 2 ? atol(argv[2]) : 1024) * 1024 / 4;
  const int iters = 7;
  auto* s = static_cast<Shared*>(
      mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  new (s) Shared();
  const pid_t child = fork();
  const int r = child == 0 ? 1 : 0;
  s->pid[r] = getpid();
  auto* in = static_cast<float*>(aligned_alloc(64, n * 4));
  auto* out = static_cast<float*>(aligned_alloc(64, n * 4));
  auto* scratch = static_cast<float*>(aligned_alloc(64, block * 4));
  for (size_t i = 0; i < n; i++) in[i] = static_cast<float>(r + 1);
  std::memset(out, 0, n * 4);
  s->in[r] = in;
  s->out[r] = out;
  int gen = 0;
  barrier(s, r, &gen);
  const pid_t peer = s->pid[1 - r];
  const size_t half = n / 2;
  const size_t lo = r ? half : 0, hi = r ? n : half;      // the half I reduce
  const size_t plo = r ? 0 : half, phi = r ? half : n;    // the peer's half
  std::vector<double> ms;
  for (int it = 0; it < iters; it++) {
    barrier(s, r, &gen);
    const auto t0 = std::chrono::steady_clock::now();
    for (size_t o = lo; o < hi; o += block) {
      const size_t m = std::min(block, hi - o);
      if (!readPeer(peer, scratch, s->in[1 - r] + o, m * 4)) {
        perror("process_vm_readv (input)");
        return 1;
      }
      for (size_t i = 0; i < m; i++) out[o + i] = in[o + i] + scratch[i];
    }
    barrier(s, r, &gen);
    if (!readPeer(peer, out + plo, s->out[1 - r] + plo, (phi - plo) * 4)) {
      perror("process_vm_readv (output)");
      return 1;
    }
    barrier(s, r, &gen);
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                     .count());
  }
  for (size_t i = 0; i < n; i += 9973) {
    if (out[i] != 3.0f) {
      std::fprintf(stderr, "rank %d: element %zu is %f, not 3\n", r, i, out[i]);
      return 1;
    }
  }
  std::sort(ms.begin(), ms.end());
  if (r == 0) {
    std::printf("single copy, 2 ranks, %zu MB, %zu KiB blocks: median %.2f ms, fastest %.2f ms\n",
                n * 4 / 1000000, block * 4 / 1024, ms[iters / 2], ms[0]);
    int status = 0;
    waitpid(child, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
  }
  return 0;
}
