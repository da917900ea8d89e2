#include "collectives/collective_stats.h"

namespace tfring {
namespace collectives {

void recordCollective(CommStats* stats, const CollectiveStats& st) {
  if (stats) stats->setLast(CommStats::kAny, st);
}

CollectiveStats lastCollectiveStats(const CommStats& stats) {
  return stats.last(CommStats::kAny);
}

}  // namespace collectives
}  // namespace tfring
