// CtrlLink (ctrl_link.h): the messages between an engine and the
// coordinator. The engine sends its requests, the responses it executed,
// its fatal errors and its goodbye; the coordinator sends responses, pings
// (the reader answers, so a silent rank can be told from a busy one), stall
// warnings, aborts and the word that a rank shut down.
#include "runtime/ctrl_link.h"

#include <sys/socket.h>
#include <unistd.h>

#include "common/abort.h"
#include "common/clock.h"
#include "common/logging.h"
#include "common/net.h"
#include "common/wire.h"
#include "runtime/coordinator.h"

namespace tfring {
namespace runtime {

namespace {
// How long a wait may still block after a rank it needs has shut down.
constexpr double kLeftGrace = 2.0;
}  // namespace

void CtrlLink::start() {
  if (fd_ >= 0) reader_ = std::thread([this] { readerLoop(); });
}

void CtrlLink::send(const std::vector<uint8_t>& payload, double timeout_s) {
  if (local_) {
    local_->postLocal(payload);
    return;
  }
  // The driver, the reader (pongs) and the fatal-error path all write here.
  std::lock_guard<std::mutex> lk(send_mu_);
  if (fd_ < 0) return;
  wire::sendFrame(fd_, payload, Deadline::in(timeout_s < 0 ? cfg_.timeout_s : timeout_s),
                  strCat("the coordinator (rank ", labels_(0), ")"));
}

void CtrlLink::onMessage(const std::vector<uint8_t>& msg) {
  try {
    wire::Reader rd(msg);
    auto type = rd.get<uint8_t>();
    if (type == kMsgResponse) {
      Response resp = Response::read(rd);
      {
        std::lock_guard<std::mutex> lk(in_.mu);
        in_.recv_seq.store(resp.seq);
        in_.responses.push_back(std::move(resp));
        in_.news.fetch_add(1, std::memory_order_release);
      }
      wake_();
    } else if (type == kMsgPing) {
      if (!local_) {
        wire::Writer w;
        w.put<uint8_t>(kMsgPong);
        send(w.bytes(), 2.0);
      }
    } else if (type == kMsgStall) {
      TFRING_LOG(kWarning, rd.getStr());
    } else if (type == kMsgAbort) {
      int culprit = rd.get<int32_t>();
      std::string text = rd.getStr();
      abort_->abort(Status(Code::kPeerFailure, strCat("rank ", culprit, ": ", text)));
    } else if (type == kMsgLeft) {
      // Rounds need every rank: from the next round on, this rank's work
      // fails with a message naming the rank that left.
      const int who = rd.get<int32_t>();
      {
        std::lock_guard<std::mutex> lk(in_.mu);
        in_.left_ranks.push_back(who);
      }
      in_.left_rank.store(who);
      // A round or collective already waiting for it would wait until
      // TFRING_TIMEOUT: give what it sent before leaving time to arrive,
      // then fail such a wait naming it.
      {
        std::lock_guard<std::mutex> lk(in_.mu);
        if (!in_.stopping)
          abort_->abortWaitsAfter(
              Status(Code::kAborted, strCat("a collective can never complete: rank ",
                                            labels_(who),
                                            " has already shut down (tfring.shutdown())")),
              kLeftGrace);
      }
      in_.news.fetch_add(1, std::memory_order_release);
      wake_();
    }
  } catch (const Error& e) {
    abort_->abort(e.status());
  }
}

void CtrlLink::onLost() {
  std::lock_guard<std::mutex> lk(in_.mu);
  // After rank 0 said it shut down, its connection closing is expected.
  if (!in_.stopping && in_.left_rank.load() != 0)
    abort_->abort(
        Status(Code::kPeerFailure,
               strCat("lost the connection to the coordinator (rank ", labels_(0),
                      "): rank ", labels_(0), " died, was killed, or its host failed")));
  in_.cv.notify_all();
}

void CtrlLink::readerLoop() {
  // The coordinator pings at least every Coordinator::pingInterval(), so a
  // longer silence means rank 0 is stopped or hung.
  const double limit = Coordinator::silenceLimit(cfg_.timeout_s);
  for (;;) {
    std::vector<uint8_t> msg;
    try {
      msg = wire::recvFrame(fd_, Deadline::in(limit),
                            strCat("the coordinator (rank ", labels_(0), ")"));
    } catch (const Error& e) {
      if (e.status().code() == Code::kTimeout) {
        std::lock_guard<std::mutex> lk(in_.mu);
        if (!in_.stopping)
          abort_->abort(Status(
              Code::kPeerFailure,
              strCat("the coordinator (rank ", labels_(0), ") has sent nothing for ",
                     int(limit), " s, not even its pings: rank ", labels_(0),
                     " is stopped or hung (SIGSTOP, swapped out, a debugger) although its "
                     "connection is up")));
        in_.cv.notify_all();
        return;
      }
      onLost();
      return;
    }
    onMessage(msg);
  }
}

void CtrlLink::reportFatal(const Status& s) {
  bool first = abort_->abort(s);
  if (!first) return;  // we are failing because someone told us to
  TFRING_LOG(kError, s.message());
  try {
    // Every rank hears this through the coordinator. A broken link or a
    // vanished process is most likely the peer's failure, not ours: name the
    // suspect first and this rank as the witness, so that a job of hundreds
    // of ranks is not blamed on the healthy rank that noticed.
    const int me = rank_;
    const int suspect = s.code() == Code::kPeerFailure ? s.suspect() : -1;
    wire::Writer w;
    w.put<uint8_t>(kMsgError);
    if (suspect >= 0) {
      const std::string& where = s.suspectWhere();
      w.putStr(strCat("rank ", labels_(suspect), where.empty() ? "" : strCat(" (", where, ")"),
                      " failed or became unreachable (seen by rank ", labels_(me), ": ",
                      s.message(), ")"));
    } else {
      w.putStr(strCat("rank ", labels_(me), " failed: ", s.message()));
    }
    w.put<int32_t>(suspect);
    send(w.bytes(), 2.0);
  } catch (const Error&) {
  }
}

void CtrlLink::waitAbortRelayed(double timeout_s) {
  if (local_) local_->waitAbortSent(timeout_s);
}

void CtrlLink::close() {
  try {
    wire::Writer w;
    w.put<uint8_t>(kMsgBye);
    send(w.bytes(), 2.0);
  } catch (const Error&) {
  }
  if (fd_ >= 0) {
    // Our goodbye is queued ahead of the FIN; closing both directions also
    // wakes the reader thread out of its recv.
    ::shutdown(fd_, SHUT_RDWR);
    if (reader_.joinable()) reader_.join();
    std::lock_guard<std::mutex> lk(send_mu_);
    net::closeFd(fd_);
    fd_ = -1;
  }
}

}  // namespace runtime
}  // namespace tfring
