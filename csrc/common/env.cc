#include "common/env.h"

#include <cctype>
#include <cstdlib>

namespace tfring {
namespace env {

bool isSet(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0';
}

std::string getString(const char* name, const std::string& dflt) {
  const char* v = std::getenv(name);
  return (v && *v) ? std::string(v) : dflt;
}

int64_t getInt(const char* name, int64_t dflt) {
  const char* v = std::getenv(name);
  if (!v || !*v) return dflt;
  char* end = nullptr;
  long long r = std::strtoll(v, &end, 10);
  return (end && *end == '\0') ? r : dflt;
}

double getDouble(const char* name, double dflt) {
  const char* v = std::getenv(name);
  if (!v || !*v) return dflt;
  char* end = nullptr;
  double r = std::strtod(v, &end);
  return (end && *end == '\0') ? r : dflt;
}

int64_t parseBytes(const std::string& s, int64_t dflt) {
  if (s.empty()) return dflt;
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  if (end == s.c_str() || v < 0) return dflt;
  std::string unit;
  for (const char* p = end; *p; ++p)
    if (!std::isspace(static_cast<unsigned char>(*p)))
      unit += static_cast<char>(std::toupper(static_cast<unsigned char>(*p)));
  double mult = 1;
  if (unit.empty() || unit == "B") mult = 1;
  else if (unit == "K" || unit == "KB" || unit == "KIB") mult = 1024.0;
  else if (unit == "M" || unit == "MB" || unit == "MIB") mult = 1024.0 * 1024;
  else if (unit == "G" || unit == "GB" || unit == "GIB") mult = 1024.0 * 1024 * 1024;
  else return dflt;
  return static_cast<int64_t>(v * mult);
}

}  // namespace env

Config Config::fromEnv() {
  Config c;
  c.fusion_threshold = env::parseBytes(env::getString("TFRING_FUSION_THRESHOLD", ""), c.fusion_threshold);
  c.cycle_time_ms = env::getDouble("TFRING_CYCLE_TIME", c.cycle_time_ms);
  c.timeout_s = env::getDouble("TFRING_TIMEOUT", c.timeout_s);
  c.stall_warning_s = env::getDouble("TFRING_STALL_CHECK_TIME", c.stall_warning_s);
  c.heartbeat_timeout_s = env::getDouble("TFRING_HEARTBEAT_TIMEOUT", c.heartbeat_timeout_s);
  c.chunk_bytes = env::parseBytes(env::getString("TFRING_CHUNK_SIZE", ""), c.chunk_bytes);
  if (c.chunk_bytes < 8) c.chunk_bytes = 8;
  c.shm_buffer_bytes = env::parseBytes(env::getString("TFRING_SHM_BUFFER", ""), c.shm_buffer_bytes);
  if (c.shm_buffer_bytes < 4096) c.shm_buffer_bytes = 4096;
  c.transport = env::getString("TFRING_TRANSPORT", c.transport);
  c.spin = env::getString("TFRING_SPIN", c.spin);
  c.timeline = env::getString("TFRING_TIMELINE", "");
  c.iface_addr = env::getString("TFRING_IFACE_ADDR", "");
  c.log_level = static_cast<int>(env::getInt("TFRING_LOG_LEVEL", c.log_level));
  c.cache_enabled = env::getInt("TFRING_CACHE", 1) != 0;
  c.allreduce_algo = env::getString("TFRING_ALLREDUCE_ALGO", c.allreduce_algo);
  c.vote_data_bytes = env::parseBytes(env::getString("TFRING_VOTE_DATA", ""), c.vote_data_bytes);
  if (c.vote_data_bytes < 0) c.vote_data_bytes = 0;
  if (c.vote_data_bytes > (1 << 20)) c.vote_data_bytes = 1 << 20;
  c.allgather_algo = env::getString("TFRING_ALLGATHER_ALGO", c.allgather_algo);
  c.broadcast_algo = env::getString("TFRING_BROADCAST_ALGO", c.broadcast_algo);
  c.small_threshold = env::parseBytes(env::getString("TFRING_SMALL_THRESHOLD", ""), c.small_threshold);
  if (c.small_threshold < 0) c.small_threshold = 0;
  if (c.small_threshold > (256ll << 20)) c.small_threshold = 256ll << 20;
  c.vote_algo = env::getString("TFRING_VOTE_ALGO", c.vote_algo);
  return c;
}

}  // namespace tfring
