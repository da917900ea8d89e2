// Tunables: every TFRING_* environment variable the core reads is declared
// once, in the table of tunables.cc, with its type, default, range or
// choices and a line of doc (docs/tunables.md documents the same table; a
// test holds the two together). Every read goes through a typed getter
// here, which validates: a malformed or out-of-range value is an
// InvalidArgument error naming the variable and what it accepts, never a
// silent default. validateAll() at init checks every variable at once, so a
// bad value of one read later (the GPU ones) fails init instead.
//
// Where a value comes from, first match wins:
//   1. the overrides given to init (tfring._core.init(config=...)): Python
//      configures the core this way instead of editing os.environ;
//   2. the environment (the way in for launchers and users);
//   3. the declared default.
// This file is the only one in csrc/ that calls getenv; variables owned by
// other software (CUDA_MPS_PIPE_DIRECTORY, OMPI_COMM_WORLD_*) are read with
// foreignEnv().
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace tfring {
namespace tunables {

enum class Type {
  kInt,      // a decimal integer
  kBytes,    // a size: "1048576", "64M", "4KiB" (K, M, G: powers of 1024)
  kSeconds,  // a number of seconds, fractions allowed
  kMillis,   // a number of milliseconds, fractions allowed
  kBool,     // 0 or 1 (any integer: non-zero is on; also true/false)
  kEnum,     // one of `choices` ("auto|ring|..."), matched without case
  kString,   // any text
};

struct Tunable {
  const char* name;
  Type type;
  const char* dflt;     // as documented ("64M", "300", "auto"); "" for unset
  double min, max;      // inclusive range of kInt/kBytes/kSeconds/kMillis
  const char* choices;  // kEnum: "a|b|c"
  bool launcher;        // set per rank by the launcher, not a user's knob
  const char* doc;      // one line
};

const char* typeName(Type t);

// The whole table, in declaration order.
const std::vector<Tunable>& all();
// The declaration of `name`; an Internal error when it is not declared.
const Tunable& find(const std::string& name);
bool declared(const std::string& name);

// Typed, validated reads (see the precedence above). Each throws
// InvalidArgument naming the variable on a bad value, and Internal when the
// getter does not fit the declared type.
int64_t getInt(const char* name);    // kInt, kBytes
double getDouble(const char* name);  // kSeconds, kMillis
bool getBool(const char* name);      // kBool
std::string getString(const char* name);  // kEnum (lower case), kString
// The variable has a non-empty value (override or environment).
bool isSet(const char* name);

// The overrides given to init: they replace the previous ones and hold until
// the next call. Every name must be declared, and every value valid (an
// InvalidArgument error otherwise, and nothing changes).
void setOverrides(const std::map<std::string, std::string>& overrides);
std::map<std::string, std::string> overrides();

// Overrides for one scope (a read before init, with init's configuration),
// on top of those set: restored when it ends.
class ScopedOverrides {
 public:
  explicit ScopedOverrides(const std::map<std::string, std::string>& extra);
  ~ScopedOverrides();
  ScopedOverrides(const ScopedOverrides&) = delete;
  ScopedOverrides& operator=(const ScopedOverrides&) = delete;

 private:
  std::map<std::string, std::string> saved_;
};

// Checks the present value of every declared variable; throws the first
// error.
void validateAll();
// Checks `value` as a value of `name` (another rank's, say).
void checkValue(const char* name, const std::string& value);

// The raw text the getters would parse (override or environment), "" when
// unset.
std::string rawValue(const std::string& name);

// A variable of other software (never a TFRING_* one), "" when unset.
std::string foreignEnv(const char* name);

// Parses "64M", "4KiB", "1048576" into bytes; false on garbage.
bool parseBytes(const std::string& s, int64_t* out);

}  // namespace tunables
}  // namespace tfring
