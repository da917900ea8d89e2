// Ring allreduce: reduce-scatter, then allgather, each N-1 steps.
//
// The buffer is cut into N segments. In reduce-scatter step k, position p
// sends segment (p-k) to the right and receives segment (p-k-1) from the
// left, folding it into its own copy; after N-1 steps position p holds the
// complete reduction of segment (p+1). In allgather step k it sends segment
// (p+1-k) and receives segment (p-k), overwriting its copy.
//
// Seen as two streams, what p sends in step j+1 is exactly what it received
// in step j (the transition included: the last reduce-scatter receive is
// the first allgather send), so every send step after the first is chained
// to the previous receive step and the whole 2(N-1)-step exchange runs as
// one pipeline. Each rank moves 2(N-1)/N of the buffer in and out, which is
// the bandwidth lower bound for allreduce.
//
// A 16-bit wire (float32 buffers; docs/compression.md) halves those bytes
// and keeps every addition in float32. A reduce-scatter step receives 16-bit
// words, widens them and folds them into this rank's float32 input, and the
// next send narrows that float32 partial again, chunk by chunk in the same
// pipeline; the partial of a segment is rounded to 16 bits once per hop and
// never summed in 16 bits. The segment's owner completes it in float32 and
// replaces it by its 16-bit rounding, which is exactly what the allgather
// then carries to every other rank, so all ranks end with the same float32
// bits. Sum and Average fold the postscale (Average's 1/N) into each
// rank's input before it is first narrowed: partials of an average stay
// within the inputs' range, where float16 does not overflow; min, max and
// product scale the final value instead (a prescale would not commute
// with them).
#include <algorithm>
#include <cstring>

#include "collectives/ring.h"
#include "collectives/ring_pipeline.h"
#include "kernels/cpu/reduce.h"

namespace tfring {
namespace collectives {

std::vector<size_t> evenSplit(size_t count, int parts) {
  std::vector<size_t> off(parts + 1, 0);
  size_t base = count / parts, extra = count % parts;
  for (int i = 0; i < parts; ++i) off[i + 1] = off[i] + base + (static_cast<size_t>(i) < extra ? 1 : 0);
  return off;
}

namespace {

// The virtual buffer of a scatter list: tensor after tensor. piece() cuts a
// virtual byte range at tensor boundaries and calls fn(in, out, bytes) for
// each part, in order.
struct SpanMap {
  const std::vector<Span>& spans;
  std::vector<size_t> start;  // virtual byte offset of each span
  size_t es;

  SpanMap(const std::vector<Span>& s, size_t elem) : spans(s), es(elem) {
    size_t off = 0;
    for (auto& sp : spans) {
      start.push_back(off);
      off += sp.count * es;
    }
    start.push_back(off);
  }

  template <typename Fn>
  int pieces(size_t a, size_t b, Fn fn) const {
    int n = 0;
    if (a >= b) return 0;
    size_t i = std::upper_bound(start.begin(), start.end(), a) - start.begin() - 1;
    while (a < b) {
      while (start[i + 1] <= a) ++i;  // skip empty spans
      size_t end = std::min(b, start[i + 1]);
      size_t o = a - start[i];
      fn(spans[i].in + o, spans[i].out + o, end - a);
      ++n;
      a = end;
    }
    return n;
  }
};

}  // namespace

void ringAllreduce(RingComm& c, const void* in, void* out, size_t count, DataType dtype,
                   ReduceOp op, double postscale, WireType wire) {
  std::vector<Span> one{{static_cast<const char*>(in), static_cast<char*>(out), count}};
  ringAllreduceSpans(c, one, dtype, op, postscale, wire);
}

void ringAllreduceSpans(RingComm& c, const std::vector<Span>& spans, DataType dtype,
                        ReduceOp op, double postscale, WireType wire) {
  const int N = c.size;
  const size_t es = dtypeSize(dtype);
  size_t count = 0;
  for (auto& sp : spans) count += sp.count;
  if (N == 1 || count == 0) {
    for (auto& sp : spans) {
      if (sp.out != sp.in && sp.count) std::memcpy(sp.out, sp.in, sp.count * es);
      if (postscale != 1.0) kernels::scale(sp.out, sp.count, dtype, postscale);
    }
    return;
  }
  const SpanMap map(spans, es);
  const int p = c.pos;
  RingProgram prog;
  prog.dtype = dtype;
  prog.op = op;
  prog.wire = effectiveWire(wire, dtype);
  const bool narrow = prog.wire != WireType::kNone;
  // On a 16-bit wire a sum scales every input as it is first read (see
  // above); otherwise the last reduce-scatter step scales the result.
  const bool prescale = narrow && (op == ReduceOp::kSum || op == ReduceOp::kAverage);
  const double in_scale = prescale ? postscale : 1.0;
  const double final_scale = prescale ? 1.0 : postscale;
  // Each logical step becomes one step per tensor it touches. A chained
  // send covers exactly the range its producing receive step covered, so
  // its pieces chain one to one to that step's pieces.
  auto addRecv = [&](std::pair<size_t, size_t> r, bool reduce, bool last) {
    int first = static_cast<int>(prog.recvs.size());
    map.pieces(r.first, r.second, [&](const char* i, char* o, size_t b) {
      prog.recvs.push_back({o, b, reduce, last ? final_scale : 1.0, reduce ? i : nullptr,
                            reduce ? in_scale : 1.0, last && narrow});
    });
    return first;
  };
  auto addSend = [&](std::pair<size_t, size_t> s, bool from_input, int chained_first) {
    int j = 0;
    map.pieces(s.first, s.second, [&](const char* i, char* o, size_t b) {
      prog.sends.push_back({from_input ? i : o, b, chained_first < 0 ? -1 : chained_first + j,
                            from_input ? in_scale : 1.0});
      ++j;
    });
  };
  // The 2(N-1) steps over elements [begin, end), cut into N segments.
  auto addRound = [&](size_t begin, size_t end) {
    auto off = evenSplit(end - begin, N);
    auto seg = [&](int i) {  // virtual byte range of segment i
      i = ((i % N) + N) % N;
      return std::make_pair((begin + off[i]) * es, (begin + off[i + 1]) * es);
    };
    int prev = -1;  // first piece of the previous receive step
    for (int k = 0; k < N - 1; ++k) {  // reduce-scatter
      // Step 0 sends straight from the input; each receive folds the
      // input's copy of its segment with what arrived, writing the output.
      addSend(seg(p - k), k == 0, k == 0 ? -1 : prev);
      prev = addRecv(seg(p - k - 1), true, k == N - 2);
    }
    for (int k = 0; k < N - 1; ++k) {  // allgather
      addSend(seg(p + 1 - k), false, prev);
      prev = addRecv(seg(p - k), false, false);
    }
  };
  // A large buffer on one host runs as rounds of N chunks, one after the
  // other in each link's stream. Then what a rank sends next is, as soon as
  // it is reduced, the chunk it just received: runRing reduces it straight
  // into the right link (forwarding) and never reads it back from the
  // output. In one round over the whole buffer the send stream is still
  // busy with the reduce-scatter's first segment when those bytes arrive,
  // so they went to the output and were copied out again later, from
  // memory. Every rank of the job decides alike (sizes and host count are
  // job-wide), which the streams' order requires.
  const size_t round = static_cast<size_t>(N) * std::max<size_t>(kRingRoundSegmentBytes / es, 1);
  const bool rounds = c.host && c.host->num_hosts == 1 && count * es >= kRingRoundsMinBytes;
  for (size_t b = 0; b < count; b += rounds ? round : count)
    addRound(b, rounds ? std::min(count, b + round) : count);
  runRing(c, prog, "allreduce");
}

}  // namespace collectives
}  // namespace tfring
