// A small allreduce carried by the round's vote (TFRING_VOTE_DATA).
//
// A steady small allreduce costs a round's vote and then its own exchange:
// twice the sequential hops of either (2 log2 N with recursive doubling).
// Here a rank puts one waiting cached allreduce (its "rider") in the vote
// itself, in the rider section after the fresh-name tally (vote_words.h,
// RiderSection; runtime/vote.h, VoteExtra):
//   key       {kCached, cache id, 0}, {kFresh, fresh full hash}
//             (fresh_names.h), or {kNone, 0, 0} for none;
//   data      its payload, prescaled, in the room agreed for the round.
// The merge keeps the key when both sides carry this rank's own rider and
// reduces their data elementwise (lower ranks first, as every tally
// merge), else gives no key. Every rank ends with the same tally, so
// every rank sees the same outcome: if every rank chose the same key, its
// sum is in the tally and the rider completes with the vote's hops alone;
// otherwise the data is dropped and the tensor runs as it would have (the
// vote bit for it is the minimum as always).
//
// Every rank must send votes of the same length. The room is therefore
// agreed one round ahead: the header word kRiderRoom carries this rank's proposal
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
#include <algorithm>
#include <cstring>

#include "collectives/collective_stats.h"
#include "common/status.h"
#include "kernels/cpu/reduce.h"
#include "runtime/rider.h"

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

bool Rider::eligible(const Entry& e) const {
  if (e.meta.type != CollectiveType::kAllreduce || e.req.device >= 0) return false;
  const size_t b = payloadBytes(e.meta);
  return b > 0 && static_cast<int64_t>(b) <= cfg_.vote_data_bytes;
}

int32_t Rider::propose(const Entries& cached, const Entries& fresh) {
  // A forced algorithm is what the user asked to run: no riders then.
  if (cfg_.vote_data_bytes <= 0 || cfg_.allreduce_algo != "auto") return 0;
  ++rounds_;
  auto see = [&](const std::shared_ptr<Entry>& f) {
    if (!f || !eligible(*f)) return false;
    hint_ = static_cast<int64_t>(payloadBytes(f->meta));
    seen_ = rounds_;
    return true;
  };
  bool seen = false;
  for (const auto& f : cached)
    if ((seen = see(f))) break;
  for (size_t i = 0; !seen && i < fresh.size(); ++i) seen = see(fresh[i]);
  if (rounds_ - seen_ > kRiderForget) hint_ = 0;
  return static_cast<int32_t>(std::min<int64_t>(hint_, cfg_.vote_data_bytes));
}

void Rider::write(int32_t* out, const Entries& cached, const Entries& fresh) {
  out[0] = out[1] = out[2] = 0;  // RiderSection::kNone
  rider_.reset();
  const size_t room = static_cast<size_t>(room_);
  auto fits = [&](const std::shared_ptr<Entry>& f) {
    return f && !f->rode && eligible(*f) && payloadBytes(f->meta) <= room;
  };
  for (size_t i = 0; i < cached.size() && !rider_; ++i)
    if (fits(cached[i])) {
      rider_ = cached[i];
      out[0] = RiderSection::kCached;
      out[1] = static_cast<int32_t>(i);
    }
  for (size_t i = 0; i < fresh.size() && !rider_; ++i)
    if (fits(fresh[i])) {
      rider_ = fresh[i];
      out[0] = RiderSection::kFresh;
      out[1] = static_cast<int32_t>(static_cast<uint32_t>(rider_->fresh_full));
      out[2] = static_cast<int32_t>(static_cast<uint32_t>(rider_->fresh_full >> 32));
    }
  std::memcpy(key_, out, sizeof(key_));
  if (!rider_) return;
  const Meta& m = rider_->meta;
  int32_t* data = RiderSection::data(out);
  gatherInput(*rider_, data);
  if (m.prescale != 1.0)
    kernels::scale(data, static_cast<size_t>(m.numElements()), m.dtype, m.prescale);
}

void Rider::merge(void* ctx, const int32_t* lo, const int32_t* hi, int32_t* out) {
  const Rider* r = static_cast<const Rider*>(ctx);
  // Both sides must carry this rank's own rider: every merge on a rank
  // holds its own vote on one side, except the ring vote's merges of the
  // ranks before it, which end merged with it anyway.
  const int32_t* k = r->key_;
  if (!r->rider_ || std::memcmp(lo, k, sizeof(r->key_)) != 0 ||
      std::memcmp(hi, k, sizeof(r->key_)) != 0) {
    out[0] = out[1] = out[2] = 0;
    return;
  }
  const Meta& m = r->rider_->meta;
  kernels::reduce3(RiderSection::data(out), RiderSection::data(lo), RiderSection::data(hi),
                   static_cast<size_t>(m.numElements()), m.dtype, kernelOp(m.op));
  if (out != lo) std::memcpy(out, k, sizeof(r->key_));
}

std::shared_ptr<Entry> Rider::settle(const int32_t* merged, int32_t* cached_id) {
  std::shared_ptr<Entry> e = std::move(rider_);
  *cached_id = -1;
  if (!e || merged[0] == RiderSection::kNone) return nullptr;
  // The tally carries a key only when every rank's key was this rank's.
  if (merged[0] == RiderSection::kCached)
    *cached_id = merged[1];
  else
    e->rode = true;  // FreshNames::settle() drops it from the fresh list
  return e;
}

void Rider::complete(Entry& e, const int32_t* merged, int size, const VoteStats& vote,
                     collectives::CommStats* stats) {
  const Meta& m = e.meta;
  const size_t n = static_cast<size_t>(m.numElements());
  const int32_t* data = RiderSection::data(merged);
  const double post = finalScale(m, size);
  if (e.req.parts.empty()) {
    std::memcpy(e.req.output, data, payloadBytes(m));
    if (post != 1.0) kernels::scale(e.req.output, n, m.dtype, post);
  } else {
    scatterOutput(e, data);
    if (post != 1.0)
      for (const Request::Part& p : e.req.parts)
        kernels::scale(p.output, static_cast<size_t>(p.count), m.dtype, post);
  }
  collectives::CollectiveStats st;
  st.collective = "allreduce";
  st.algo = "vote";
  st.size = size;
  st.bytes = payloadBytes(m);
  st.hops = vote.hops;
  st.bytes_sent = vote.bytes_sent;
  collectives::recordCollective(stats, st);
}

}  // namespace runtime
}  // namespace tfring
