#include "common/env.h"

#include <stdexcept>
#include <vector>

#include "common/status.h"
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

namespace {

// Every value of a policy is one of its tunable's (a Config may be built
// without fromEnv; rank 0's arrives through the store).
void checkPolicy(const JobPolicy& p) {
  namespace t = tunables;
  t::checkValue("TFRING_ALLREDUCE_ALGO", p.allreduce_algo);
  t::checkValue("TFRING_ALLGATHER_ALGO", p.allgather_algo);
  t::checkValue("TFRING_BROADCAST_ALGO", p.broadcast_algo);
  t::checkValue("TFRING_VOTE_ALGO", p.vote_algo);
  t::checkValue("TFRING_SMALL_THRESHOLD", strCat(p.small_threshold));
  t::checkValue("TFRING_FUSION_THRESHOLD", strCat(p.fusion_threshold));
  t::checkValue("TFRING_TRANSPORT", p.transport);
  if (!(p.cycle_time_ms >= 0)) fail(Code::kInvalidArgument, "TFRING_CYCLE_TIME=",
                                    p.cycle_time_ms, " is out of range (at least 0)");
}

}  // namespace

JobPolicy JobPolicy::of(const Config& c) {
  JobPolicy p;
  p.allreduce_algo = c.allreduce_algo;
  p.allgather_algo = c.allgather_algo;
  p.broadcast_algo = c.broadcast_algo;
  p.vote_algo = c.vote_algo;
  p.small_threshold = c.small_threshold;
  p.fusion_threshold = c.fusion_threshold;
  p.cycle_time_ms = c.cycle_time_ms;
  p.transport = c.transport;
  checkPolicy(p);
  return p;
}

std::string JobPolicy::encode() const {
  return strCat(allreduce_algo, "|", small_threshold, "|", transport, "|", fusion_threshold, "|",
                cycle_time_ms, "|", allgather_algo, "|", broadcast_algo, "|", vote_algo);
}

JobPolicy JobPolicy::decode(const std::string& text) {
  std::vector<std::string> f;
  size_t b = 0;
  for (;;) {
    size_t e = text.find('|', b);
    f.push_back(text.substr(b, e == std::string::npos ? std::string::npos : e - b));
    if (e == std::string::npos) break;
    b = e + 1;
  }
  if (f.size() != 8) fail(Code::kInternal, "malformed job policy from rank 0: ", text);
  JobPolicy p;
  try {
    p.allreduce_algo = f[0];
    p.small_threshold = std::stoll(f[1]);
    p.transport = f[2];
    p.fusion_threshold = std::stoll(f[3]);
    p.cycle_time_ms = std::stod(f[4]);
    p.allgather_algo = f[5];
    p.broadcast_algo = f[6];
    p.vote_algo = f[7];
  } catch (const std::logic_error&) {
    fail(Code::kInternal, "malformed job policy from rank 0: ", text);
  }
  try {
    checkPolicy(p);
  } catch (const Error& e) {
    fail(Code::kInvalidArgument, e.status().message(), " (rank 0's value)");
  }
  return p;
}

}  // namespace tfring
