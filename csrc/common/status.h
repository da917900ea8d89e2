// Status: the error value every fallible core call returns. Errors carry a
// code and a full sentence naming the tensor, rank or peer involved; they are
// raised unchanged on every rank that sees them.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace tfring {

enum class Code {
  kOk = 0,
  kInvalidArgument,   // bad input from the caller (shape, dtype, name)
  kMismatch,          // ranks disagree about a tensor
  kTimeout,           // a wait passed its deadline
  kPeerFailure,       // another rank died or reported an error
  kAborted,           // the runtime is shutting down or already failed
  kUnavailable,       // a feature not built in or not usable here
  kInternal,
};

const char* codeName(Code code);

class Status {
 public:
  Status() = default;
  Status(Code code, std::string msg) : code_(code), msg_(std::move(msg)) {}
  static Status OK() { return Status(); }

  bool ok() const { return code_ == Code::kOk; }
  Code code() const { return code_; }
  const std::string& message() const { return msg_; }
  std::string toString() const;

  // A kPeerFailure raised on behalf of one peer rank (a link to it broke,
  // its process is gone) names it here, with where it ran ("10.0.0.16:40123",
  // "pid 812 on this host"): a report of the failure to the other ranks
  // leads with the suspect rather than with the rank that noticed.
  int suspect() const { return suspect_; }
  const std::string& suspectWhere() const { return suspect_where_; }
  Status& blame(int rank, std::string where) {
    suspect_ = rank;
    suspect_where_ = std::move(where);
    return *this;
  }

 private:
  Code code_ = Code::kOk;
  std::string msg_;
  int suspect_ = -1;
  std::string suspect_where_;
};

// Thrown inside the core where unwinding is simpler than threading Status
// through tight loops; converted back to Status at module boundaries.
class Error : public std::runtime_error {
 public:
  explicit Error(Status s) : std::runtime_error(s.message()), status_(std::move(s)) {}
  const Status& status() const { return status_; }

 private:
  Status status_;
};

namespace detail {
inline void concat(std::ostringstream&) {}
template <typename T, typename... Rest>
void concat(std::ostringstream& os, const T& v, const Rest&... rest) {
  os << v;
  concat(os, rest...);
}
}  // namespace detail

template <typename... Args>
std::string strCat(const Args&... args) {
  std::ostringstream os;
  detail::concat(os, args...);
  return os.str();
}

template <typename... Args>
[[noreturn]] void fail(Code code, const Args&... args) {
  throw Error(Status(code, strCat(args...)));
}

// A kPeerFailure that blames peer rank `rank` (see Status::suspect).
template <typename... Args>
[[noreturn]] void failPeer(int rank, std::string where, const Args&... args) {
  throw Error(Status(Code::kPeerFailure, strCat(args...)).blame(rank, std::move(where)));
}

}  // namespace tfring

// Checks print both sides, gloo-style: "x vs y".
#define TFRING_CHECK(cond, ...)                                               \
  do {                                                                        \
    if (!(cond))                                                              \
      ::tfring::fail(::tfring::Code::kInternal, __FILE__, ":", __LINE__,      \
                     ": check failed: " #cond " ", ##__VA_ARGS__);            \
  } while (0)

#define TFRING_CHECK_EQ(a, b, ...)                                            \
  do {                                                                        \
    auto _va = (a);                                                           \
    auto _vb = (b);                                                           \
    if (!(_va == _vb))                                                        \
      ::tfring::fail(::tfring::Code::kInternal, __FILE__, ":", __LINE__,      \
                     ": check failed: " #a " == " #b " (", _va, " vs ", _vb,  \
                     ") ", ##__VA_ARGS__);                                    \
  } while (0)

// Wraps a syscall that may be interrupted: retries on EINTR.
#define TFRING_SYSCHECK(expr, what)                                           \
  ({                                                                          \
    decltype(expr) _rv;                                                       \
    do {                                                                      \
      _rv = (expr);                                                           \
    } while (_rv < 0 && errno == EINTR);                                      \
    if (_rv < 0)                                                              \
      ::tfring::fail(::tfring::Code::kInternal, what, ": ",                   \
                     ::strerror(errno));                                      \
    _rv;                                                                      \
  })
