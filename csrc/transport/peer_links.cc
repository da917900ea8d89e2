#include "transport/peer_links.h"

#include <unistd.h>

#include <algorithm>
#include <map>

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

std::unique_ptr<PeerLinks> PeerLinks::connect(rendezvous::Store& store, int rank, int size,
                                              const std::vector<std::string>& addrs,
                                              const std::vector<int>& ports, int listen_fd,
                                              const std::string& secret,
                                              const Deadline& deadline,
                                              const std::vector<int>& extra) {
  std::unique_ptr<PeerLinks> P(new PeerLinks());
  std::vector<int> peers = recursivePeers(rank, size);
  peers.insert(peers.end(), extra.begin(), extra.end());
  std::sort(peers.begin(), peers.end());
  peers.erase(std::unique(peers.begin(), peers.end()), peers.end());
  // Connect to every higher peer (handshakes on their own threads), then
  // accept every lower one: no cycle of ranks can wait on each other.
  struct Out {
    int rank, fd;
    std::string name;
    std::unique_ptr<wire::HelloClient> hello;
  };
  std::vector<Out> outs;
  std::map<int, int> fds;  // peer -> connected socket
  auto closeAll = [&]() {
    for (auto& o : outs) {
      o.hello.reset();
      net::closeFd(o.fd);
    }
    for (auto& kv : fds) net::closeFd(kv.second);
  };
  try {
    for (int q : peers) {
      if (q < rank) continue;
      const int qport = ports[q];
      Out o{q, -1, strCat("rank ", q, " at ", addrs[q], ":", qport), nullptr};
      o.fd = net::connectTo(addrs[q], qport, deadline);
      net::setNoDelay(o.fd);
      o.hello.reset(new wire::HelloClient(o.fd, wire::kPurposePeer, rank, secret, deadline,
                                          o.name));
      outs.push_back(std::move(o));
    }
    int lower = 0;
    for (int q : peers) lower += q < rank;
    std::string rejected;
    rendezvous::StoreProbe probe(store);
    while (static_cast<int>(fds.size()) < lower) {
      probe.tick();
      int fd = net::acceptWithDeadline(
          listen_fd, Deadline::in(std::min(0.2, std::max(0.0, deadline.remaining()))));
      bool client_failed = false;
      for (auto& o : outs) client_failed |= o.hello->failed();
      if (fd < 0 && client_failed) break;
      if (fd < 0 && !deadline.expired()) continue;
      if (fd < 0) {
        std::string missing;
        for (int q : peers)
          if (q < rank && !fds.count(q)) missing += strCat(missing.empty() ? "" : ", ", q);
        fail(Code::kTimeout, "timed out waiting for rank(s) ", missing,
             " to open their point-to-point links",
             rejected.empty() ? "" : strCat("; last connection refused: ", rejected));
      }
      int who = -1;
      std::string why;
      const bool ok = wire::acceptHello(fd, wire::kPurposePeer, secret, deadline, &who, &why);
      if (!ok || who >= rank || fds.count(who) ||
          !std::binary_search(peers.begin(), peers.end(), who)) {
        if (why.empty()) why = strCat("a point-to-point link claimed rank ", who, ", unexpected");
        TFRING_LOG(kWarning, "point-to-point link: ", why);
        rejected = why;
        net::closeFd(fd);
        continue;
      }
      net::setNoDelay(fd);
      fds[who] = fd;
    }
    for (auto& o : outs) {
      o.hello->finish();
      o.hello.reset();
      fds[o.rank] = o.fd;
      o.fd = -1;
    }
    outs.clear();
  } catch (...) {
    closeAll();
    throw;
  }
  for (auto& kv : fds) {
    std::unique_ptr<PeerLink> L(new PeerLink());
    L->rank = kv.first;
    const std::string addr = wire::peerAddress(kv.second);
    const int rfd = ::dup(kv.second);
    if (rfd < 0) fail(Code::kInternal, "dup failed for the link to rank ", kv.first);
    L->send.reset(new TcpSendChannel(kv.second, kv.first, addr));
    L->recv.reset(new TcpRecvChannel(rfd, kv.first, addr, 1 << 16));
    L->waiter.reset(new Waiter(nullptr, L->send.get(), L->recv.get()));
    P->links_.push_back(std::move(L));
  }
  return P;
}

PeerLink& PeerLinks::to(int peer) {
  for (auto& l : links_)
    if (l->rank == peer) return *l;
  fail(Code::kInternal, "no point-to-point link to rank ", peer);
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
    if (so < sbytes) {
      size_t n = L.send->trySend(s + so, sbytes - so);
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
      L.waiter->idle(0, so < sbytes, ro < rbytes);
  }
}

}  // namespace transport
}  // namespace tfring
