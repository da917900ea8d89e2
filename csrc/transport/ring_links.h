// RingLinks: who my neighbours are and the channels to them.
//
// Setup, through the store: every rank publishes its host identity, pid and
// TCP listening address. Ranks are grouped by host (which gives local_rank,
// local_size, cross_rank, cross_size) and ordered into a ring host by host,
// so only host boundaries cross TCP. Each ring edge then uses shared memory
// when both ends share a host (unless TFRING_TRANSPORT=tcp) and TCP
// otherwise. Besides the ring, connect() sets up the HostLinks the
// host-aware allreduce algorithms use (transport/host_links.h).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common/env.h"
#include "common/rank_labels.h"
#include "rendezvous/store.h"
#include "transport/channel.h"
#include "transport/host_links.h"
#include "transport/waiter.h"

namespace tfring {
namespace transport {

class ShmSegment;

struct PeerInfo {
  std::string host;
  int pid = 0;
  std::string addr;
  int port = 0;        // the ring listener
  int cross_port = 0;  // the cross ring's listener
  int p2p_port = 0;    // the point-to-point links' listener
};

struct Topology {
  int rank = 0, size = 1;
  int local_rank = 0, local_size = 1;
  int cross_rank = 0, cross_size = 1;
  std::vector<int> ring;  // ring order of ranks
  int ring_pos = 0;
  int left = 0, right = 0;  // ranks of the ring neighbours
  std::vector<PeerInfo> peers;
};

class RingLinks {
 public:
  static std::unique_ptr<RingLinks> connect(rendezvous::Store* store, int rank,
                                            int size, const std::string& secret,
                                            const Config& cfg, AbortState* abort,
                                            RankLabels labels = RankLabels());
  ~RingLinks();

  const Topology& topology() const { return topo_; }
  SendChannel* right() const { return send_.get(); }
  RecvChannel* left() const { return recv_.get(); }
  Doorbell* bell() const;
  std::string transportName() const;
  // Wakes this rank's engine if it sleeps in a Waiter or on the host
  // segment (abort path).
  void wake() const;
  // The host segment, the cross ring and the job-wide algorithm settings.
  HostLinks* host() const { return host_.get(); }
  // The failure state of the communicator these links serve: every wait on
  // them (Waiter, host segment, peer links) ends once it is set.
  AbortState* abortState() const { return abort_; }
  // How messages name the ranks of these links (a process set's: global).
  const RankLabels& labels() const { return labels_; }
  // When each rendezvous phase of connect() ended, for TFRING_LOG_LEVEL=debug:
  // wall-clock seconds (system clock, comparable across processes), and this
  // process's CPU seconds and minor page faults so far (what a phase cost,
  // not only how long it waited).
  struct Phase {
    const char* name;
    double wall, cpu;
    long minflt;
  };
  std::vector<Phase> phases;

 private:
  RingLinks() = default;
  Topology topo_;
  AbortState* abort_ = nullptr;
  RankLabels labels_;
  std::unique_ptr<ShmSegment> self_seg_, right_seg_, left_seg_;
  std::unique_ptr<SendChannel> send_;
  std::unique_ptr<RecvChannel> recv_;
  bool right_shm_ = false, left_shm_ = false;
  std::unique_ptr<HostLinks> host_;
};

// A barrier through the store: every rank sets its key, then waits for all.
void storeBarrier(rendezvous::Store& store, const std::string& name, int rank,
                  int size, double timeout_s);

}  // namespace transport
}  // namespace tfring
