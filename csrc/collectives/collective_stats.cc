#include "collectives/collective_stats.h"

#include <mutex>

namespace tfring {
namespace collectives {

namespace {
std::mutex g_mu;
CollectiveStats g_last;
}  // namespace

void recordCollective(const CollectiveStats& st) {
  std::lock_guard<std::mutex> lk(g_mu);
  g_last = st;
}

CollectiveStats lastCollectiveStats() {
  std::lock_guard<std::mutex> lk(g_mu);
  return g_last;
}

}  // namespace collectives
}  // namespace tfring
