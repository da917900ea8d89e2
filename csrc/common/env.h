// Config: the core's tunables (common/tunables.h declares each variable, its
// default and range) resolved into one struct.
#pragma once

#include <cstdint>
#include <string>

namespace tfring {

// The resolved configuration of one process; read once at init so a run
// cannot change behaviour half-way through. The defaults below are the
// table's (tunables.cc), restated for a Config built without fromEnv.
struct Config {
  int64_t fusion_threshold = 64ll << 20;  // TFRING_FUSION_THRESHOLD
  double cycle_time_ms = 2.0;             // TFRING_CYCLE_TIME
  double timeout_s = 300.0;               // TFRING_TIMEOUT
  double stall_warning_s = 60.0;          // TFRING_STALL_CHECK_TIME
  double heartbeat_timeout_s = 10.0;      // TFRING_HEARTBEAT_TIMEOUT
  int64_t chunk_bytes = 512ll << 10;      // TFRING_CHUNK_SIZE (pipeline unit)
  int64_t shm_buffer_bytes = 4ll << 20;   // TFRING_SHM_BUFFER (per link)
  std::string transport = "auto";         // TFRING_TRANSPORT: auto|shm|tcp
  std::string spin = "auto";              // TFRING_SPIN: auto|0|1 (busy-wait before sleeping)
  std::string timeline;                   // TFRING_TIMELINE: path or empty
  std::string iface_addr;                 // TFRING_IFACE_ADDR: address to bind
  int log_level = 1;                      // TFRING_LOG_LEVEL: 0 debug..3 error
  bool cache_enabled = true;              // TFRING_CACHE (0 disables)
  // Allreduce algorithm: auto|ring|oneshot|hier (collectives/allreduce.h).
  // Rank 0's value, and rank 0's threshold, are used by every rank.
  std::string allreduce_algo = "auto";    // TFRING_ALLREDUCE_ALGO
  int64_t vote_data_bytes = 4096;         // TFRING_VOTE_DATA: small allreduces carried by the vote (0: off)
  // Allgather auto|ring|recdbl, broadcast auto|ring|tree|scatter_allgather
  // (collectives/allgather.h, broadcast.h); rank 0's values hold.
  std::string allgather_algo = "auto";    // TFRING_ALLGATHER_ALGO
  std::string broadcast_algo = "auto";    // TFRING_BROADCAST_ALGO
  // auto: buffers of at most this many bytes take the one-shot (one host) or
  // the small cross-host scheme; also sizes the host's shared segment. The
  // default is where the one-shot stops beating the ring at 2 ranks in
  // benchmarks/algo_bench.py (between 16 and 64 KiB; at 4 ranks it wins up
  // to 256 KiB).
  int64_t small_threshold = 32ll << 10;   // TFRING_SMALL_THRESHOLD
  // The agreement round's vote: auto|ring|recdbl (runtime/vote.h). Rank
  // 0's value is used by every rank.
  std::string vote_algo = "auto";         // TFRING_VOTE_ALGO
  // Processes of this job on this host, for the spin decisions of an
  // engine whose ring spans only some of them (a process set); 0: the
  // ring's own local size. Not read from the environment.
  int host_procs = 0;

  // Reads every field through the tunables table (overrides given to init,
  // then the environment); a bad value throws InvalidArgument naming it.
  static Config fromEnv();
};

// Job-wide policy: the settings every rank must share because they decide
// which algorithm runs and how tensors are fused, so rank 0's values hold
// for the whole job. Agreed through the store when the ring connects
// (transport/ring_links.cc: the links it opens depend on them), then read
// by the collectives' algorithm choice and the engine's fusion.
struct JobPolicy {
  std::string allreduce_algo = "auto";  // TFRING_ALLREDUCE_ALGO
  std::string allgather_algo = "auto";  // TFRING_ALLGATHER_ALGO
  std::string broadcast_algo = "auto";  // TFRING_BROADCAST_ALGO
  std::string vote_algo = "auto";       // TFRING_VOTE_ALGO
  int64_t small_threshold = 32ll << 10; // TFRING_SMALL_THRESHOLD
  int64_t fusion_threshold = 64ll << 20;  // TFRING_FUSION_THRESHOLD
  double cycle_time_ms = 2.0;           // TFRING_CYCLE_TIME
  std::string transport = "auto";       // TFRING_TRANSPORT: tcp keeps hosts off shared memory

  // This rank's values; throws naming the variable when one is not valid.
  static JobPolicy of(const Config& c);
  // The form rank 0 publishes, and its inverse (which checks every value).
  std::string encode() const;
  static JobPolicy decode(const std::string& text);
};

}  // namespace tfring
