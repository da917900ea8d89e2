// FileStore: keys are files in a directory every rank can see (a local tmp
// dir in tests, a shared filesystem on clusters). Writes go to a temporary
// name and are renamed into place, so a reader never sees half a value;
// add() serializes through an flock'ed counter file.
#pragma once

#include <string>

#include "rendezvous/store.h"

namespace tfring {
namespace rendezvous {

class FileStore : public Store {
 public:
  explicit FileStore(std::string dir);
  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key, double timeout_s) override;
  int64_t add(const std::string& key, int64_t delta) override;
  void wait(const std::vector<std::string>& keys, double timeout_s) override;
  bool check(const std::vector<std::string>& keys) override;

 private:
  std::string path(const std::string& key) const;
  std::string dir_;
};

}  // namespace rendezvous
}  // namespace tfring
