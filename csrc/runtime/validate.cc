// checkRequest (runtime/messages.h): the checks one rank can make of its
// own request, in one place.
//
// Where they run. The engine runs them when a request is queued
// (Engine::enqueue) and stores the verdict in the request's Meta::error. A
// request with an error never takes a fast path (cached ids, first
// appearances, the vote's rider): it goes to the coordinator, whose
// negotiation sees every rank's Meta and fails the name on every rank with
// an InvalidArgument (Group::kInvalid) before any data moves. So a bad
// argument given on one rank only fails every rank at once instead of
// leaving the others waiting, and the same bad argument given everywhere
// fails alike everywhere. The coordinator runs the checks again on every
// Meta it receives, so what it executes has passed them whichever way it
// came. A job of one rank has no coordinator: Engine::runInline returns the
// error itself.
#include <vector>

#include "runtime/entry.h"
#include "runtime/messages.h"

namespace tfring {
namespace runtime {

std::string checkRequest(const Meta& m, int size) {
  const char* what = collectiveName(m.type);
  auto bad = [&](const std::string& why) {
    return strCat(what, " of tensor '", m.name, "': ", why);
  };
  for (auto d : m.shape)
    if (d < 0) return bad(strCat("negative dimension in shape ", m.shapeString()));
  switch (m.type) {
    case CollectiveType::kAllreduce:
    case CollectiveType::kReducescatter:
      if (m.dtype == DataType::kBool)
        return bad("bool tensors cannot be reduced (allgather, broadcast and alltoall take "
                   "them)");
      if (static_cast<int>(m.op) >= kNumReduceOps) return bad("unknown reduce op");
      if (m.type == CollectiveType::kReducescatter && m.shape.empty())
        return bad("scalars cannot be scattered (give them a first dimension)");
      break;
    case CollectiveType::kAllgather:
      if (m.shape.empty()) return bad("scalars cannot be gathered (give them a first dimension)");
      break;
    case CollectiveType::kBroadcast:
      if (m.root < 0 || m.root >= size)
        return bad(strCat("root rank ", m.root, " is not in [0, ", size, ")"));
      break;
    case CollectiveType::kAlltoall: {
      std::vector<int64_t> rows;
      std::string why = alltoallSplits(m, size, &rows);
      if (!why.empty()) return bad(strCat(why, " (shape ", m.shapeString(), ")"));
      break;
    }
    case CollectiveType::kBarrier:
    case CollectiveType::kJoin:
      break;
  }
  return "";
}

}  // namespace runtime
}  // namespace tfring
