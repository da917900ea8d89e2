// A small allreduce carried by the round's vote (TFRING_VOTE_DATA).
//
// A steady small allreduce costs a round's vote and then its own exchange:
// twice the sequential hops of either (2 log2 N with recursive doubling).
// Here a rank puts one waiting cached allreduce (its "rider") in the vote
// itself, after the fresh-name tally (runtime/vote.h, VoteExtra):
//   [0..2]    the rider's key: {1, cache id, 0}, {2, fresh full hash}
//             (engine_fresh.cc), or {0, 0, 0} for none;
//   [3..]     its data, prescaled, in rider_bytes_ of room.
// The merge keeps the key when both sides carry this rank's own rider and
// reduces their data elementwise (lower ranks first, as every tally
// merge), else gives no key. Every rank ends with the same tally, so
// every rank sees the same outcome: if every rank chose the same key, its
// sum is in the tally and the
// rider completes with the vote's hops alone; otherwise the data is
// dropped and the tensor runs as it would have (the vote bit for it is the
// minimum as always).
//
// Every rank must send votes of the same length. The room is therefore
// agreed one round ahead: header word [2] carries this rank's proposal
// (the size of the small allreduces it has been seeing), the tally's
// minimum is the room of the next round, the same on every rank. The first
// round of a new size carries no data.
//
// A rank picks the lowest waiting cache id that is a host allreduce and
// fits the room, else the first such new name in its fresh list; ranks
// that submitted the same tensors in the same order pick the same. A
// fresh rider is offered in the fresh list too, so when riders differ it
// still runs in the round as it would have.
// Results: the reduction order is the vote's merge order (rank order on
// the ring vote, the recursive pairs on recursive doubling), the same bits
// on every rank; they may differ in the last bits from another algorithm's
// order, as the algorithms' results do among themselves.
#include <cstring>

#include "collectives/collective_stats.h"
#include "common/status.h"
#include "kernels/cpu/reduce.h"
#include "runtime/engine.h"
#include "runtime/vote.h"

namespace tfring {
namespace runtime {

namespace {
// A rank stops proposing room once it has seen no small allreduce for
// this many rounds, so a job that only reduces large tensors sends bare
// votes.
constexpr uint64_t kRiderForget = 64;

size_t payloadBytes(const Meta& m) {
  return static_cast<size_t>(m.numElements()) * dtypeSize(m.dtype);
}
}  // namespace

bool Engine::riderEligible(const Entry& e) const {
  if (e.meta.type != CollectiveType::kAllreduce || e.req.device >= 0) return false;
  const size_t b = payloadBytes(e.meta);
  return b > 0 && static_cast<int64_t>(b) <= cfg_.vote_data_bytes;
}

size_t Engine::riderWords() const {
  return rider_bytes_ > 0 ? kRiderKey + static_cast<size_t>((rider_bytes_ + 3) / 4) : 0;
}

int32_t Engine::riderProposal() {
  // A forced algorithm is what the user asked to run: no riders then.
  if (cfg_.vote_data_bytes <= 0 || cfg_.allreduce_algo != "auto") return 0;
  ++rounds_;
  auto see = [&](const std::shared_ptr<Entry>& f) {
    if (!f || !riderEligible(*f)) return false;
    rider_hint_ = static_cast<int64_t>(payloadBytes(f->meta));
    rider_seen_ = rounds_;
    return true;
  };
  bool seen = false;
  for (const auto& f : fast_)
    if ((seen = see(f))) break;
  for (size_t i = 0; !seen && i < fresh_.size(); ++i) seen = see(fresh_[i]);
  if (rounds_ - rider_seen_ > kRiderForget) rider_hint_ = 0;
  return static_cast<int32_t>(std::min<int64_t>(rider_hint_, cfg_.vote_data_bytes));
}

void Engine::writeRider(int32_t* out) {
  // The key: {1, cache id, 0} for a cached tensor, {2, the fresh full hash}
  // for a first appearance (engine_fresh.cc); {0, 0, 0}: none.
  out[0] = out[1] = out[2] = 0;
  rider_.reset();
  const size_t room = static_cast<size_t>(rider_bytes_);
  auto fits = [&](const std::shared_ptr<Entry>& f) {
    return f && !f->rode && riderEligible(*f) && payloadBytes(f->meta) <= room;
  };
  for (size_t i = 0; i < fast_.size() && !rider_; ++i)
    if (fits(fast_[i])) {
      rider_ = fast_[i];
      out[0] = 1;
      out[1] = static_cast<int32_t>(i);
    }
  for (size_t i = 0; i < fresh_.size() && !rider_; ++i)
    if (fits(fresh_[i])) {
      rider_ = fresh_[i];
      out[0] = 2;
      out[1] = static_cast<int32_t>(static_cast<uint32_t>(rider_->fresh_full));
      out[2] = static_cast<int32_t>(static_cast<uint32_t>(rider_->fresh_full >> 32));
    }
  std::memcpy(rider_key_, out, sizeof(rider_key_));
  if (!rider_) return;
  const Meta& m = rider_->meta;
  gatherInput(*rider_, out + kRiderKey);
  if (m.prescale != 1.0)
    kernels::scale(out + kRiderKey, static_cast<size_t>(m.numElements()), m.dtype, m.prescale);
}

void Engine::mergeRider(void* ctx, const int32_t* lo, const int32_t* hi, int32_t* out) {
  const Engine* e = static_cast<const Engine*>(ctx);
  // Both sides must carry this rank's own rider: every merge on a rank
  // holds its own vote on one side, except the ring vote's merges of the
  // ranks before it, which end merged with it anyway.
  const int32_t* k = e->rider_key_;
  if (!e->rider_ || std::memcmp(lo, k, sizeof(e->rider_key_)) != 0 ||
      std::memcmp(hi, k, sizeof(e->rider_key_)) != 0) {
    out[0] = out[1] = out[2] = 0;
    return;
  }
  const Meta& m = e->rider_->meta;
  kernels::reduce3(out + kRiderKey, lo + kRiderKey, hi + kRiderKey,
                   static_cast<size_t>(m.numElements()), m.dtype, kernelOp(m.op));
  if (out != lo) std::memcpy(out, k, sizeof(e->rider_key_));
}

void Engine::runRider(const int32_t* merged) {
  std::shared_ptr<Entry> e = std::move(rider_);
  if (!e || merged[0] == 0) return;
  // The tally carries a key only when every rank's key was this rank's.
  if (merged[0] == 1) {
    fast_[merged[1]].reset();
    --fast_count_;
  } else {
    e->rode = true;  // runFresh() drops it from the fresh list
  }
  const Meta& m = e->meta;
  const size_t n = static_cast<size_t>(m.numElements());
  if (timeline_.enabled()) {
    timeline_.end(m.name);
    timeline_.instant(m.name, "VOTE_STATS", voteStatsJson());
    timeline_.begin(m.name, "ALLREDUCE_IN_VOTE");
  }
  const double post = finalScale(m, comm_.size);
  if (e->req.parts.empty()) {
    std::memcpy(e->req.output, merged + kRiderKey, payloadBytes(m));
    if (post != 1.0) kernels::scale(e->req.output, n, m.dtype, post);
  } else {
    scatterOutput(*e, merged + kRiderKey);
    if (post != 1.0)
      for (const Request::Part& p : e->req.parts)
        kernels::scale(p.output, static_cast<size_t>(p.count), m.dtype, post);
  }
  collectives::CollectiveStats st;
  st.collective = "allreduce";
  st.algo = "vote";
  st.size = comm_.size;
  st.bytes = payloadBytes(m);
  st.hops = last_vote_.hops;
  st.bytes_sent = last_vote_.bytes_sent;
  collectives::recordCollective(comm_.stats.get(), st);
  traceCollective(timeline_, *comm_.stats, *e, "ALLREDUCE_STATS");
  finish({e}, Status());
}

}  // namespace runtime
}  // namespace tfring
