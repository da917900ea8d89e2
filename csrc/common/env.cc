#include "common/env.h"

#include "common/tunables.h"

namespace tfring {

Config Config::fromEnv() {
  namespace t = tunables;
  Config c;
  c.fusion_threshold = t::getInt("TFRING_FUSION_THRESHOLD");
  c.cycle_time_ms = t::getDouble("TFRING_CYCLE_TIME");
  c.timeout_s = t::getDouble("TFRING_TIMEOUT");
  c.stall_warning_s = t::getDouble("TFRING_STALL_CHECK_TIME");
  c.heartbeat_timeout_s = t::getDouble("TFRING_HEARTBEAT_TIMEOUT");
  c.chunk_bytes = t::getInt("TFRING_CHUNK_SIZE");
  c.shm_buffer_bytes = t::getInt("TFRING_SHM_BUFFER");
  c.transport = t::getString("TFRING_TRANSPORT");
  c.spin = t::getString("TFRING_SPIN");
  c.timeline = t::getString("TFRING_TIMELINE");
  c.iface_addr = t::getString("TFRING_IFACE_ADDR");
  c.log_level = static_cast<int>(t::getInt("TFRING_LOG_LEVEL"));
  c.cache_enabled = t::getBool("TFRING_CACHE");
  c.allreduce_algo = t::getString("TFRING_ALLREDUCE_ALGO");
  c.vote_data_bytes = t::getInt("TFRING_VOTE_DATA");
  c.allgather_algo = t::getString("TFRING_ALLGATHER_ALGO");
  c.broadcast_algo = t::getString("TFRING_BROADCAST_ALGO");
  c.small_threshold = t::getInt("TFRING_SMALL_THRESHOLD");
  c.vote_algo = t::getString("TFRING_VOTE_ALGO");
  return c;
}

}  // namespace tfring
