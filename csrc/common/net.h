// Thin, checked wrappers over BSD sockets shared by the TCP store and the TCP
// transport. Every blocking call takes a deadline; errors throw tfring::Error
// naming the address involved.
#pragma once

#include <cstddef>
#include <cstdint>
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
// (the server may not be up yet). Throws kTimeout / kUnavailable.
int connectTo(const std::string& host, int port, const Deadline& deadline);

// Full sends/receives on a blocking or non-blocking fd, honouring the
// deadline. recvAll throws kPeerFailure on EOF, naming `peer`.
void sendAll(int fd, const void* data, size_t n, const Deadline& deadline,
             const std::string& peer);
void recvAll(int fd, void* data, size_t n, const Deadline& deadline,
             const std::string& peer);

void setNonBlocking(int fd, bool on);
void setNoDelay(int fd);
void setBufferSizes(int fd, int bytes);
void closeFd(int fd);

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
