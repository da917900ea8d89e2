// Store: the key-value rendezvous every rank uses to find the others.
// Keys are written once (set) or used as counters (add); readers wait for
// keys with a deadline. Implementations: TcpStore (one rank serves, all
// connect, every connection authenticated with the job secret), FileStore
// (a directory on a shared filesystem; tests), PrefixStore (namespacing).
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "common/clock.h"

namespace tfring {
namespace rendezvous {

using Bytes = std::vector<uint8_t>;

class Store {
 public:
  virtual ~Store() = default;
  virtual void set(const std::string& key, const Bytes& value) = 0;
  // Waits for the key, then returns its value. Throws kTimeout naming the key.
  virtual Bytes get(const std::string& key, double timeout_s) = 0;
  // Atomically adds delta to an integer key (created as 0) and returns it.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  // Waits until every key exists. Throws kTimeout naming the missing keys.
  virtual void wait(const std::vector<std::string>& keys, double timeout_s) = 0;
  // True if every key exists now (no wait).
  virtual bool check(const std::vector<std::string>& keys) = 0;
  // Waits for every key, then returns their values in order. The TCP store
  // answers in one round trip: a rank reading every other rank's record at
  // start-up costs the server one request, not N.
  virtual std::vector<Bytes> getMany(const std::vector<std::string>& keys, double timeout_s) {
    wait(keys, timeout_s);
    std::vector<Bytes> out;
    for (auto& key : keys) out.push_back(get(key, timeout_s));
    return out;
  }

  void setString(const std::string& key, const std::string& v) {
    set(key, Bytes(v.begin(), v.end()));
  }
  std::string getString(const std::string& key, double timeout_s) {
    Bytes b = get(key, timeout_s);
    return std::string(b.begin(), b.end());
  }
};

// While a rank waits for a peer to connect to it during start-up, nothing
// else tells it that the peer's host is gone: its links are not up yet and
// the store is idle. StoreProbe::tick() asks the store a question once a
// second (after the first second of waiting): if the store's host died or
// was cut off with the peer's, the question fails within the heartbeat
// budget (TFRING_HEARTBEAT_TIMEOUT) naming the store's address, instead of
// the wait running to TFRING_TIMEOUT.
class StoreProbe {
 public:
  explicit StoreProbe(Store& store) : store_(store), next_(nowSeconds() + 1.0) {}
  void tick() {
    if (nowSeconds() < next_) return;
    store_.check({"job/id"});
    next_ = nowSeconds() + 1.0;
  }

 private:
  Store& store_;
  double next_;
};

class PrefixStore : public Store {
 public:
  PrefixStore(std::string prefix, std::shared_ptr<Store> base)
      : prefix_(std::move(prefix)), base_(std::move(base)) {}
  void set(const std::string& key, const Bytes& value) override { base_->set(k(key), value); }
  Bytes get(const std::string& key, double t) override { return base_->get(k(key), t); }
  int64_t add(const std::string& key, int64_t d) override { return base_->add(k(key), d); }
  void wait(const std::vector<std::string>& keys, double t) override { base_->wait(ks(keys), t); }
  bool check(const std::vector<std::string>& keys) override { return base_->check(ks(keys)); }
  std::vector<Bytes> getMany(const std::vector<std::string>& keys, double t) override {
    return base_->getMany(ks(keys), t);
  }

 private:
  std::string k(const std::string& key) const { return prefix_ + "/" + key; }
  std::vector<std::string> ks(const std::vector<std::string>& keys) const {
    std::vector<std::string> r;
    for (auto& key : keys) r.push_back(k(key));
    return r;
  }
  std::string prefix_;
  std::shared_ptr<Store> base_;
};

// For the stores' timeout messages: "2.5" (seconds) and "[a, b]" (keys).
inline std::string fmtSeconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f", s);
  return buf;
}

inline std::string keyList(const std::vector<std::string>& keys) {
  std::string r = "[";
  for (size_t i = 0; i < keys.size(); ++i) r += (i ? ", " : "") + keys[i];
  return r + "]";
}

}  // namespace rendezvous
}  // namespace tfring
