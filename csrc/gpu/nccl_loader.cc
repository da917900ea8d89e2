#include "gpu/nccl_loader.h"

#include <dlfcn.h>
#include <sys/stat.h>

#include <mutex>

#include "common/tunables.h"
#include "common/logging.h"
#include "common/status.h"

namespace tfring {
namespace gpu {
namespace nccl {

namespace {

std::mutex g_mu;
std::vector<std::string> g_python_dirs;
Library g_lib;
Api g_api;

bool isFile(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}
bool isDir(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// Where the pip wheels put the library, relative to a site-packages dir.
const char* const kWheelDirs[] = {"nvidia/nccl/lib", "nvidia/cu13/lib", "nvidia/cu12/lib"};

std::string coreLibraryDir() {
  Dl_info info;
  if (dladdr(reinterpret_cast<void*>(&coreLibraryDir), &info) == 0 || !info.dli_fname)
    return "";
  std::string p = info.dli_fname;
  auto slash = p.rfind('/');
  return slash == std::string::npos ? std::string(".") : p.substr(0, slash);
}

std::vector<std::string> candidatesLocked() {
  std::vector<std::string> out;
  auto add = [&](const std::string& p) {
    for (auto& q : out)
      if (q == p) return;
    out.push_back(p);
  };
  std::string env = tunables::getString("TFRING_NCCL_LIB");
  if (!env.empty()) add(isDir(env) ? env + "/libnccl.so.2" : env);
  std::vector<std::string> dirs = g_python_dirs;
  std::string core = coreLibraryDir();
  if (!core.empty()) dirs.push_back(core + "/..");
  for (auto& d : dirs)
    for (const char* w : kWheelDirs) {
      std::string p = d + "/" + w + "/libnccl.so.2";
      if (isFile(p)) add(p);
    }
  return out;
}

template <class F>
bool sym(void* h, const char* name, F* out, std::string* missing) {
  *out = reinterpret_cast<F>(dlsym(h, name));
  if (!*out && missing->empty()) *missing = name;
  return *out != nullptr;
}

// Tries one file; fills g_api/g_lib on success.
bool tryLoad(const std::string& path, std::string* err) {
  void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char* e = dlerror();
    *err = e ? e : "dlopen failed";
    return false;
  }
  Api a{};
  std::string missing;
  sym(h, "ncclGetVersion", &a.getVersion, &missing);
  sym(h, "ncclGetUniqueId", &a.getUniqueId, &missing);
  sym(h, "ncclCommInitRank", &a.commInitRank, &missing);
  sym(h, "ncclCommDestroy", &a.commDestroy, &missing);
  sym(h, "ncclCommAbort", &a.commAbort, &missing);
  sym(h, "ncclCommGetAsyncError", &a.commGetAsyncError, &missing);
  sym(h, "ncclGetErrorString", &a.getErrorString, &missing);
  sym(h, "ncclAllReduce", &a.allReduce, &missing);
  sym(h, "ncclBroadcast", &a.broadcast, &missing);
  sym(h, "ncclReduce", &a.reduce, &missing);
  sym(h, "ncclAllGather", &a.allGather, &missing);
  sym(h, "ncclReduceScatter", &a.reduceScatter, &missing);
  sym(h, "ncclGroupStart", &a.groupStart, &missing);
  sym(h, "ncclGroupEnd", &a.groupEnd, &missing);
  if (!missing.empty()) {
    *err = strCat(path, " has no symbol ", missing, " (not an NCCL library?)");
    dlclose(h);
    return false;
  }
  std::string ignored;
  sym(h, "ncclGetLastError", &a.getLastError, &ignored);
  int version = 0;
  if (a.getVersion(&version) != kSuccess) {
    *err = strCat(path, ": ncclGetVersion failed");
    dlclose(h);
    return false;
  }
  if (version < 21000) {
    *err = strCat(path, " is NCCL ", version, "; tfring needs NCCL 2.10 or newer (bfloat16)");
    dlclose(h);
    return false;
  }
  g_api = a;
  g_lib.api = &g_api;
  g_lib.version = version;
  Dl_info info;
  g_lib.path = path;
  if (dladdr(reinterpret_cast<void*>(a.getVersion), &info) && info.dli_fname)
    g_lib.path = info.dli_fname;
  return true;
}

}  // namespace

void setSearchPaths(const std::vector<std::string>& dirs) {
  std::lock_guard<std::mutex> lk(g_mu);
  g_python_dirs.clear();
  for (auto& d : dirs)
    if (!d.empty() && isDir(d)) g_python_dirs.push_back(d);
}

std::vector<std::string> candidates() {
  std::lock_guard<std::mutex> lk(g_mu);
  return candidatesLocked();
}

const Library& load() {
  std::lock_guard<std::mutex> lk(g_mu);
  if (g_lib.api) return g_lib;
  g_lib = Library();
  std::vector<std::string> cands = candidatesLocked();
  const bool forced = tunables::isSet("TFRING_NCCL_LIB");
  cands.push_back("libnccl.so.2");
  std::string errors;
  for (size_t i = 0; i < cands.size(); ++i) {
    g_lib.searched.push_back(cands[i]);
    std::string err;
    if (tryLoad(cands[i], &err)) {
      g_lib.error.clear();
      TFRING_LOG(kDebug, "loaded NCCL ", g_lib.version, " from ", g_lib.path);
      return g_lib;
    }
    errors += (errors.empty() ? "" : "; ") + err;
    // An explicit TFRING_NCCL_LIB that fails is an error, not a hint.
    if (forced && i == 0) break;
  }
  g_lib.error = strCat("libnccl.so.2 could not be loaded (", errors,
                       "). Install it with `pip install nvidia-nccl-cu13` (or -cu12), or set "
                       "TFRING_NCCL_LIB to the library");
  return g_lib;
}

int dtypeOf(DataType t) {
  switch (t) {
    case DataType::kInt8: return 0;
    case DataType::kUInt8: return 1;
    case DataType::kBool: return 1;
    case DataType::kInt32: return 2;
    case DataType::kInt64: return 4;
    case DataType::kFloat16: return 6;
    case DataType::kFloat32: return 7;
    case DataType::kFloat64: return 8;
    case DataType::kBFloat16: return 9;
    // NCCL has no 16-bit integers. The GPU kernels of the TF ops exclude
    // them (TF then runs those collectives on the host), and CudaArray
    // does not take them, so they never get here; -1 makes NCCL refuse.
    case DataType::kInt16:
    case DataType::kUInt16: return -1;
  }
  return 1;
}

int byteType() { return 1; }

int opOf(ReduceOp op, DataType t) {
  const bool b = t == DataType::kBool;
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAverage: return b ? 2 : 0;  // ncclMax : ncclSum
    case ReduceOp::kProduct: return b ? 3 : 1;  // ncclMin : ncclProd
    case ReduceOp::kMax: return 2;
    case ReduceOp::kMin: return 3;
  }
  return 0;
}

std::string describe(const Api* api, Result r, Comm comm) {
  std::string s = strCat("NCCL error ", static_cast<int>(r));
  if (api && api->getErrorString) s += strCat(" (", api->getErrorString(r), ")");
  if (api && api->getLastError) {
    const char* last = api->getLastError(comm);
    if (last && *last) s += strCat(": ", last);
  }
  return s;
}

}  // namespace nccl
}  // namespace gpu
}  // namespace tfring
