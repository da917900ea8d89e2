// Choosing the allreduce algorithm (see allreduce.h). Only job-wide values
// enter the choice: the byte size (every rank reduces the same shape), the
// topology every rank computed from the same store records, and rank 0's
// settings that RingLinks::connect distributed.
#include <atomic>
#include <cstring>

#include "collectives/allreduce.h"
#include "kernels/cpu/reduce.h"

namespace tfring {
namespace collectives {

namespace {
std::atomic<uint64_t> g_calls[4];
}

uint64_t allreduceCalls(AllreduceAlgo a) {
  return g_calls[static_cast<int>(a)].load(std::memory_order_relaxed);
}

const char* allreduceAlgoName(AllreduceAlgo a) {
  switch (a) {
    case AllreduceAlgo::kRing: return "ring";
    case AllreduceAlgo::kOneShot: return "oneshot";
    case AllreduceAlgo::kSmall: return "small";
    case AllreduceAlgo::kHier: return "hier";
  }
  return "?";
}

AllreduceAlgo chooseAllreduce(const RingComm& c, size_t bytes) {
  const transport::HostLinks* H = c.host;
  if (!H || c.size == 1) return AllreduceAlgo::kRing;
  const bool spans = H->num_hosts > 1;
  // The cross ring exists, and each host can share within itself.
  const bool cross = spans && H->uniform && (H->local_size == 1 || H->segment);
  // Host-local schemes without a segment only make sense with one rank per
  // host, and then only across hosts.
  auto small = [&]() {
    if (!spans) return H->segment ? AllreduceAlgo::kOneShot : AllreduceAlgo::kRing;
    return cross ? AllreduceAlgo::kSmall : AllreduceAlgo::kRing;
  };
  const std::string& a = H->algo;
  if (a == "ring") return AllreduceAlgo::kRing;
  if (a == "oneshot") return small();
  if (a == "hier") {
    if (!spans) return H->segment ? AllreduceAlgo::kHier : AllreduceAlgo::kRing;
    return cross ? AllreduceAlgo::kHier : AllreduceAlgo::kRing;
  }
  if (bytes <= static_cast<uint64_t>(H->small_threshold)) return small();
  return (cross && H->local_size > 1) ? AllreduceAlgo::kHier : AllreduceAlgo::kRing;
}

void allreduce(RingComm& c, const void* in, void* out, size_t count, DataType dtype,
               ReduceOp op, double postscale) {
  if (count == 0) return;
  const AllreduceAlgo a = chooseAllreduce(c, count * dtypeSize(dtype));
  g_calls[static_cast<int>(a)].fetch_add(1, std::memory_order_relaxed);
  switch (a) {
    case AllreduceAlgo::kOneShot:
      return oneshotAllreduce(c, in, out, count, dtype, op, postscale);
    case AllreduceAlgo::kSmall:
      return hierAllreduce(c, in, out, count, dtype, op, postscale, true);
    case AllreduceAlgo::kHier:
      return hierAllreduce(c, in, out, count, dtype, op, postscale, false);
    case AllreduceAlgo::kRing:
      break;
  }
  ringAllreduce(c, in, out, count, dtype, op, postscale);
}

void allreduceSpans(RingComm& c, const std::vector<Span>& spans, DataType dtype, ReduceOp op,
                    double postscale, std::vector<char>* pack) {
  const size_t es = dtypeSize(dtype);
  size_t count = 0;
  for (auto& s : spans) count += s.count;
  if (count == 0) return;
  const AllreduceAlgo a = chooseAllreduce(c, count * es);
  if (a == AllreduceAlgo::kRing) {
    g_calls[static_cast<int>(a)].fetch_add(1, std::memory_order_relaxed);
    ringAllreduceSpans(c, spans, dtype, op, postscale);
    return;
  }
  if (pack->size() < count * es) pack->resize(count * es);
  size_t off = 0;
  for (auto& s : spans) {
    if (s.count) std::memcpy(pack->data() + off, s.in, s.count * es);
    off += s.count * es;
  }
  allreduce(c, pack->data(), pack->data(), count, dtype, op, postscale);
  off = 0;
  for (auto& s : spans) {
    if (s.count) std::memcpy(s.out, pack->data() + off, s.count * es);
    off += s.count * es;
  }
}

}  // namespace collectives
}  // namespace tfring
