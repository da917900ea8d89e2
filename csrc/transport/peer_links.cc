#include "transport/peer_links.h"

#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <map>

#include "common/abort.h"
#include "common/logging.h"
#include "common/net.h"
#include "common/status.h"
#include "common/wire.h"
#include "transport/tcp/tcp_channel.h"

namespace tfring {
namespace transport {

RecursiveLayout recursiveLayout(int rank, int size) {
  RecursiveLayout L;
  L.size = size;
  while (L.p * 2 <= size) {
    L.p *= 2;
    ++L.log2p;
  }
  L.r = size - L.p;
  if (rank < 2 * L.r) {
    L.fold_peer = rank ^ 1;
    L.vrank = (rank & 1) ? rank / 2 : -1;
  } else {
    L.vrank = rank - L.r;
  }
  return L;
}

std::vector<int> recursivePeers(int rank, int size) {
  const RecursiveLayout L = recursiveLayout(rank, size);
  std::vector<int> out;
  if (L.fold_peer >= 0) out.push_back(L.fold_peer);
  if (L.vrank >= 0)
    for (int m = 1; m < L.p; m <<= 1) out.push_back(L.partner(m));
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

PeerLinks::PeerLinks(int rank, std::vector<int> peers, std::vector<std::string> addrs,
                     std::vector<int> ports, int listen_fd, std::string secret,
                     double timeout_s, AbortState* abort, RankLabels labels)
    : rank_(rank),
      peers_(std::move(peers)),
      addrs_(std::move(addrs)),
      ports_(std::move(ports)),
      listen_fd_(listen_fd),
      secret_(std::move(secret)),
      timeout_s_(timeout_s),
      abort_(abort),
      label_(std::move(labels)) {
  std::sort(peers_.begin(), peers_.end());
  peers_.erase(std::unique(peers_.begin(), peers_.end()), peers_.end());
}

PeerLinks::~PeerLinks() {
  if (listen_fd_ >= 0) net::closeFd(listen_fd_);
}

PeerLink* PeerLinks::find(int peer) {
  for (auto& l : links_)
    if (l->rank == peer) return l.get();
  return nullptr;
}

PeerLink& PeerLinks::add(int peer, int fd) {
  net::setNoDelay(fd);
  std::unique_ptr<PeerLink> L(new PeerLink());
  L->rank = peer;
  const std::string addr = wire::peerAddress(fd);
  const int rfd = ::dup(fd);
  if (rfd < 0) {
    net::closeFd(fd);
    fail(Code::kInternal, "dup failed for the link to rank ", label_(peer));
  }
  L->send.reset(new TcpSendChannel(fd, peer, addr, label_(peer)));
  L->recv.reset(new TcpRecvChannel(rfd, peer, addr, 1 << 16, label_(peer)));
  L->waiter.reset(new Waiter(nullptr, L->send.get(), L->recv.get(), abort_));
  links_.push_back(std::move(L));
  TFRING_LOG(kDebug, "rank ", label_(rank_), ": point-to-point link to rank ", label_(peer),
             " open");
  return *links_.back();
}

void PeerLinks::acceptOne(const Deadline& until) {
  int fd = net::acceptWithDeadline(listen_fd_, until);
  if (fd < 0) return;
  int who = -1;
  std::string why;
  // A connected peer answers at once; a stray connection gets 1 s.
  const bool ok = wire::acceptHello(fd, wire::kPurposePeer, secret_,
                                    Deadline::in(std::min(1.0, timeout_s_)), &who, &why);
  if (!ok || who >= rank_ || find(who) ||
      !std::binary_search(peers_.begin(), peers_.end(), who)) {
    if (why.empty()) why = strCat("a point-to-point link claimed rank ", label_(who), ", unexpected");
    TFRING_LOG(kWarning, "point-to-point link: ", why);
    rejected_ = why;
    net::closeFd(fd);
    return;
  }
  add(who, fd);
}

void PeerLinks::acceptPending() {
  // Only connections already queued on the listener: no wait.
  for (int i = 0; i < 64; ++i) {
    struct pollfd p = {listen_fd_, POLLIN, 0};
    if (::poll(&p, 1, 0) <= 0 || !(p.revents & POLLIN)) return;
    acceptOne(Deadline::in(0));
  }
}

PeerLink& PeerLinks::to(int peer) {
  if (PeerLink* l = find(peer)) return *l;
  if (!std::binary_search(peers_.begin(), peers_.end(), peer))
    fail(Code::kInternal, "no point-to-point link to rank ", label_(peer));
  const Deadline deadline = Deadline::in(timeout_s_);
  if (peer > rank_) {
    // The lower rank of a pair connects; the peer is at the same step.
    const std::string name = strCat("rank ", label_(peer), " at ", addrs_[peer], ":", ports_[peer]);
    const int fd = net::connectInSlices(addrs_[peer], ports_[peer], deadline,
                                        [this] { abort_->check(); });
    try {
      wire::clientHandshake(fd, wire::kPurposePeer, rank_, secret_, deadline, name);
    } catch (...) {
      net::closeFd(fd);
      throw;
    }
    return add(peer, fd);
  }
  while (!find(peer)) {
    abort_->check();
    if (deadline.expired())
      fail(Code::kTimeout, "timed out waiting for rank ", label_(peer),
           " to open its point-to-point link",
           rejected_.empty() ? "" : strCat("; last connection refused: ", rejected_));
    acceptOne(Deadline::in(std::min(0.2, std::max(0.0, deadline.remaining()))));
  }
  return *find(peer);
}

void exchange(PeerLink& L, const void* send, size_t sbytes, void* recv, size_t rbytes,
              const Deadline& deadline, const char* what) {
  const char* s = static_cast<const char*>(send);
  char* r = static_cast<char*>(recv);
  size_t so = 0, ro = 0;
  if (sbytes == 0 && rbytes == 0) return;
  L.waiter->begin(deadline, what);
  while (so < sbytes || ro < rbytes) {
    bool moved = false;
    // Past the lead only once the peer is in this exchange (peer_links.h).
    const size_t allowed = (rbytes == 0 || ro > 0) ? sbytes : std::min(sbytes, kExchangeLead);
    if (so < allowed) {
      size_t n = L.send->trySend(s + so, allowed - so);
      so += n;
      moved |= n > 0;
    }
    if (ro < rbytes) {
      size_t n = L.recv->tryRecv(r + ro, rbytes - ro);
      ro += n;
      moved |= n > 0;
    }
    if (moved)
      L.waiter->progressed();
    else
      L.waiter->idle(0, so < allowed, ro < rbytes);
  }
}

}  // namespace transport
}  // namespace tfring
