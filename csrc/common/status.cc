#include "common/status.h"

namespace tfring {

const char* codeName(Code code) {
  switch (code) {
    case Code::kOk: return "OK";
    case Code::kInvalidArgument: return "InvalidArgument";
    case Code::kMismatch: return "Mismatch";
    case Code::kTimeout: return "Timeout";
    case Code::kPeerFailure: return "PeerFailure";
    case Code::kAborted: return "Aborted";
    case Code::kUnavailable: return "Unavailable";
    case Code::kInternal: return "Internal";
  }
  return "Unknown";
}

std::string Status::toString() const {
  if (ok()) return "OK";
  return strCat(codeName(code_), ": ", msg_);
}

}  // namespace tfring
