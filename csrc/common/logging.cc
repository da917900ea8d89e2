#include "common/logging.h"

#include <atomic>
#include <cstdio>

namespace tfring {
namespace log {

static std::atomic<int> g_level{kWarning};
static std::atomic<int> g_rank{-1};

void setLevel(int level) { g_level = level; }
void setRank(int rank) { g_rank = rank; }
bool enabled(int level) { return level >= g_level.load(std::memory_order_relaxed); }

void write(int level, const std::string& msg) {
  static const char* const names[] = {"DEBUG", "INFO", "WARNING", "ERROR"};
  const char* name = names[level < 0 ? 0 : (level > 3 ? 3 : level)];
  int rank = g_rank.load();
  if (rank >= 0)
    std::fprintf(stderr, "[tfring %s rank %d] %s\n", name, rank, msg.c_str());
  else
    std::fprintf(stderr, "[tfring %s] %s\n", name, msg.c_str());
  std::fflush(stderr);
}

}  // namespace log
}  // namespace tfring
