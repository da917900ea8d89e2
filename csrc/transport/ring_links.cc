#include "transport/ring_links.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <map>

#include "common/abort.h"
#include "common/logging.h"
#include "common/net.h"
#include "common/wire.h"
#include "transport/shm/shm_channel.h"
#include "transport/tcp/tcp_channel.h"

namespace tfring {
namespace transport {

namespace {

// Bytes of each slot of the host segment: the small threshold, and when the
// job spans hosts at least one pipeline chunk, so the hierarchical allreduce
// moves large buffers in few steps.
uint64_t hostSlotBytes(const HostLinks& H, const Config& cfg) {
  uint64_t b = static_cast<uint64_t>(std::max<int64_t>(H.policy.small_threshold, 4096));
  if (H.num_hosts > 1) b = std::max<uint64_t>(b, static_cast<uint64_t>(cfg.chunk_bytes));
  return b;
}

// A listening socket of connect(), closed when it returns or throws.
struct Listener {
  int fd = -1;
  int port = 0;
  Listener() = default;
  Listener(const Listener&) = delete;
  Listener& operator=(const Listener&) = delete;
  ~Listener() {
    if (fd >= 0) net::closeFd(fd);
  }
};

uint64_t roundUpPow2(uint64_t v) {
  uint64_t p = 8;
  while (p < v) p <<= 1;
  return p;
}

std::vector<std::string> splitBar(const std::string& s) {
  std::vector<std::string> out;
  size_t b = 0;
  for (;;) {
    size_t e = s.find('|', b);
    out.push_back(s.substr(b, e == std::string::npos ? std::string::npos : e - b));
    if (e == std::string::npos) break;
    b = e + 1;
  }
  return out;
}

}  // namespace

void storeBarrier(rendezvous::Store& store, const std::string& name, int rank,
                  int size, double timeout_s) {
  store.setString(strCat("barrier/", name, "/", rank), "1");
  std::vector<std::string> keys;
  for (int r = 0; r < size; ++r) keys.push_back(strCat("barrier/", name, "/", r));
  store.wait(keys, timeout_s);
}

std::unique_ptr<RingLinks> RingLinks::connect(rendezvous::Store* store_ptr, int rank,
                                              int size, const std::string& secret,
                                              const Config& cfg, AbortState* abort,
                                              RankLabels labels) {
  std::unique_ptr<RingLinks> L(new RingLinks());
  L->abort_ = abort;
  L->labels_ = std::move(labels);
  const RankLabels& label = L->labels_;
  Topology& T = L->topo_;
  T.rank = rank;
  T.size = size;
  L->host_.reset(new HostLinks());
  HostLinks& H = *L->host_;
  const JobPolicy own = JobPolicy::of(cfg);  // throws naming a bad value
  H.policy = own;
  H.local_ranks = {rank};
  H.cross_ranks = {rank};
  if (size == 1) {  // a job of one: no store, no links
    T.ring = {0};
    T.peers = {PeerInfo{net::hostIdentity(), static_cast<int>(::getpid()), "127.0.0.1", 0}};
    return L;
  }
  rendezvous::Store& store = *store_ptr;
  const double timeout = cfg.timeout_s;
  Deadline deadline = Deadline::in(timeout);
  auto mark = [&L](const char* phase) {
    struct rusage ru;
    ::getrusage(RUSAGE_SELF, &ru);
    auto secs = [](const timeval& t) { return t.tv_sec + t.tv_usec * 1e-6; };
    L->phases.push_back(RingLinks::Phase{
        phase,
        std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count(),
        secs(ru.ru_utime) + secs(ru.ru_stime), ru.ru_minflt});
  };
  mark("start");

  // 1. Publish who and where I am.
  int port = 0;
  // Listen only on the address the peers are told to use (never on every
  // interface): TFRING_IFACE(_ADDR), loopback on single-host jobs, see
  // net::localAddress.
  const std::string my_addr = net::localAddress();
  int listen_fd = size > 1 ? net::listenOn(my_addr, 0, &port) : -1;
  // The cross ring's and the point-to-point links' listeners open now too,
  // whether or not the topology will want them: their ports then travel in
  // the peer record, and no rank asks the store for them later (at 128
  // ranks, every request waits its turn at a store server that shares the
  // cores with every rank).
  Listener cross_listen, p2p_listen;
  if (size > 1) {
    cross_listen.fd = net::listenOn(my_addr, 0, &cross_listen.port);
    p2p_listen.fd = net::listenOn(my_addr, 0, &p2p_listen.port);
  }
  std::string job;
  if (rank == 0) {
    // Unique per job on this host: names the shared-memory segments.
    char buf[32];
    auto t = static_cast<unsigned long long>(nowSeconds() * 1e6);
    snprintf(buf, sizeof(buf), "%x-%llx", static_cast<unsigned>(::getpid()), t & 0xffffffffffull);
    job = buf;
    // Rank 0's algorithm settings hold for every rank, so a mismatch in the
    // environment cannot make ranks run different algorithms.
    store.setString("job/allreduce", own.encode());
    store.setString("job/id", job);
  } else {
    job = store.getString("job/id", timeout);
  }
  bool host_shm = true;  // TFRING_TRANSPORT=tcp (rank 0's) keeps off shared memory
  {
    const JobPolicy job = JobPolicy::decode(store.getString("job/allreduce", timeout));
    H.policy = job;
    host_shm = job.transport != "tcp";
    if (job.allgather_algo != own.allgather_algo || job.broadcast_algo != own.broadcast_algo)
      TFRING_LOG(kWarning, "rank ", label(rank), ": using rank ", label(0),
                 "'s TFRING_ALLGATHER_ALGO=",
                 job.allgather_algo, " and TFRING_BROADCAST_ALGO=", job.broadcast_algo,
                 " instead of this rank's ", own.allgather_algo, " and ", own.broadcast_algo);
    if (job.vote_algo != own.vote_algo)
      TFRING_LOG(kWarning, "rank ", label(rank), ": using rank ", label(0),
                 "'s TFRING_VOTE_ALGO=", job.vote_algo,
                 " instead of this rank's ", own.vote_algo);
    if (job.fusion_threshold != own.fusion_threshold ||
        job.cycle_time_ms != own.cycle_time_ms)
      TFRING_LOG(kWarning, "rank ", label(rank), ": using rank ", label(0),
                 "'s TFRING_FUSION_THRESHOLD=",
                 job.fusion_threshold, " and TFRING_CYCLE_TIME=", job.cycle_time_ms,
                 " instead of this rank's ", own.fusion_threshold, " and ",
                 own.cycle_time_ms);
    if (job.allreduce_algo != own.allreduce_algo ||
        job.small_threshold != own.small_threshold)
      TFRING_LOG(kWarning, "rank ", label(rank), ": using rank ", label(0),
                 "'s TFRING_ALLREDUCE_ALGO=",
                 job.allreduce_algo, " and TFRING_SMALL_THRESHOLD=", job.small_threshold,
                 " instead of this rank's ", own.allreduce_algo, " and ",
                 own.small_threshold);
  }
  store.setString(strCat("peer/", rank),
                  strCat(net::hostIdentity(), "|", ::getpid(), "|", my_addr, "|", port, "|",
                         cross_listen.port, "|", p2p_listen.port));
  // Most ranks have a left neighbour on their own host, and creating the
  // inbox (zeroing and mapping its pages, about 2.5 ms for 4 MiB) is the
  // largest piece of CPU work in a rank's start-up. Made now, it overlaps
  // the wait for the last rank to arrive instead of following it, where
  // on a crowded host every rank's share adds up. It has no name until
  // step 3 keeps it (a rank killed while it waits leaves nothing in
  // /dev/shm); step 3 may also shrink it to a bell or drop it, once the
  // table says who the left is.
  const bool force_tcp = cfg.transport == "tcp";
  const uint64_t inbox_bytes = roundUpPow2(static_cast<uint64_t>(cfg.shm_buffer_bytes));
  if (!force_tcp) L->self_seg_ = ShmSegment::createUnnamed(job, rank, inbox_bytes);
  T.peers.resize(size);
  // Every record in one request: after the last rank arrives, each rank is
  // one store round trip from the full table, not N.
  std::vector<std::string> peer_keys;
  for (int r = 0; r < size; ++r) peer_keys.push_back(strCat("peer/", r));
  const std::vector<rendezvous::Bytes> records = store.getMany(peer_keys, timeout);
  for (int r = 0; r < size; ++r) {
    auto f = splitBar(std::string(records[r].begin(), records[r].end()));
    if (f.size() != 6) fail(Code::kInternal, "malformed peer record for rank ", label(r));
    T.peers[r] = PeerInfo{f[0], std::stoi(f[1]), f[2], std::stoi(f[3]), std::stoi(f[4]),
                          std::stoi(f[5])};
  }

  mark("peer records");

  // 2. Group by host, in order of each host's first rank.
  std::vector<std::string> hosts;
  std::map<std::string, std::vector<int>> by_host;
  for (int r = 0; r < size; ++r) {
    const auto& h = T.peers[r].host;
    if (!by_host.count(h)) hosts.push_back(h);
    by_host[h].push_back(r);
  }
  const auto& mine = by_host[T.peers[rank].host];
  T.local_size = static_cast<int>(mine.size());
  T.local_rank = static_cast<int>(std::find(mine.begin(), mine.end(), rank) - mine.begin());
  // cross_rank: my index among the hosts that have a rank with my local_rank.
  T.cross_size = 0;
  for (const auto& h : hosts) {
    if (static_cast<int>(by_host[h].size()) > T.local_rank) {
      if (h == T.peers[rank].host) T.cross_rank = T.cross_size;
      ++T.cross_size;
    }
  }
  for (const auto& h : hosts)
    for (int r : by_host[h]) T.ring.push_back(r);
  T.ring_pos = static_cast<int>(std::find(T.ring.begin(), T.ring.end(), rank) - T.ring.begin());
  T.left = T.ring[(T.ring_pos + size - 1) % size];
  T.right = T.ring[(T.ring_pos + 1) % size];

  H.num_hosts = static_cast<int>(hosts.size());
  H.local_rank = T.local_rank;
  H.local_size = T.local_size;
  H.local_ranks = mine;
  size_t most_local = 0;
  for (const auto& h : hosts) {
    if (by_host[h].size() != mine.size()) H.uniform = false;
    most_local = std::max(most_local, by_host[h].size());
    H.leaders.push_back(by_host[h][0]);
  }
  H.cross_rank = T.cross_rank;
  H.cross_ranks.clear();
  if (H.uniform)
    for (const auto& h : hosts) H.cross_ranks.push_back(by_host[h][T.local_rank]);

  // The vote's algorithm (runtime/vote.h). The host vote needs several
  // hosts, shared memory, and some host with more than one rank; auto
  // takes it where it would take recdbl. Forced where it cannot run, it
  // is recdbl. Only job-wide values decide (host_shm is rank 0's).
  const bool host_vote_ok = H.num_hosts > 1 && host_shm && most_local > 1;
  H.vote_host = host_vote_ok &&
                (H.policy.vote_algo == "host" ||
                 (H.policy.vote_algo == "auto" && size >= kVoteRecdblMinRanks));
  L->right_shm_ = !force_tcp && T.peers[T.right].host == T.peers[rank].host;
  L->left_shm_ = !force_tcp && T.peers[T.left].host == T.peers[rank].host;

  // 3. Shared memory: my segment carries my bell and, if my left neighbour
  // is local, my inbox (made in step 1).
  if (!L->left_shm_) {
    L->self_seg_.reset();
    if (L->right_shm_) L->self_seg_ = ShmSegment::create(job, rank, 8);
  } else if (L->self_seg_) {
    L->self_seg_->publish();
  } else {
    L->self_seg_ = ShmSegment::create(job, rank, inbox_bytes);  // no O_TMPFILE here
  }
  store.setString(strCat("shm/", rank), L->self_seg_ ? "1" : "0");

  // 3b. The host segment: local rank 0 creates it, the others open it once
  // it is published; unlinked after the barrier below.
  const std::string host_seg_name = strCat("/tfring-", job, "-host", mine[0]);
  const std::string wake_name = strCat("tfring-", job, "-wake", mine[0]);
  if (T.local_size > 1 && host_shm) {
    if (T.local_rank == 0) {
      H.segment = HostSegment::create(host_seg_name, T.local_size, hostSlotBytes(H, cfg),
                                      H.vote_host ? kHostVoteSlotBytes : 0);
      H.segment->setAbort(abort);
      H.segment->setLabels(label);
      if (H.vote_host) H.wake = HostWake::open(wake_name, true);
      store.setString(strCat("hostseg/", rank), "1");
    } else {
      store.wait({strCat("hostseg/", mine[0])}, deadline.remaining());
      H.segment = HostSegment::open(host_seg_name, T.local_size);
      H.segment->setAbort(abort);
      H.segment->setLabels(label);
      H.segment->words(T.local_rank).pid = static_cast<int32_t>(::getpid());
      if (H.vote_host) H.wake = HostWake::open(wake_name, false);
    }
  }

  mark("host segment");

  // 3c. Map the neighbours' segments now, and say so: the wait before the
  // unlink at the end then finds every mapping long done, instead of
  // waiting for the slowest local rank to finish its TCP links.
  {
    std::vector<std::string> segs;
    if (L->right_shm_) segs.push_back(strCat("shm/", T.right));
    if (L->left_shm_ && T.left != T.right) segs.push_back(strCat("shm/", T.left));
    if (!segs.empty()) store.wait(segs, deadline.remaining());
  }
  if (L->right_shm_) L->right_seg_ = ShmSegment::open(job, T.right, false, label(T.right));
  if (L->left_shm_) {
    if (T.left == T.right && L->right_seg_)
      L->left_seg_ = nullptr;  // same segment as right_seg_
    else
      L->left_seg_ = ShmSegment::open(job, T.left, /*header_only=*/true, label(T.left));
  }
  store.setString(strCat("mapped/", rank), "1");

  // 3d. The cross ring: with every host holding the same number of ranks,
  // the ranks with my local rank form a TCP ring in host order.
  const bool want_cross = H.num_hosts > 1 && H.uniform;

  // 4. TCP: connect to the right, accept from the left. The outgoing
  // handshake (common/wire.h) runs on its own thread while we accept, so no
  // ring of ranks can wait on each other in a cycle.
  int right_fd = -1, left_fd = -1;
  std::string right_name = strCat("rank ", label(T.right), " at ", T.peers[T.right].addr, ":",
                                  T.peers[T.right].port);
  std::unique_ptr<wire::HelloClient> right_hello;
  if (!L->right_shm_) {
    right_fd = net::connectTo(T.peers[T.right].addr, T.peers[T.right].port, deadline);
    net::setNoDelay(right_fd);
    net::setBufferSizes(right_fd, 4 << 20);
    right_hello.reset(new wire::HelloClient(right_fd, wire::kPurposeRing, rank, secret,
                                            deadline, right_name));
  }
  if (!L->left_shm_) {
    std::string rejected;
    rendezvous::StoreProbe probe(store);
    while (left_fd < 0) {
      probe.tick();
      // Wake up now and then: if our own connection to the right was
      // refused (say, a wrong secret), report that instead of waiting on.
      int fd = net::acceptWithDeadline(
          listen_fd, Deadline::in(std::min(0.2, std::max(0.0, deadline.remaining()))));
      if (fd < 0 && right_hello && right_hello->failed()) break;
      if (fd < 0 && !deadline.expired()) continue;
      if (fd < 0)
        fail(Code::kTimeout, "timed out waiting for rank ", label(T.left),
             " (left ring neighbour) to connect",
             rejected.empty() ? "" : strCat("; last connection refused: ", rejected));
      int who = -1;
      std::string why;
      if (!wire::acceptHello(fd, wire::kPurposeRing, secret, deadline, &who, &why) ||
          who != T.left) {
        if (why.empty())
          why = strCat("a ring connection claimed rank ", label(who), ", expected ", label(T.left));
        TFRING_LOG(kWarning, "ring link: ", why);
        rejected = why;
        net::closeFd(fd);
        continue;
      }
      left_fd = fd;
    }
    if (left_fd >= 0) {
      net::setNoDelay(left_fd);
      net::setBufferSizes(left_fd, 4 << 20);
    }
  }
  if (right_hello) {
    try {
      right_hello->finish();
    } catch (...) {
      net::closeFd(right_fd);
      if (left_fd >= 0) net::closeFd(left_fd);
      if (listen_fd >= 0) net::closeFd(listen_fd);
      throw;
    }
  }
  if (listen_fd >= 0) net::closeFd(listen_fd);

  mark("ring links");

  // 4b. Cross ring links, the same way: connect right, accept left; opened
  // when the hierarchical allreduce first runs (HostLinks::openCross), as
  // the point-to-point links are: every rank of the job runs it together,
  // so each cross ring closes then, and a job that never reduces across
  // hosts this way (small tensors ride in the vote) never opens it.
  if (want_cross) {
    const int nh = H.num_hosts;
    const int xr = H.cross_ranks[(H.cross_rank + 1) % nh];
    const int xl = H.cross_ranks[(H.cross_rank + nh - 1) % nh];
    const std::string xaddr = T.peers[xr].addr;
    const int xport = T.peers[xr].cross_port;
    const std::string xl_addr = T.peers[xl].addr;
    auto listener = std::make_shared<Listener>();
    listener->fd = cross_listen.fd;
    cross_listen.fd = -1;
    const double timeout_s = cfg.timeout_s;
    HostLinks* hp = &H;
    H.open_cross = [=]() {
      HostLinks& H = *hp;
      const Deadline deadline = Deadline::in(timeout_s);
      std::string xr_name = strCat("rank ", label(xr), " at ", xaddr, ":", xport);
      const int xr_fd = net::connectInSlices(xaddr, xport, deadline,
                                             [abort] { abort->check(); });
      net::setNoDelay(xr_fd);
      net::setBufferSizes(xr_fd, 4 << 20);
      auto xr_hello = std::make_unique<wire::HelloClient>(xr_fd, wire::kPurposeCross, rank,
                                                          secret, deadline, xr_name);
      // Giving up: the handshake's thread ends before its socket closes.
      auto abandon = [&]() {
        xr_hello.reset();
        net::closeFd(xr_fd);
      };
      int xl_fd = -1;
      std::string rejected;
      while (xl_fd < 0) {
        if (abort->aborted()) {
          abandon();
          abort->check();
        }
        int fd = net::acceptWithDeadline(
            listener->fd, Deadline::in(std::min(0.2, std::max(0.0, deadline.remaining()))));
        if (fd < 0 && xr_hello->failed()) break;
        if (fd < 0 && !deadline.expired()) continue;
        if (fd < 0) {
          abandon();
          fail(Code::kTimeout, "timed out waiting for rank ", label(xl),
               " (left cross-host neighbour) to connect",
               rejected.empty() ? "" : strCat("; last connection refused: ", rejected));
        }
        int who = -1;
        std::string why;
        if (!wire::acceptHello(fd, wire::kPurposeCross, secret, deadline, &who, &why) ||
            who != xl) {
          if (why.empty())
            why = strCat("a cross-host connection claimed rank ", label(who), ", expected ",
                         label(xl));
          TFRING_LOG(kWarning, "cross-host link: ", why);
          rejected = why;
          net::closeFd(fd);
          continue;
        }
        xl_fd = fd;
      }
      try {
        xr_hello->finish();
      } catch (...) {
        net::closeFd(xr_fd);
        if (xl_fd >= 0) net::closeFd(xl_fd);
        throw;
      }
      net::setNoDelay(xl_fd);
      net::setBufferSizes(xl_fd, 4 << 20);
      H.cross_send.reset(new TcpSendChannel(xr_fd, xr, strCat(xaddr, ":", xport), label(xr)));
      H.cross_recv.reset(new TcpRecvChannel(xl_fd, xl, xl_addr, 1 << 20, label(xl)));
      H.cross_waiter.reset(new Waiter(nullptr, H.cross_send.get(), H.cross_recv.get(), abort));
      TFRING_LOG(kDebug, "rank ", label(rank), ": cross-host ring open");
    };
  }
  mark("cross ring");

  // 4c. Point-to-point links for the recursive allreduces, the
  // recursive-doubling allgather and the tree broadcast: at most
  // log2(size) + 1 per rank (transport/peer_links.h), opened only where
  // one of them is forced or auto may pick one (the rule of
  // collectives::recursiveAtScale: 8+ ranks on 4+ hosts, or on hosts the
  // host-aware schemes cannot serve). Every rank decides alike.
  const bool cross_ok = H.num_hosts > 1 && H.uniform && (T.local_size == 1 || host_shm);
  // The agreement round's vote uses the same links (runtime/vote.h).
  // auto: where the ring crosses TCP (several hosts, or TFRING_TRANSPORT=
  // tcp); a ring through shared memory on one host stays faster.
  const JobPolicy& pol = H.policy;
  H.vote_recdbl = H.vote_host || pol.vote_algo == "recdbl" || pol.vote_algo == "host" ||
                  (pol.vote_algo == "auto" && size >= kVoteRecdblMinRanks &&
                   (H.num_hosts > 1 || !host_shm));
  const bool want_peers =
      H.vote_recdbl || pol.allreduce_algo == "recdbl" || pol.allreduce_algo == "rabenseifner" ||
      pol.allgather_algo == "recdbl" || pol.broadcast_algo == "tree" ||
      pol.broadcast_algo == "scatter_allgather" ||
      (pol.allreduce_algo == "auto" && size >= 8 && H.num_hosts > 1 &&
       (H.num_hosts >= 4 || !cross_ok));
  if (want_peers) {
    std::vector<std::string> addrs;
    std::vector<int> ports;
    for (const auto& p : T.peers) {
      addrs.push_back(p.addr);
      ports.push_back(p.p2p_port);
    }
    // The host vote's local ranks 0 link to their partners among the hosts.
    std::vector<int> extra;
    if (H.vote_host && T.local_rank == 0)
      for (int h : recursivePeers(H.cross_rank, H.num_hosts)) extra.push_back(H.leaders[h]);
    std::vector<int> peers = recursivePeers(rank, size);
    peers.insert(peers.end(), extra.begin(), extra.end());
    // Nothing connects here: each link opens when first used. The
    // listener stays open for them (owned by the links from now on).
    H.want_peers = true;
    H.peer_links.reset(new PeerLinks(rank, std::move(peers), std::move(addrs), std::move(ports),
                                     p2p_listen.fd, secret, cfg.timeout_s, abort,
                                     label));
    p2p_listen.fd = -1;
  }

  mark("peer links");

  // 5. Unlink my segment and the host segment only once everyone who maps
  // them has: my shared-memory ring neighbours and my host's ranks. Only
  // they wait for each other; a job-wide barrier here woke all N ranks at
  // once when the slowest arrived, the costliest step of start-up at 128
  // ranks on a small machine.
  std::vector<std::string> mapped;
  if (L->left_shm_) mapped.push_back(strCat("mapped/", T.left));
  if (L->right_shm_) mapped.push_back(strCat("mapped/", T.right));
  if (H.segment)
    for (int r : mine) mapped.push_back(strCat("mapped/", r));
  if (!mapped.empty()) store.wait(mapped, deadline.remaining());
  mark("barrier");
  if (L->self_seg_) L->self_seg_->unlink();
  if (H.segment) H.segment->unlink();

  std::string left_addr = strCat(T.peers[T.left].addr, ":", T.peers[T.left].port);
  if (L->right_shm_)
    L->send_.reset(new ShmSendChannel(L->right_seg_.get(), T.right, label(T.right)));
  else
    L->send_.reset(new TcpSendChannel(right_fd, T.right,
                                      strCat(T.peers[T.right].addr, ":", T.peers[T.right].port),
                                      label(T.right)));
  if (L->left_shm_) {
    ShmSegment* left_seg = L->left_seg_ ? L->left_seg_.get() : L->right_seg_.get();
    L->recv_.reset(new ShmRecvChannel(L->self_seg_.get(), left_seg, T.left, label(T.left)));
  } else {
    L->recv_.reset(new TcpRecvChannel(left_fd, T.left, left_addr, 1 << 20, label(T.left)));
  }
  return L;
}

RingLinks::~RingLinks() = default;

Doorbell* RingLinks::bell() const {
  return self_seg_ ? &self_seg_->header()->bell : nullptr;
}

void RingLinks::wake() const {
  if (self_seg_) self_seg_->header()->bell.ring();
  if (host_ && host_->segment) host_->segment->wake();
}

std::string RingLinks::transportName() const {
  if (topo_.size == 1) return "local";
  if (right_shm_ && left_shm_) return "shm";
  if (!right_shm_ && !left_shm_) return "tcp";
  return "shm+tcp";
}

}  // namespace transport
}  // namespace tfring
