#include "runtime/timeline.h"

#include "common/clock.h"
#include "common/logging.h"

namespace tfring {
namespace runtime {

namespace {
std::string jsonEscape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\';
    if (static_cast<unsigned char>(c) < 0x20) continue;
    o += c;
  }
  return o;
}
}  // namespace

Timeline::~Timeline() { close(); }

bool Timeline::open(const std::string& path, int rank) {
  std::string p = path;
  auto pos = p.find("{rank}");
  if (pos == std::string::npos) {
    if (rank != 0) return true;
  } else {
    p.replace(pos, 6, std::to_string(rank));
  }
  std::lock_guard<std::mutex> lk(mu_);
  closeLocked();
  file_ = std::fopen(p.c_str(), "w");
  if (!file_) {
    TFRING_LOG(kWarning, "cannot open timeline file ", p);
    return false;
  }
  rank_ = rank;
  t0_ = nowSeconds();
  first_ = true;
  tids_.clear();
  std::fputs("[\n", file_);
  on_.store(true, std::memory_order_relaxed);
  return true;
}

int Timeline::tid(const std::string& tensor) {
  auto it = tids_.find(tensor);
  if (it != tids_.end()) return it->second;
  int id = static_cast<int>(tids_.size()) + 1;
  tids_[tensor] = id;
  emit(strCat("{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":", rank_, ",\"tid\":", id,
              ",\"args\":{\"name\":\"", jsonEscape(tensor), "\"}}"));
  return id;
}

void Timeline::emit(const std::string& json) {
  std::fputs(first_ ? "" : ",\n", file_);
  std::fputs(json.c_str(), file_);
  first_ = false;
}

void Timeline::begin(const std::string& tensor, const std::string& phase) {
  if (!enabled()) return;
  std::lock_guard<std::mutex> lk(mu_);
  if (!file_) return;
  long long ts = static_cast<long long>((nowSeconds() - t0_) * 1e6);
  int t = tid(tensor);
  emit(strCat("{\"name\":\"", phase, "\",\"ph\":\"B\",\"ts\":", ts, ",\"pid\":", rank_,
              ",\"tid\":", t, "}"));
}

void Timeline::end(const std::string& tensor) {
  if (!enabled()) return;
  std::lock_guard<std::mutex> lk(mu_);
  if (!file_) return;
  long long ts = static_cast<long long>((nowSeconds() - t0_) * 1e6);
  int t = tid(tensor);
  emit(strCat("{\"ph\":\"E\",\"ts\":", ts, ",\"pid\":", rank_, ",\"tid\":", t, "}"));
  std::fflush(file_);
}

void Timeline::instant(const std::string& tensor, const std::string& name,
                       const std::string& args_json) {
  if (!file_) return;
  std::lock_guard<std::mutex> lk(mu_);
  long long ts = static_cast<long long>((nowSeconds() - t0_) * 1e6);
  int t = tid(tensor);
  emit(strCat("{\"name\":\"", name, "\",\"ph\":\"i\",\"s\":\"t\",\"ts\":", ts,
              ",\"pid\":", rank_, ",\"tid\":", t, ",\"args\":", args_json, "}"));
}

void Timeline::close() {
  std::lock_guard<std::mutex> lk(mu_);
  closeLocked();
}

void Timeline::closeLocked() {
  on_.store(false, std::memory_order_relaxed);
  if (!file_) return;
  std::fputs("\n]\n", file_);
  std::fclose(file_);
  file_ = nullptr;
}

}  // namespace runtime
}  // namespace tfring
