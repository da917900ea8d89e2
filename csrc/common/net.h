// Thin, checked wrappers over BSD sockets shared by the TCP store and the TCP
// transport. Every blocking call takes a deadline; errors throw tfring::Error
// naming the address involved.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "common/clock.h"

namespace tfring {
namespace net {

// Listens on host:port (port 0 picks a free one; host "" or "0.0.0.0" binds
// all interfaces). Returns the listening fd (non-blocking; accepted fds are
// blocking) and writes the bound port.
int listenOn(const std::string& host, int port, int* bound_port, int backlog = 128);

// Accepts one connection, waiting until the deadline. Returns -1 on timeout.
int acceptWithDeadline(int listen_fd, const Deadline& deadline);

// Connects to host:port, retrying refused connections until the deadline
// (the server may not be up yet). Throws kTimeout / kUnavailable, or
// kPeerFailure once the host has not answered at all (no SYN-ACK, host
// unreachable) for 80% of TFRING_HEARTBEAT_TIMEOUT: it is down or cut off.
int connectTo(const std::string& host, int port, const Deadline& deadline);

// connectTo in slices of at most 1 s, calling `between` before each: it
// throws to stop early (the job failed, the caller gave up), so a peer that
// is gone does not hold the caller until the deadline.
int connectInSlices(const std::string& host, int port, const Deadline& deadline,
                    const std::function<void()>& between);

// Full sends/receives on a blocking or non-blocking fd, honouring the
// deadline. recvAll throws kPeerFailure on EOF, naming `peer`.
void sendAll(int fd, const void* data, size_t n, const Deadline& deadline,
             const std::string& peer);
void recvAll(int fd, void* data, size_t n, const Deadline& deadline,
             const std::string& peer);

// Liveness of a TCP connection whose peer host may vanish without closing it
// (power loss, cut link): keepalive probes on an idle connection and
// TCP_USER_TIMEOUT on one with unacknowledged data in flight (where keepalive
// does not apply) both give up after about `timeout_s` seconds (at most
// 0.8 * timeout_s, at least 2 s); the next send/recv/poll then fails with
// ETIMEDOUT. A live peer that is merely slow or stopped still acknowledges
// at the TCP level and is never dropped. No-op on non-TCP sockets.
void setLiveness(int fd, double timeout_s);
// setLiveness with TFRING_HEARTBEAT_TIMEOUT (default 10 s); connectTo and
// acceptWithDeadline apply it to every connection they return.
void setDefaultLiveness(int fd);

// ETIMEDOUT and the unreachable errors: the peer host went silent.
bool isSilentPeerError(int err);

void setNonBlocking(int fd, bool on);
void setNoDelay(int fd);
void setBufferSizes(int fd, int bytes);
void closeFd(int fd);
// Raises this process's soft limit on open files towards `wanted` (never
// above the hard limit, never lowering it): rank 0 holds a coordinator
// connection per rank and the store server one per client, which passes
// the common soft limit of 1024 from about 1000 ranks.
void raiseFdLimit(long wanted);

// The address other hosts should use to reach this one, which is also the
// address every listening socket binds to: TFRING_IFACE_ADDR if set, else the
// IPv4 address of the interface named by TFRING_IFACE, else 127.0.0.1 when
// the launcher says every rank is on this host, else the address of the
// interface routing to `towards` (a peer address), else the first
// non-loopback IPv4 address, else 127.0.0.1.
std::string localAddress(const std::string& towards = "");

// TFRING_IFACE_ADDR, else the IPv4 address of interface TFRING_IFACE, else
// "". Throws naming the interface if TFRING_IFACE has no IPv4 address.
std::string ifaceAddress();

// True when the launcher's environment (tfring-run's TFRING_LOCAL_SIZE,
// Open MPI's OMPI_COMM_WORLD_LOCAL_SIZE) puts every rank on this host.
bool singleHostJob();

// A stable identity of this host for grouping ranks into local groups:
// TFRING_HOSTNAME if set, else the hostname plus the boot id.
std::string hostIdentity();

// Constant-time comparison for secrets.
bool secretsEqual(const std::string& a, const std::string& b);

}  // namespace net
}  // namespace tfring
