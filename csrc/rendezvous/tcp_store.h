// TcpStore: rank 0 runs a TcpStoreServer (one thread serving all clients);
// every rank, rank 0 included, talks to it through a TcpStore client.
// Protocol: every connection opens with the mutual HMAC handshake of
// common/wire.h, so a stray or hostile process can neither join nor read the
// job's keys, and the secret never travels. Requests are length-prefixed
// frames: SET, GET and
// WAIT (answered once the keys exist or the client's deadline passes),
// ADD, CHECK. The wire format is documented in tcp_store.cc.
#pragma once

#include <atomic>
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
  // Binds host:port (port 0 picks a free port) and starts serving. Reads
  // TFRING_HANDSHAKE_TIMEOUT (wire::helloTimeout()) here, once: a bad value
  // is an InvalidArgument error from the constructor.
  TcpStoreServer(const std::string& host, int port, std::string secret);
  ~TcpStoreServer();
  int port() const { return port_; }
  // Disconnects every client (a parked GET/WAIT sees its connection close)
  // and ends the serving thread. Idempotent.
  void stop();

 private:
  class Loop;  // the serving thread's state: connections, keys, parked requests

  void logRejection(const std::string& why);

  std::string secret_;
  // wire::helloTimeout(): the handshake, a request's body once its length is
  // in, and the taking of a reply each have this long.
  double hello_timeout_s_ = 0;
  int listen_fd_ = -1;
  int wake_fds_[2] = {-1, -1};  // stop() writes here to wake the serving thread
  std::mutex stop_mu_;          // serializes stop() callers
  int port_ = 0;
  std::atomic<bool> stop_{false};
  // The one serving thread: it multiplexes every client with poll(), so the
  // server holds one thread however many ranks connect.
  std::thread thread_;
  int64_t rejections_ = 0;  // handshakes refused, for rate-limited logging
};

// Decodes one request frame as the server does and throws on anything
// malformed; for the fuzz tests.
void checkStoreRequest(const Bytes& frame);

class TcpStore : public Store {
 public:
  // Connects (retrying until connect_timeout_s) and authenticates; a
  // handshake has at least TFRING_HANDSHAKE_TIMEOUT (wire::helloTimeout(),
  // read here once).
  TcpStore(const std::string& host, int port, std::string secret,
           double connect_timeout_s);
  ~TcpStore() override;
  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key, double timeout_s) override;
  int64_t add(const std::string& key, int64_t delta) override;
  void wait(const std::vector<std::string>& keys, double timeout_s) override;
  bool check(const std::vector<std::string>& keys) override;
  // One round trip (GETN) however many keys.
  std::vector<Bytes> getMany(const std::vector<std::string>& keys, double timeout_s) override;

 private:
  // Connects and authenticates one connection.
  int openConnection(double timeout_s);
  // Sends one request frame on an idle connection (opening another one if
  // all are busy) and returns the reply frame; `wait_s` is how long the
  // server may legitimately block before answering.
  Bytes roundTrip(const Bytes& request, double wait_s);

  std::string host_;
  int port_ = 0;
  std::string secret_;
  std::string addr_;
  double connect_timeout_s_ = 30.0;
  double hello_timeout_s_ = 0;  // wire::helloTimeout()
  double io_timeout_s_ = 30.0;  // bound on a non-blocking request
  // One request in flight per connection, so a thread blocked in get() never
  // holds up another thread's set(): concurrent callers get their own
  // connection, kept here for reuse when idle.
  std::mutex mu_;
  std::vector<int> idle_fds_;
  std::string broken_;  // set once the server is lost; later calls fail fast
};

}  // namespace rendezvous
}  // namespace tfring
