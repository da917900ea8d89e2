#include "collectives/ring_pipeline.h"

#include <algorithm>
#include <cstring>

#include "common/clock.h"
#include "kernels/cpu/copy.h"
#include "kernels/cpu/reduce.h"
#include "kernels/cpu/wire16.h"

namespace tfring {
namespace collectives {

namespace {

// Shows a channel's deferred moves to the peer once per 256 KiB moved, and
// when flushed at the end of a pass.
template <typename Channel>
class Publisher {
 public:
  explicit Publisher(Channel* ch) : ch_(ch) {}
  void moved(size_t n) {
    pending_ += n;
    if (pending_ >= kPublishBytes) flush();
  }
  void flush() {
    ch_->flush();
    pending_ = 0;
  }

 private:
  static constexpr size_t kPublishBytes = 256 << 10;
  Channel* ch_;
  size_t pending_ = 0;
};

// A collective whose receive steps write at least this much output writes
// it with streaming stores (kernels/cpu/copy.h): the caller reads it back
// only after the rest of the buffer went through the cache. Below it the
// output stays cached for the caller (an optimizer update, say).
constexpr size_t kStreamOutputBytes = 8 << 20;

// From this much output on, a collective lets its link's StoreTuner choose
// how it writes into the right neighbour's ring (store_tuner.h): one tuner
// for collectives that stream their output, one for those between.
constexpr size_t kTuneLinkBytes = 256 << 10;

// Forwarding a reduction that streams into the link goes through a block
// that stays in L1: reduced there, then copied to the link and the output.
constexpr size_t kForwardBlockBytes = 16 << 10;

// Moves n received bytes at `in` (the left link's inbox) into both the
// right link's free space `link` and their place in r.data + ro: reduced
// with the local operand first where r reduces. `stream_out` and
// `stream_link` pick streaming stores for each destination.
void forwardPiece(const RingProgram& prog, const RecvStep& r, size_t ro, const void* in,
                  char* link, size_t n, bool stream_out, bool stream_link) {
  const size_t esize = dtypeSize(prog.dtype);
  char* out = r.data + ro;
  // Streaming copies are left unfenced: one streamFence() below covers all.
  auto copy = [](char* dst, const void* src, size_t k, bool streaming) {
    if (streaming)
      kernels::copyStreaming(dst, src, k, false);
    else
      std::memcpy(dst, src, k);
  };
  if (!r.reduce) {
    copy(link, in, n, stream_link);
    copy(out, in, n, stream_out);
  } else if (!stream_link) {
    // The link's space is as good a place to reduce into as any: the
    // result stays in this core's cache for the copy into place.
    kernels::reduce3(link, r.src ? r.src + ro : out, in, n / esize, prog.dtype, prog.op);
    if (r.scale != 1.0) kernels::scale(link, n / esize, prog.dtype, r.scale);
    copy(out, link, n, stream_out);
  } else {
    alignas(64) static thread_local char block[kForwardBlockBytes];
    const char* a = r.src ? r.src + ro : out;
    for (size_t o = 0; o < n; o += kForwardBlockBytes) {
      const size_t b = std::min(kForwardBlockBytes, n - o);
      kernels::reduce3(block, a + o, static_cast<const char*>(in) + o, b / esize, prog.dtype,
                       prog.op);
      if (r.scale != 1.0) kernels::scale(block, b / esize, prog.dtype, r.scale);
      copy(link + o, block, b, true);
      copy(out + o, block, b, stream_out);
    }
  }
  if (stream_out || stream_link) kernels::streamFence();
}

// runRing over a 16-bit wire (RingProgram). Sends narrow what is ready
// straight into the right link's free space where the channel lends it
// (shared memory), else into a staging block of at most one pass's words
// offered to the channel until all of it is taken (TCP). Receives widen the
// words where the channel holds them and fold them into float32 in place;
// when the current send is chained to that receive and waits exactly
// there (the next hop of the same segment), the finished float32 piece is
// narrowed into the right link at once, while it is in cache. Pass budgets
// count words' bytes on the link.
void runRingWire(RingComm& c, const RingProgram& prog, const char* what) {
  const WireType w = prog.wire;
  constexpr size_t es = sizeof(float);
  const size_t ws = kernels::wireWordBytes(w);
  const size_t chunk = std::max<size_t>(c.chunk_bytes - c.chunk_bytes % 8, 8);
  const size_t ns = prog.sends.size(), nr = prog.recvs.size();
  static thread_local std::vector<char> stage;
  if (stage.size() < chunk) stage.resize(chunk);
  size_t si = 0, so = 0;  // current send step and float bytes sent in it
  size_t staged = 0, staged_sent = 0;  // words' bytes in the stage, and sent
  size_t ri = 0, ro = 0;  // current recv step and float bytes completed in it
  auto skipEmpty = [&]() {
    while (si < ns && so == prog.sends[si].bytes) { ++si; so = 0; }
    while (ri < nr && ro == prog.recvs[ri].bytes) { ++ri; ro = 0; }
  };
  skipEmpty();
  if (si < ns || ri < nr) {
    c.waiter->begin(Deadline::in(c.timeout_s), what);
    // A bulk ring between sockets sleeps in poll() when its links cannot move.
    size_t words = 0;
    for (const SendStep& s : prog.sends) words += s.bytes / es * ws;
    c.waiter->sleepAtOnceIfBulk(words);
  }

  while (si < ns || ri < nr) {
    uint32_t ticket = c.waiter->ticket();
    bool moved = false;
    bool send_waits_on_channel = false;

    Publisher<transport::SendChannel> sent(c.right);
    for (size_t budget = chunk; si < ns && budget > 0;) {
      const SendStep& s = prog.sends[si];
      if (staged == 0) {
        size_t ready = s.bytes;
        if (s.chained_to >= 0) {
          size_t src = static_cast<size_t>(s.chained_to);
          ready = ri > src ? s.bytes : (ri == src ? std::min(ro, s.bytes) : 0);
        }
        if (ready <= so) break;
        size_t k = std::min((ready - so) / es, budget / ws);
        if (!k) break;
        void* q = nullptr;
        const size_t room = c.right->reserve(&q, k * ws) / ws;
        if (room) {  // narrowed into the link itself
          k = std::min(k, room);
          kernels::narrow(q, reinterpret_cast<const float*>(s.data + so), k, w, s.scale);
          c.right->commitDeferred(k * ws);
          so += k * es;
          budget -= k * ws;
          moved = true;
          sent.moved(k * ws);
          skipEmpty();
          continue;
        }
        k = std::min((ready - so) / es, chunk / ws);
        kernels::narrow(stage.data(), reinterpret_cast<const float*>(s.data + so), k, w,
                        s.scale);
        staged = k * ws;
        staged_sent = 0;
      }
      const size_t n =
          c.right->trySendDeferred(stage.data() + staged_sent, std::min(staged - staged_sent, budget));
      if (!n) {
        send_waits_on_channel = true;
        break;
      }
      staged_sent += n;
      budget -= n;
      moved = true;
      sent.moved(n);
      if (staged_sent < staged) break;  // the channel is full
      so += staged / ws * es;
      staged = 0;
      skipEmpty();
    }
    sent.flush();

    Publisher<transport::RecvChannel> received(c.left);
    for (size_t budget = chunk; ri < nr && budget > 0;) {
      const RecvStep& r = prog.recvs[ri];
      const void* p = nullptr;
      size_t n = c.left->peek(&p, std::min((r.bytes - ro) / es * ws, budget));
      n -= n % ws;
      if (!n) break;
      size_t k = n / ws;
      float* dst = reinterpret_cast<float*>(r.data + ro);
      // Forwarding: the next send is this piece, narrowed, at this place.
      void* q = nullptr;
      size_t room = 0;
      const SendStep* fwd = nullptr;
      if (si < ns && staged == 0 && prog.sends[si].chained_to == static_cast<int>(ri) &&
          prog.sends[si].data + so == r.data + ro) {
        fwd = &prog.sends[si];
        room = c.right->reserve(&q, std::min(k, (fwd->bytes - so) / es) * ws) / ws;
        if (room) k = std::min(k, room);
        n = k * ws;
      }
      if (r.reduce) {
        const float* a = r.src ? reinterpret_cast<const float*>(r.src + ro) : dst;
        kernels::widenReduce(dst, a, p, k, w, prog.op, r.src_scale);
      } else {
        kernels::widen(dst, p, k, w);
      }
      c.left->consumeDeferred(n);
      if (r.scale != 1.0) kernels::scale(dst, k, DataType::kFloat32, r.scale);
      if (r.round_trip) kernels::roundTrip(dst, k, w);
      if (room) {
        kernels::narrow(q, dst, k, w, fwd->scale);
        c.right->commitDeferred(k * ws);
        so += k * es;
        sent.moved(k * ws);
      }
      ro += k * es;
      budget -= n;
      moved = true;
      received.moved(n);
      if (ro < r.bytes) break;  // nothing more has arrived yet
      skipEmpty();
    }
    received.flush();
    sent.flush();

    skipEmpty();
    if (moved) {
      c.waiter->progressed();
    } else if (si < ns || ri < nr) {
      c.waiter->idle(ticket, send_waits_on_channel, ri < nr);
    }
  }
  if (c.size > 1) {
    c.right->align();
    c.left->align();
  }
}

}  // namespace

void runRing(RingComm& c, const RingProgram& prog, const char* what) {
  if (prog.wire != WireType::kNone) return runRingWire(c, prog, what);
  const size_t esize = dtypeSize(prog.dtype);
  const size_t chunk = std::max<size_t>(c.chunk_bytes - c.chunk_bytes % 8, 8);
  const size_t ns = prog.sends.size(), nr = prog.recvs.size();
  size_t si = 0, so = 0;  // current send step and bytes sent in it
  size_t ri = 0, ro = 0;  // current recv step and bytes completed in it
  auto skipEmpty = [&]() {
    while (si < ns && so == prog.sends[si].bytes) { ++si; so = 0; }
    while (ri < nr && ro == prog.recvs[ri].bytes) { ++ri; ro = 0; }
  };
  skipEmpty();
  if (si < ns || ri < nr) c.waiter->begin(Deadline::in(c.timeout_s), what);

  size_t out_bytes = 0, in_bytes = 0;
  for (const RecvStep& r : prog.recvs) out_bytes += r.bytes;
  for (const SendStep& s : prog.sends) in_bytes += s.bytes;
  if (si < ns || ri < nr) c.waiter->sleepAtOnceIfBulk(std::max(in_bytes, out_bytes));
  // Large outputs are streamed; how to write into the link is the tuner's
  // choice (store_tuner.h), timed over the whole collective.
  const bool stream = out_bytes >= kStreamOutputBytes;
  StoreTuner* tuner = stream ? c.tuner.get() : out_bytes >= kTuneLinkBytes ? c.tuner_mid.get()
                                                                           : nullptr;
  const bool link_stream = tuner && tuner->begin();
  const double started = tuner ? nowSeconds() : 0;

  // One pass moves up to `chunk` bytes each way, over as many steps as it
  // takes: a fused batch of small tensors is one step per tensor, and
  // publishing each (a store to a cache line the peer polls, and its
  // doorbell) cost more than copying 16 KiB. A pass publishes once per
  // 256 KiB moved and at its end (Publisher), before it may go idle, so
  // large steps still reach the peer piece by piece as before.
  while (si < ns || ri < nr) {
    uint32_t ticket = c.waiter->ticket();
    bool moved = false;
    bool send_waits_on_channel = false;

    // Send what is ready: all of an unchained step, or as much of a chained
    // step as its producing recv step has completed.
    Publisher<transport::SendChannel> sent(c.right);
    for (size_t budget = chunk; si < ns && budget > 0;) {
      const SendStep& s = prog.sends[si];
      size_t ready = s.bytes;
      if (s.chained_to >= 0) {
        size_t src = static_cast<size_t>(s.chained_to);
        ready = ri > src ? s.bytes : (ri == src ? std::min(ro, s.bytes) : 0);
      }
      if (ready <= so) break;
      const size_t want = std::min(ready - so, budget);
      size_t n = link_stream ? c.right->trySendStreamingDeferred(s.data + so, want)
                             : c.right->trySendDeferred(s.data + so, want);
      if (!n) {
        send_waits_on_channel = true;
        break;
      }
      so += n;
      budget -= n;
      moved = true;
      sent.moved(n);
      if (so < s.bytes) break;  // the channel is full or the rest is not ready
      skipEmpty();
    }
    sent.flush();

    // Receive: copies go straight into place; reductions read the bytes
    // where the channel holds them and fold whole elements into data.
    //
    // Forwarding: when the current send step is chained to this receive
    // step and waits exactly where it stands (the next segment of a ring
    // allreduce or allgather), the bytes are reduced or copied straight into
    // the right link's buffer and copied from there into place, instead of
    // into place and then out again by the send loop. The right link may be
    // full or not support it (TCP): then the plain path runs and the send
    // loop copies as before.
    Publisher<transport::RecvChannel> received(c.left);
    for (size_t budget = chunk; ri < nr && budget > 0;) {
      const RecvStep& r = prog.recvs[ri];
      size_t want = std::min(r.bytes - ro, budget);
      size_t n = 0;
      void* q = nullptr;
      size_t room = 0;
      if (si < ns && prog.sends[si].chained_to == static_cast<int>(ri) &&
          prog.sends[si].data + so == r.data + ro)
        room = c.right->reserve(&q, std::min(want, prog.sends[si].bytes - so));
      const void* p = nullptr;
      if (room) {
        n = c.left->peek(&p, std::min(want, room));
        n -= n % esize;
      }
      if (n) {
        forwardPiece(prog, r, ro, p, static_cast<char*>(q), n, stream, link_stream);
        c.left->consumeDeferred(n);
        c.right->commitDeferred(n);
        so += n;
        sent.moved(n);
      } else if (!r.reduce) {
        n = stream ? c.left->tryRecvStreamingDeferred(r.data + ro, want)
                   : c.left->tryRecvDeferred(r.data + ro, want);
      } else {
        n = c.left->peek(&p, want);
        n -= n % esize;
        if (n) {
          if (r.src && r.src != r.data)
            kernels::reduce3(r.data + ro, r.src + ro, p, n / esize, prog.dtype, prog.op);
          else
            kernels::reduce(r.data + ro, p, n / esize, prog.dtype, prog.op);
          c.left->consumeDeferred(n);
          if (r.scale != 1.0) kernels::scale(r.data + ro, n / esize, prog.dtype, r.scale);
        }
      }
      if (!n) break;
      ro += n;
      budget -= n;
      moved = true;
      received.moved(n);
      if (ro < r.bytes) break;  // nothing more has arrived yet
      skipEmpty();
    }
    received.flush();
    sent.flush();

    skipEmpty();
    if (moved) {
      c.waiter->progressed();
    } else if (si < ns || ri < nr) {
      c.waiter->idle(ticket, send_waits_on_channel, ri < nr);
    }
  }
  if (c.size > 1) {
    c.right->align();
    c.left->align();
  }
  if (tuner) tuner->end(link_stream, nowSeconds() - started, out_bytes);
}

RingComm makeRingComm(const transport::RingLinks& links, transport::Waiter* waiter,
                      const Config& cfg) {
  const auto& T = links.topology();
  RingComm c;
  c.size = T.size;
  c.pos = T.ring_pos;
  c.ring = T.ring;
  c.right = links.right();
  c.left = links.left();
  c.waiter = waiter;
  c.abort = links.abortState();
  c.chunk_bytes = static_cast<size_t>(cfg.chunk_bytes);
  c.timeout_s = cfg.timeout_s;
  c.host = links.host();
  c.tuner = std::make_shared<StoreTuner>(1.3);
  c.tuner_mid = std::make_shared<StoreTuner>(2.0);
  c.stats = std::make_shared<CommStats>();
  return c;
}

}  // namespace collectives
}  // namespace tfring
