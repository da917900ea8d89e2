#include "common/tunables.h"

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <mutex>

#include "common/status.h"

namespace tfring {
namespace tunables {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kKiB = 1024.0, kMiB = kKiB * 1024, kGiB = kMiB * 1024;

#define T_INT(name, dflt, lo, hi, doc) {name, Type::kInt, dflt, lo, hi, "", false, doc}
#define T_BYTES(name, dflt, lo, hi, doc) {name, Type::kBytes, dflt, lo, hi, "", false, doc}
#define T_SECONDS(name, dflt, doc) {name, Type::kSeconds, dflt, 0, kInf, "", false, doc}
#define T_BOOL(name, dflt, doc) {name, Type::kBool, dflt, 0, 1, "", false, doc}
#define T_ENUM(name, dflt, choices, doc) {name, Type::kEnum, dflt, 0, 0, choices, false, doc}
#define T_STRING(name, doc) {name, Type::kString, "", 0, 0, "", false, doc}
#define T_LAUNCHER(name, doc) {name, Type::kInt, "", 0, kInf, "", true, doc}

// The table. docs/tunables.md has a row per entry with the same default
// (tests/core/test_tunables.py); "" is unset (the core then decides, as the doc
// says).
const std::vector<Tunable>& table() {
  static const std::vector<Tunable>* t = new std::vector<Tunable>{
      // ---- fusion and the agreement round (rank 0's values hold) ----
      T_BYTES("TFRING_FUSION_THRESHOLD", "64M", 0, kInf,
              "tensors are fused into buffers of up to this many bytes"),
      {"TFRING_CYCLE_TIME", Type::kMillis, "2.0", 0, kInf, "", false,
       "milliseconds a ready tensor may wait on the coordinator for others to fuse with"},
      T_BOOL("TFRING_CACHE", "1", "0 turns off the cache of negotiation results (the fast path)"),
      T_ENUM("TFRING_VOTE_ALGO", "auto", "auto|ring|recdbl|host",
             "how the agreement round's vote travels"),
      T_BYTES("TFRING_VOTE_DATA", "4K", 0, kMiB,
              "most bytes of one small allreduce carried by the vote (0: off)"),
      // ---- timeouts ----
      T_SECONDS("TFRING_TIMEOUT", "300",
                "seconds a collective or rendezvous wait may take before it fails"),
      T_SECONDS("TFRING_STALL_CHECK_TIME", "60",
                "seconds after which a tensor only some ranks submitted is reported"),
      T_SECONDS("TFRING_HEARTBEAT_TIMEOUT", "10",
                "seconds after which a silent host is declared dead (0: no keepalive)"),
      // > 0: a zero bound would refuse every peer (the smallest is 1 ms).
      {"TFRING_HANDSHAKE_TIMEOUT", Type::kSeconds, "10", 1e-3, kInf, "", false,
       "seconds a peer has to complete the connection handshake or send a store frame"},
      // ---- algorithms (rank 0's values hold) ----
      T_ENUM("TFRING_ALLREDUCE_ALGO", "auto", "auto|ring|oneshot|hier|recdbl|rabenseifner",
             "the host allreduce algorithm"),
      T_ENUM("TFRING_ALLGATHER_ALGO", "auto", "auto|ring|recdbl", "the allgather algorithm"),
      T_ENUM("TFRING_BROADCAST_ALGO", "auto", "auto|ring|tree|scatter_allgather",
             "the broadcast algorithm"),
      T_BYTES("TFRING_SMALL_THRESHOLD", "32K", 0, 256 * kMiB,
              "largest buffer auto sends to the small-message schemes; sizes the host segment"),
      // ---- transport ----
      T_BYTES("TFRING_CHUNK_SIZE", "512K", 8, kInf, "pipeline unit of the ring, bytes"),
      T_BYTES("TFRING_SHM_BUFFER", "4M", 4096, kInf,
              "bytes of shared-memory buffer per link between ranks on one host"),
      T_ENUM("TFRING_TRANSPORT", "auto", "auto|shm|tcp", "links between ranks on one host"),
      T_ENUM("TFRING_SPIN", "auto", "auto|0|1", "whether a waiting rank busy-waits first"),
      T_STRING("TFRING_IFACE", "network interface whose IPv4 address every socket binds to"),
      T_STRING("TFRING_IFACE_ADDR", "the address to bind to; wins over TFRING_IFACE"),
      // ---- diagnostics ----
      T_STRING("TFRING_TIMELINE", "path of a Chrome-trace timeline of every collective"),
      T_INT("TFRING_LOG_LEVEL", "1", 0, 3, "0 debug, 1 info, 2 warning, 3 error"),
      T_ENUM("TFRING_CPU_ISA", "", "scalar|avx2|avx512",
             "force a lower vector instruction set for the CPU kernels"),
      // ---- GPU (read at the first GPU collective; checked at init) ----
      T_ENUM("TFRING_GPU_BACKEND", "auto", "auto|nccl|ring", "backend of GPU collectives"),
      T_BYTES("TFRING_GPU_CHUNK_SIZE", "", 0, kInf,
              "pipeline unit of the CUDA-IPC ring (unset or 0: by size; at least 256)"),
      T_BOOL("TFRING_GPU_IPC", "1", "0: the GPU ring stages through host memory"),
      T_BOOL("TFRING_GPU_IPC_USER_BUFFERS", "1",
             "0: the CUDA-IPC ring copies tensors into a buffer of its own"),
      T_BOOL("TFRING_GPU_AUTOTUNE", "1", "0: auto takes NCCL without timing it"),
      T_STRING("TFRING_NCCL_LIB", "libnccl.so.2 (or its directory) to load"),
      T_ENUM("TFRING_GPU_ALLREDUCE_ALGO", "auto", "auto|oneshot|twoshot|ring",
             "allreduce of the CUDA-IPC backend"),
      T_BYTES("TFRING_GPU_ONESHOT_MAX", "1M", 0, kInf, "auto: one-shot up to this many bytes"),
      T_BYTES("TFRING_GPU_TWOSHOT_MAX", "4M", 0, kInf, "auto: two-shot up to this many bytes"),
      T_BYTES("TFRING_GPU_STAGED_MAX", "2M", 0, kInf,
              "auto on a time-sliced shared GPU: host-staged up to this many bytes"),
      T_ENUM("TFRING_GPU_COMPLETION", "host", "host|stream",
             "when a GPU collective of an XLA step completes"),
      // ---- TensorFlow / XLA (read once, at the first compilation) ----
      T_ENUM("TFRING_XLA_ORDER", "auto", "auto|chain|free",
             "how XLA-compiled collectives are ordered"),
      // ---- set per rank by the launcher ----
      T_LAUNCHER("TFRING_SIZE", "the number of ranks"),
      T_LAUNCHER("TFRING_LOCAL_SIZE", "the number of ranks on this host"),
      {"TFRING_HOSTNAME", Type::kString, "", 0, 0, "", true,
       "the host name the rank was placed on"},
  };
  return *t;
}

#undef T_INT
#undef T_BYTES
#undef T_SECONDS
#undef T_BOOL
#undef T_ENUM
#undef T_STRING
#undef T_LAUNCHER

std::mutex& overridesMu() {
  static std::mutex* m = new std::mutex();
  return *m;
}

std::map<std::string, std::string>& overrideMap() {
  static auto* m = new std::map<std::string, std::string>();
  return *m;
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string trim(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return s.substr(b, e - b);
}

std::vector<std::string> choiceList(const Tunable& t) {
  std::vector<std::string> out;
  std::string cur;
  for (const char* p = t.choices; *p; ++p) {
    if (*p == '|') {
      out.push_back(cur);
      cur.clear();
    } else {
      cur += *p;
    }
  }
  if (!cur.empty()) out.push_back(cur);
  return out;
}

std::string joinChoices(const Tunable& t) {
  std::string s;
  for (const std::string& c : choiceList(t)) s += (s.empty() ? "" : ", ") + c;
  return s;
}

std::string rangeText(const Tunable& t) {
  auto num = [&](double v) {
    if (t.type == Type::kBytes && v >= kKiB && std::fmod(v, kKiB) == 0) {
      if (std::fmod(v, kGiB) == 0) return strCat(static_cast<int64_t>(v / kGiB), "G");
      if (std::fmod(v, kMiB) == 0) return strCat(static_cast<int64_t>(v / kMiB), "M");
      return strCat(static_cast<int64_t>(v / kKiB), "K");
    }
    return strCat(v);
  };
  if (t.max == kInf) return strCat("at least ", num(t.min));
  return strCat("from ", num(t.min), " to ", num(t.max));
}

[[noreturn]] void bad(const Tunable& t, const std::string& v, const std::string& why) {
  fail(Code::kInvalidArgument, t.name, "=", v, " ", why);
}

bool parseDouble(const std::string& s, double* out) {
  if (s.empty()) return false;
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  if (end == s.c_str() || *end != '\0' || std::isnan(v)) return false;
  *out = v;
  return true;
}

// A value as a number (every numeric and bool type), validated.
double numeric(const Tunable& t, const std::string& raw) {
  const std::string v = trim(raw);
  double x = 0;
  switch (t.type) {
    case Type::kInt: {
      char* end = nullptr;
      long long r = std::strtoll(v.c_str(), &end, 10);
      if (v.empty() || *end != '\0') bad(t, raw, "is not an integer");
      x = static_cast<double>(r);
      break;
    }
    case Type::kBytes: {
      int64_t b = 0;
      if (!parseBytes(v, &b))
        bad(t, raw, "is not a size in bytes (a number, optionally with K, M or G: 64M, 4KiB)");
      x = static_cast<double>(b);
      break;
    }
    case Type::kSeconds:
    case Type::kMillis:
      if (!parseDouble(v, &x))
        bad(t, raw, t.type == Type::kSeconds ? "is not a number of seconds"
                                             : "is not a number of milliseconds");
      break;
    case Type::kBool: {
      const std::string l = lower(v);
      if (l == "true" || l == "yes" || l == "on") return 1;
      if (l == "false" || l == "no" || l == "off") return 0;
      char* end = nullptr;
      long long r = std::strtoll(v.c_str(), &end, 10);
      if (v.empty() || *end != '\0') bad(t, raw, "is not one of 0, 1");
      return r != 0 ? 1 : 0;
    }
    default:
      fail(Code::kInternal, t.name, " is not numeric");
  }
  if (x < t.min || x > t.max) bad(t, raw, strCat("is out of range (", rangeText(t), ")"));
  return x;
}

std::string enumValue(const Tunable& t, const std::string& raw) {
  const std::string v = lower(trim(raw));
  for (const std::string& c : choiceList(t))
    if (v == c) return c;
  bad(t, raw, strCat("is not one of ", joinChoices(t)));
}

// The value to parse: override, environment, else the default.
std::string source(const Tunable& t, bool* set = nullptr) {
  std::string v = rawValue(t.name);
  if (set) *set = !v.empty();
  return v.empty() ? std::string(t.dflt) : v;
}

void check(const Tunable& t, const std::string& v) {
  if (v.empty()) return;
  if (t.type == Type::kEnum)
    enumValue(t, v);
  else if (t.type != Type::kString)
    numeric(t, v);
}

const Tunable& typed(const char* name, std::initializer_list<Type> types) {
  const Tunable& t = find(name);
  for (Type ty : types)
    if (t.type == ty) return t;
  fail(Code::kInternal, "tunable ", name, " is a ", typeName(t.type), ", read as another type");
}

}  // namespace

const char* typeName(Type t) {
  switch (t) {
    case Type::kInt: return "int";
    case Type::kBytes: return "bytes";
    case Type::kSeconds: return "seconds";
    case Type::kMillis: return "milliseconds";
    case Type::kBool: return "bool";
    case Type::kEnum: return "enum";
    case Type::kString: return "string";
  }
  return "?";
}

const std::vector<Tunable>& all() { return table(); }

bool declared(const std::string& name) {
  for (const Tunable& t : table())
    if (name == t.name) return true;
  return false;
}

const Tunable& find(const std::string& name) {
  for (const Tunable& t : table())
    if (name == t.name) return t;
  fail(Code::kInternal, name, " is not a declared tunable (common/tunables.cc)");
}

std::string rawValue(const std::string& name) {
  {
    std::lock_guard<std::mutex> lk(overridesMu());
    auto it = overrideMap().find(name);
    if (it != overrideMap().end() && !it->second.empty()) return it->second;
  }
  const char* v = std::getenv(name.c_str());
  return v ? std::string(v) : std::string();
}

bool isSet(const char* name) {
  find(name);
  return !rawValue(name).empty();
}

int64_t getInt(const char* name) {
  const Tunable& t = typed(name, {Type::kInt, Type::kBytes});
  const std::string v = source(t);
  return v.empty() ? 0 : static_cast<int64_t>(numeric(t, v));
}

double getDouble(const char* name) {
  const Tunable& t = typed(name, {Type::kSeconds, Type::kMillis});
  const std::string v = source(t);
  return v.empty() ? 0 : numeric(t, v);
}

bool getBool(const char* name) {
  const Tunable& t = typed(name, {Type::kBool});
  const std::string v = source(t);
  return !v.empty() && numeric(t, v) != 0;
}

std::string getString(const char* name) {
  const Tunable& t = typed(name, {Type::kEnum, Type::kString});
  const std::string v = source(t);
  if (t.type == Type::kString || v.empty()) return v;
  return enumValue(t, v);
}

void setOverrides(const std::map<std::string, std::string>& overrides) {
  for (const auto& kv : overrides) {
    if (!declared(kv.first))
      fail(Code::kInvalidArgument, "init: ", kv.first,
           " is not a tunable of the core (docs/tunables.md)");
    check(find(kv.first), kv.second);
  }
  std::lock_guard<std::mutex> lk(overridesMu());
  overrideMap() = overrides;
}

std::map<std::string, std::string> overrides() {
  std::lock_guard<std::mutex> lk(overridesMu());
  return overrideMap();
}

ScopedOverrides::ScopedOverrides(const std::map<std::string, std::string>& extra) {
  saved_ = overrides();
  std::map<std::string, std::string> merged = saved_;
  for (const auto& kv : extra) merged[kv.first] = kv.second;
  setOverrides(merged);
}

ScopedOverrides::~ScopedOverrides() {
  std::lock_guard<std::mutex> lk(overridesMu());
  overrideMap() = saved_;
}

void checkValue(const char* name, const std::string& value) { check(find(name), value); }

void validateAll() {
  for (const Tunable& t : table()) check(t, rawValue(t.name));
}

std::string foreignEnv(const char* name) {
  if (std::string(name).rfind("TFRING_", 0) == 0)
    fail(Code::kInternal, name, " is a tunable: declare it in common/tunables.cc");
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

bool parseBytes(const std::string& s, int64_t* out) {
  if (s.empty()) return false;
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  if (end == s.c_str() || v < 0 || std::isnan(v)) return false;
  std::string unit;
  for (const char* p = end; *p; ++p)
    if (!std::isspace(static_cast<unsigned char>(*p)))
      unit += static_cast<char>(std::toupper(static_cast<unsigned char>(*p)));
  double mult = 1;
  if (unit.empty() || unit == "B") mult = 1;
  else if (unit == "K" || unit == "KB" || unit == "KIB") mult = kKiB;
  else if (unit == "M" || unit == "MB" || unit == "MIB") mult = kMiB;
  else if (unit == "G" || unit == "GB" || unit == "GIB") mult = kGiB;
  else return false;
  if (v * mult > 9.2e18) return false;
  *out = static_cast<int64_t>(v * mult);
  return true;
}

}  // namespace tunables
}  // namespace tfring
