// The agreement round's vote: the tally's merge and its two algorithms
// (see vote.h).
#include "runtime/vote.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>

#include "common/clock.h"
#include "common/status.h"
#include "transport/peer_links.h"

namespace tfring {
namespace runtime {

namespace {

// Opens every recursive-doubling round on the fold link ("vote").
constexpr int32_t kWakeToken = 0x766f7465;

static_assert(kNumVoteAlgos <= collectives::kMaxAlgos, "CommStats has no room for every algorithm");

void record(collectives::RingComm& c, const VoteStats& st) {
  if (!c.stats) return;
  const int i = static_cast<int>(st.algo);
  c.stats->vote.add(i, st.hops, st.bytes_sent);
  collectives::CollectiveStats cs;
  cs.collective = "vote";
  cs.algo = voteAlgoName(st.algo);
  cs.size = st.size;
  cs.bytes = st.bytes;
  cs.hops = st.hops;
  cs.bytes_sent = st.bytes_sent;
  c.stats->setLast(collectives::CommStats::kVote, cs, i);
}

int clampCount(int32_t v) { return std::max(0, std::min<int>(v, kFreshSlots)); }

}  // namespace

const char* voteAlgoName(VoteAlgo a) {
  return a == VoteAlgo::kRecDbl ? "recdbl" : a == VoteAlgo::kHost ? "host" : "ring";
}

void recordVote(collectives::RingComm& c, const VoteStats& st) { record(c, st); }

VoteStats lastVoteStats(const collectives::CommStats& s) {
  int algo = 0;
  const collectives::CollectiveStats cs = s.last(collectives::CommStats::kVote, &algo);
  VoteStats st;
  st.algo = static_cast<VoteAlgo>(algo);
  st.size = static_cast<int>(cs.size);
  st.bytes = cs.bytes;
  st.hops = cs.hops;
  st.bytes_sent = cs.bytes_sent;
  return st;
}
uint64_t voteRounds(const collectives::CommStats& s, VoteAlgo a) {
  return s.vote.calls(static_cast<int>(a));
}
uint64_t voteHops(const collectives::CommStats& s, VoteAlgo a) {
  return s.vote.hops(static_cast<int>(a));
}
uint64_t voteBytesSent(const collectives::CommStats& s, VoteAlgo a) {
  return s.vote.bytesSent(static_cast<int>(a));
}

void freshListToTally(int32_t* f) {
  using F = FreshSection;
  const int n = clampCount(F::count(f));
  F::count(f) = n;
  F::nameCount(f) = n;
  // Every slot's name hash (its first word), into the name list.
  for (int i = 0; i < kFreshSlots; ++i) F::names(f)[i] = i < n ? F::slot(f, i)[0] : 0;
}

void mergeTally(const int32_t* lo, const int32_t* hi, int32_t* out, size_t head,
                const VoteExtra* x) {
  // The extra words first: the fresh part below is built on the side and
  // written over `out` last, and the extra part sits after it.
  if (x && x->words) {
    const size_t at = head + kFreshTallyWords;
    x->merge(x->ctx, lo + at, hi + at, out + at);
  }
  using F = FreshSection;
  const int32_t* a = lo + head;
  const int32_t* b = hi + head;
  int32_t f[kFreshTallyWords] = {0};
  // Full hashes on both sides, in the lower side's order.
  const int na = clampCount(F::count(a)), nb = clampCount(F::count(b));
  int n = 0;
  for (int i = 0; i < na; ++i)
    for (int j = 0; j < nb; ++j)
      if (F::fullHash(a, i) == F::fullHash(b, j)) {
        std::memcpy(F::slot(f, n), F::slot(a, i), F::kSlotWords * sizeof(int32_t));
        ++n;
        break;
      }
  F::count(f) = n;
  // Name hashes on both sides.
  const int ma = clampCount(F::nameCount(a)), mb = clampCount(F::nameCount(b));
  int m = 0;
  for (int i = 0; i < ma; ++i) {
    const int32_t h = F::names(a)[i];
    for (int j = 0; j < mb; ++j)
      if (F::names(b)[j] == h) {
        F::names(f)[m++] = h;
        break;
      }
  }
  F::nameCount(f) = m;
  for (size_t i = 0; i < head; ++i) out[i] = std::min(lo[i], hi[i]);
  std::memcpy(out + head, f, sizeof(f));
}

VoteStats ringVote(collectives::RingComm& c, int32_t* tally, size_t head,
                   std::vector<int32_t>* all, const VoteExtra* x) {
  const int N = c.size;
  const size_t extra = x ? x->words : 0;
  // One rank's vote on the wire: the fresh list in list form, and with
  // extra words the room of the tally form before them, so that they sit
  // where the tally keeps them.
  const size_t len = head + (extra ? kFreshTallyWords + extra : kFreshWords);
  const size_t tlen = head + kFreshTallyWords + extra;
  all->resize(len * N + 2 * tlen);
  int32_t* votes = all->data();
  std::memcpy(votes + static_cast<size_t>(c.ring[c.pos]) * len, tally, len * sizeof(int32_t));
  collectives::ringAllgather(c, votes, std::vector<size_t>(N, len * sizeof(int32_t)));
  // Merge in rank order: rank 0's list gives the order.
  int32_t* next = votes + len * N + tlen;
  std::memcpy(tally, votes, len * sizeof(int32_t));
  freshListToTally(tally + head);
  for (int q = 1; q < N; ++q) {
    std::memcpy(next, votes + static_cast<size_t>(q) * len, len * sizeof(int32_t));
    freshListToTally(next + head);
    mergeTally(tally, next, tally, head, x);
  }
  VoteStats st;
  st.algo = VoteAlgo::kRing;
  st.size = N;
  st.bytes = len * sizeof(int32_t);
  st.hops = static_cast<uint64_t>(N - 1);
  st.bytes_sent = static_cast<uint64_t>(N - 1) * st.bytes;
  record(c, st);
  return st;
}

void recdblAmong(collectives::RingComm& c, int N, const int* members, int index,
                 int32_t* tally, size_t head, std::vector<int32_t>* tmp, const VoteExtra* x,
                 const char* what, VoteStats* st) {
  transport::PeerLinks& P = c.host->peers();
  auto link = [&](int i) -> transport::PeerLink& { return P.to(members ? members[i] : i); };
  const transport::RecursiveLayout L = transport::recursiveLayout(index, N);
  const size_t words = head + kFreshTallyWords + (x ? x->words : 0);
  const size_t bytes = words * sizeof(int32_t);
  tmp->resize(words + 1);
  int32_t* in = tmp->data();
  const Deadline deadline = Deadline::in(c.timeout_s);
  st->hops = static_cast<uint64_t>(L.log2p) + (L.r > 0 ? 2 : 0);
  if (N < 2) return;

  if (L.vrank < 0) {
    // Extra rank: my vote out; the wake token and the tally back.
    transport::PeerLink& l = link(L.fold_peer);
    transport::exchange(l, tally, bytes, in, bytes + sizeof(int32_t), deadline, what);
    if (in[0] != kWakeToken)
      fail(Code::kInternal, "the vote on the link to rank ", P.label(l.rank), " is out of step");
    std::memcpy(tally, in + 1, bytes);
    st->bytes_sent += bytes;
    return;
  }
  if (L.fold_peer >= 0) {
    // Wake the extra rank (it may be idle) and take its vote: it is the
    // lower rank of the pair.
    const int32_t token = kWakeToken;
    transport::exchange(link(L.fold_peer), &token, sizeof(token), in, bytes, deadline, what);
    mergeTally(in, tally, tally, head, x);
    st->bytes_sent += sizeof(token);
  }
  for (int mask = 1; mask < L.p; mask <<= 1) {
    const int q = L.partner(mask);
    transport::exchange(link(q), tally, bytes, in, bytes, deadline, what);
    st->bytes_sent += bytes;
    if (index < q)
      mergeTally(tally, in, tally, head, x);
    else
      mergeTally(in, tally, tally, head, x);
  }
  if (L.fold_peer >= 0) {
    transport::exchange(link(L.fold_peer), tally, bytes, nullptr, 0, deadline, what);
    st->bytes_sent += bytes;
  }
}

VoteStats recdblVote(collectives::RingComm& c, int32_t* tally, size_t head,
                     std::vector<int32_t>* tmp, const VoteExtra* x) {
  const int N = c.size;
  VoteStats st;
  st.algo = VoteAlgo::kRecDbl;
  st.size = N;
  st.bytes = (head + kFreshTallyWords + (x ? x->words : 0)) * sizeof(int32_t);
  recdblAmong(c, N, nullptr, c.ring[c.pos], tally, head, tmp, x,
              "the agreement round's vote (recursive doubling)", &st);
  record(c, st);
  return st;
}

}  // namespace runtime
}  // namespace tfring
