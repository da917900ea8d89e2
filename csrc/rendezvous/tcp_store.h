// TcpStore: rank 0 runs a TcpStoreServer (a thread serving all clients);
// every rank, rank 0 included, talks to it through a TcpStore client.
// Protocol: the client opens with a hello carrying the job secret; the
// server closes connections whose secret differs (compared in constant
// time) so a stray or hostile process cannot join or read the job's keys.
// Requests are length-prefixed frames: SET, GET (blocking server-side until
// the key exists or the client's deadline), ADD, CHECK.
#pragma once

#include <atomic>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "rendezvous/store.h"

namespace tfring {
namespace rendezvous {

class TcpStoreServer {
 public:
  // Binds host:port (port 0 picks a free port) and starts serving.
  TcpStoreServer(const std::string& host, int port, std::string secret);
  ~TcpStoreServer();
  int port() const { return port_; }
  void stop();

 private:
  void serve();
  void handleClient(int fd);

  std::string secret_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, Bytes> data_;
  std::vector<std::thread> clients_;
  std::vector<int> client_fds_;
};

class TcpStore : public Store {
 public:
  // Connects (retrying until connect_timeout_s) and authenticates.
  TcpStore(const std::string& host, int port, std::string secret,
           double connect_timeout_s);
  ~TcpStore() override;
  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key, double timeout_s) override;
  int64_t add(const std::string& key, int64_t delta) override;
  void wait(const std::vector<std::string>& keys, double timeout_s) override;
  bool check(const std::vector<std::string>& keys) override;

 private:
  std::string addr_;
  int fd_ = -1;
  std::mutex mu_;  // one request in flight per connection
};

}  // namespace rendezvous
}  // namespace tfring
