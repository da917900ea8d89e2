// Point-to-point channels between ring neighbours. A rank owns exactly one
// SendChannel (to its right neighbour) and one RecvChannel (from its left
// neighbour); every collective is written against these two and nothing
// else, so shared memory and TCP plug in underneath without the algorithms
// knowing which one they run on.
//
// All calls are non-blocking: they move what they can and return how much.
// A collective drives both channels from one progress loop and, when neither
// moved, sleeps in a Waiter (waiter.h) until a peer makes progress possible.
#pragma once

#include <cstddef>
#include <string>

namespace tfring {
namespace transport {

class SendChannel {
 public:
  virtual ~SendChannel() = default;
  // Queues up to n bytes for the peer; returns how many were taken.
  virtual size_t trySend(const void* data, size_t n) = 0;
  // trySend whose bytes the peer may only see at the next flush(): a
  // progress loop moving many small pieces publishes them (and wakes the
  // peer) once per pass instead of once per piece. By default the same as
  // trySend.
  virtual size_t trySendDeferred(const void* data, size_t n) { return trySend(data, n); }
  // trySendDeferred for the bulk of a large collective: shared memory
  // copies in with streaming stores (kernels/cpu/copy.h), so the peer reads
  // the bytes from memory rather than out of this core's cache.
  virtual size_t trySendStreamingDeferred(const void* data, size_t n) {
    return trySendDeferred(data, n);
  }
  // Zero-copy view of up to `max` contiguous free bytes where the peer will
  // read them, for a producer that writes its bytes in place (a ring step
  // that reduces straight into the link) instead of copying them in. 0 when
  // there is no room, and always 0 on channels with no such buffer (TCP).
  // commitDeferred(n) then queues the first n bytes written there, shown to
  // the peer at the next flush().
  virtual size_t reserve(void** data, size_t max) {
    (void)data;
    (void)max;
    return 0;
  }
  virtual void commitDeferred(size_t n) { (void)n; }
  virtual void flush() {}
  // Called by both ends at the same point of the stream (the end of every
  // collective): the next message starts 8-byte aligned in the stream, so a
  // receiver can always view whole elements of any dtype.
  virtual void align() = 0;
  // fd to poll for POLLOUT, or -1 when readiness comes through the doorbell.
  virtual int pollFd() const { return -1; }
  // Throws kPeerFailure naming the peer if it is known to be gone.
  virtual void checkPeer() {}
  virtual std::string describe() const = 0;
};

class RecvChannel {
 public:
  virtual ~RecvChannel() = default;
  // Copies up to n received bytes out; returns how many.
  virtual size_t tryRecv(void* data, size_t n) = 0;
  // Zero-copy view of up to `max` contiguous received bytes (fewer, or 0,
  // when that is all there is). The bytes stay valid until consume().
  virtual size_t peek(const void** data, size_t max) = 0;
  virtual void consume(size_t n) = 0;
  // consume / tryRecv whose freed space the producer may only reuse after
  // the next flush() (see SendChannel::trySendDeferred).
  virtual void consumeDeferred(size_t n) { consume(n); }
  virtual size_t tryRecvDeferred(void* data, size_t n) { return tryRecv(data, n); }
  // tryRecvDeferred into a destination that should not stay in the cache
  // (kernels/cpu/copy.h): shared memory copies out with streaming stores.
  virtual size_t tryRecvStreamingDeferred(void* data, size_t n) { return tryRecvDeferred(data, n); }
  virtual void flush() {}
  virtual void align() = 0;
  virtual int pollFd() const { return -1; }
  virtual void checkPeer() {}
  virtual std::string describe() const = 0;
};

}  // namespace transport
}  // namespace tfring
