// The coordinator's check of a name every rank submitted (see
// coordinator.h): each rank's own arguments first (validate.cc), then
// whether the ranks' Metas agree, with a message that names what differs
// and the ranks that disagree; an agreed name joins the ready list.
#include <algorithm>

#include "common/clock.h"
#include "runtime/coordinator.h"
#include "runtime/entry.h"

namespace tfring {
namespace runtime {

namespace {

// Where two grouped allreduces (Request::parts) differ: what differs
// ("shape of tensor 'g.2' (the group's tensor 2)") and each side's value;
// false when their part shapes agree or cannot be read.
bool describeParts(const Meta& a, const Meta& b, std::string* what, std::string* va,
                   std::string* vb) {
  std::vector<std::vector<int64_t>> sa, sb;
  if (a.splits.empty()) sa = {a.shape};
  else if (!readPartLayout(a.splits, &sa)) return false;
  if (b.splits.empty()) sb = {b.shape};
  else if (!readPartLayout(b.splits, &sb)) return false;
  if (sa.size() != sb.size()) {
    *what = "number of tensors in the group";
    *va = std::to_string(sa.size());
    *vb = std::to_string(sb.size());
    return true;
  }
  for (size_t i = 0; i < sa.size(); ++i)
    if (sa[i] != sb[i]) {
      *what = strCat("shape of tensor '", a.name, ".", i, "' (the group's tensor ", i, ")");
      *va = dimsString(sa[i]);
      *vb = dimsString(sb[i]);
      return true;
    }
  if (a.splits.empty() == b.splits.empty()) return false;
  *what = "call";
  auto call = [](const Meta& m, size_t n) {
    return m.splits.empty() ? std::string("allreduce")
                            : strCat("grouped_allreduce of ", n, " tensor", n == 1 ? "" : "s");
  };
  *va = call(a, sa.size());
  *vb = call(b, sb.size());
  return true;
}

// Describes how Metas differ: "shape [4] on rank 0 vs [5] on rank 1".
std::string describeMismatch(const std::vector<Meta>& m, size_t first_bad, const RankLabels& L) {
  const Meta& a = m[0];
  const Meta& b = m[first_bad];
  auto r0 = strCat(" on rank ", L(0), " vs ");
  auto rb = strCat(" on rank ", L(static_cast<int>(first_bad)));
  if (a.type != b.type)
    return strCat("operation ", collectiveName(a.type), r0, collectiveName(b.type), rb);
  if (a.dtype != b.dtype) return strCat("dtype ", dtypeName(a.dtype), r0, dtypeName(b.dtype), rb);
  // Host against GPU memory first: the rest (a group against one tensor,
  // say) follows from it.
  if (a.device != b.device) {
    auto where = [](const Meta& m) { return m.device < 0 ? "host memory" : "a GPU"; };
    return strCat("device: ", where(a), r0, where(b), rb);
  }
  if (a.type == CollectiveType::kAllreduce && a.splits != b.splits) {
    std::string what, va, vb;
    if (describeParts(a, b, &what, &va, &vb)) return strCat(what, " ", va, r0, vb, rb);
  }
  if (a.type == CollectiveType::kAllgather || a.type == CollectiveType::kAlltoall) {
    if (a.shape.size() != b.shape.size() ||
        !std::equal(a.shape.begin() + (a.shape.empty() ? 0 : 1), a.shape.end(),
                    b.shape.begin() + (b.shape.empty() ? 0 : 1)))
      return strCat("shape ", a.shapeString(), r0, b.shapeString(), rb,
                    " (", collectiveName(a.type),
                    " allows only the first dimension to differ)");
  } else if (a.shape != b.shape) {
    return strCat("shape ", a.shapeString(), r0, b.shapeString(), rb);
  }
  if (a.op != b.op) return strCat("reduce op ", reduceOpName(a.op), r0, reduceOpName(b.op), rb);
  if (a.root != b.root) return strCat("root rank ", L(a.root), r0, L(b.root), rb);
  if (a.prescale != b.prescale || a.postscale != b.postscale)
    return strCat("scale factors (", a.prescale, ", ", a.postscale, ")", r0, "(",
                  b.prescale, ", ", b.postscale, ")", rb);
  if (a.wire != b.wire)
    return strCat("wire dtype ", wireTypeName(a.wire), r0, wireTypeName(b.wire), rb,
                  " (compression must agree on every rank)");
  return "metadata";
}

bool sameExceptDim0(const Meta& a, const Meta& b) {
  if (a.type != b.type || a.dtype != b.dtype || a.op != b.op || a.root != b.root ||
      a.prescale != b.prescale || a.postscale != b.postscale || a.device != b.device ||
      a.wire != b.wire)
    return false;
  // Splits: alltoall's differ by rank; a grouped allreduce's part layout
  // (Request::parts) must agree.
  if (a.type == CollectiveType::kAllreduce) return a.shape == b.shape && a.splits == b.splits;
  if (a.type != CollectiveType::kAllgather && a.type != CollectiveType::kAlltoall)
    return a.shape == b.shape;
  if (a.shape.size() != b.shape.size() || a.shape.empty()) return a.shape == b.shape;
  return std::equal(a.shape.begin() + 1, a.shape.end(), b.shape.begin() + 1);
}

}  // namespace

void Coordinator::validate(const std::string& name, Pending& p) {
  // A rank's own invalid arguments first (validate.cc): an InvalidArgument
  // on every rank, rather than a mismatch with the ranks that called well.
  // The engines judged their requests already (Meta::error); judging again
  // here makes what runs valid whichever path a request took.
  {
    std::vector<int> bad;
    std::string first;
    for (int r = 0; r < size_; ++r) {
      if (!p.have[r]) continue;  // a joined rank
      std::string why = p.metas[r].error.empty() ? checkRequest(p.metas[r], size_)
                                                 : p.metas[r].error;
      if (why.empty()) continue;
      if (bad.empty()) first = why;
      bad.push_back(r);
    }
    if (!bad.empty()) {
      int have = 0;
      for (int r = 0; r < size_; ++r) have += p.have[r] ? 1 : 0;
      errorGroup({name},
                 static_cast<int>(bad.size()) == have
                     ? first
                     : strCat(first, " (on rank", bad.size() > 1 ? "s " : " ", label_.list(bad),
                              "; the other ranks' calls were valid)"),
                 Group::kInvalid);
      return;
    }
  }
  bool fill = false;  // completed without the joined ranks
  std::string why = checkJoined(p, &fill);
  for (int r = 1; r < size_; ++r) {
    if (!sameExceptDim0(p.metas[0], p.metas[r])) {
      // Name every rank that disagrees with rank 0.
      std::vector<int> bad;
      for (int q = 1; q < size_; ++q)
        if (!sameExceptDim0(p.metas[0], p.metas[q])) bad.push_back(q);
      errorGroup({name}, strCat("mismatched ", collectiveName(p.metas[0].type), " of tensor '",
                                name, "' across ranks: ", describeMismatch(p.metas, r, label_),
                                " (ranks disagreeing with rank ", label_(0), ": ",
                                label_.list(bad), ")"));
      return;
    }
  }
  if (!why.empty()) {
    errorGroup({name}, why);
    return;
  }
  const Meta& m = p.metas[0];
  Ready rd;
  rd.meta = m;
  rd.since = nowSeconds();
  rd.fill = fill;
  if (m.type == CollectiveType::kAllgather)
    for (int r = 0; r < size_; ++r) rd.dim0s.push_back(p.metas[r].shape[0]);
  if (m.type == CollectiveType::kAlltoall) {
    why = checkAlltoall(name, p, &rd.dim0s);
    if (!why.empty()) {
      errorGroup({name}, why);
      return;
    }
  }
  if (m.type == CollectiveType::kJoin) {
    // Every rank has joined: report the last one and start afresh.
    rd.dim0s = {last_joined_};
    joined_.assign(size_, false);
    last_joined_ = -1;
  }
  ready_.push_back(std::move(rd));
}

}  // namespace runtime
}  // namespace tfring
