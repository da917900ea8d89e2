// HostWake: how local ranks wake local rank 0 of their host while it sleeps
// in poll() on its TCP links (the host vote, runtime/vote.h): a datagram
// socket in the abstract namespace, bound by local rank 0 and connected to
// by the others at init. A futex cannot be waited on together with
// sockets; this socket can. Nothing is left behind on the file system,
// and the name goes away with the process.
#pragma once

#include <memory>
#include <string>

namespace tfring {
namespace transport {

class HostWake {
 public:
  // Local rank 0 (`owner`) binds `name` (at most 100 bytes are used); the
  // other local ranks connect to it once local rank 0 has bound it.
  static std::unique_ptr<HostWake> open(const std::string& name, bool owner);
  ~HostWake();

  int fd() const { return fd_; }
  // Sends one byte; a full queue already holds a wake-up.
  void ring();
  // Reads every queued byte (local rank 0, after a wake-up).
  void drain();

 private:
  HostWake() = default;
  int fd_ = -1;
};

}  // namespace transport
}  // namespace tfring
