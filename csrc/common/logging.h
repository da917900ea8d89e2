// Minimal leveled logging to stderr, prefixed with the rank so interleaved
// output from many processes stays readable.
#pragma once

#include "common/status.h"

namespace tfring {
namespace log {

enum Level { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };

void setLevel(int level);
void setRank(int rank);
bool enabled(int level);
void write(int level, const std::string& msg);

}  // namespace log
}  // namespace tfring

#define TFRING_LOG(level, ...)                                               \
  do {                                                                       \
    if (::tfring::log::enabled(::tfring::log::level))                        \
      ::tfring::log::write(::tfring::log::level, ::tfring::strCat(__VA_ARGS__)); \
  } while (0)
