#include "failure_model.hpp"

#include <cmath>
#include <deque>
#include <limits>
#include <sstream>
#include <utility>

#include "protocol.hpp"
#include "swiftqk/error.hpp"

namespace swiftqk::model::failure {
namespace {

constexpr uint64_t owner_word(uint32_t owner, uint32_t call) {
  return (static_cast<uint64_t>(owner) << 32) | call;
}
constexpr uint32_t word_owner(uint64_t w) { return static_cast<uint32_t>(w >> 32); }
constexpr uint32_t word_call(uint64_t w) { return static_cast<uint32_t>(w); }

}  // namespace

Rows& Rows::operator+=(const Rows& o) {
  correct += o.correct;
  nan += o.nan;
  wrong += o.wrong;
  if (first_wrong.empty()) first_wrong = o.first_wrong;
  return *this;
}

// ---------------------------------------------------------------- Kernel

Kernel::Kernel(int rank_, uint32_t id_, Call call_)
    : rank(rank_), id(id_), call(std::move(call_)), q(call.tokens), k(call.tokens) {}

void Kernel::Join() {
  std::lock_guard<std::mutex> lock(join_mu_);
  for (std::thread& t : threads_) {
    if (t.joinable()) t.join();
  }
  joined_.store(true);
}

void Kernel::Exited() {
  const int64_t ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start_).count();
  int64_t seen = end_ns_.load();
  while (seen < ns && !end_ns_.compare_exchange_weak(seen, ns)) {
  }
}

// ---------------------------------------------------------------- Comm

Comm::RankState::RankState(std::size_t words) : ws(new std::atomic<uint64_t>[words]) {
  for (std::size_t i = 0; i < words; ++i) ws[i].store(0, std::memory_order_relaxed);
}

Comm::Comm(int world, Rules rules, uint64_t seed) : world_(world), rules_(rules), seed_(seed) {
  words_ = probe_offset(world, kCapacity) / 8;  // the slots of both banks
  for (int r = 0; r < world; ++r) ranks_.push_back(std::make_unique<RankState>(words_));
}

Comm::~Comm() {
  for (int r = 0; r < world_; ++r) JoinAll(r);
}

uint32_t Comm::owner(int r) const { return word_owner(ranks_[r]->owner.load()); }
uint32_t Comm::call(int r) const { return word_call(ranks_[r]->owner.load()); }

bool Comm::FaultSet(const RankState& s) const {
  return s.fault.load(std::memory_order_acquire) != 0;
}

std::shared_ptr<Kernel> Comm::Launch(int r, Call call) {
  RankState& s = *ranks_[r];
  if (!call.replay && s.code.load(std::memory_order_acquire) != 0) {
    SWIFTQK_FAIL(Describe(r));
  }
  const uint32_t id = call.id != 0 ? call.id : next_id_.fetch_add(1);
  auto kn = std::make_shared<Kernel>(r, id, std::move(call));
  for (int64_t t = 0; t < kn->call.tokens; ++t) {
    kn->q[t] = partial(seed_, kn->call.data, t, r, 0);
    kn->k[t] = partial(seed_, kn->call.data, t, r, 1);
  }
  {
    std::lock_guard<std::mutex> lock(s.mu);
    std::vector<std::shared_ptr<Kernel>> running;
    for (auto& x : s.kernels) {
      if (!x->joined()) running.push_back(std::move(x));
    }
    s.kernels = std::move(running);
    s.kernels.push_back(kn);
  }
  for (int b = 0; b < kn->call.blocks; ++b) {
    kn->threads_.emplace_back([this, p = kn.get(), b] { Block(*p, b); });
  }
  return kn;
}

ResetOutcome Comm::Reset(int r, Ms barrier_deadline) {
  const Clock::time_point t0 = Clock::now();
  ResetOutcome o;
  RankState& s = *ranks_[r];
  // The barriers are numbered when the reset starts, as the code takes its rounds
  // (reserve_rounds) before it quiesces: a reset that fails anywhere still counts.
  const int n = ++s.resets;
  if (!Quiesce(r, o)) {
    o.elapsed = between(t0, Clock::now());
    return o;
  }
  if (rules_.reset_barriers && !Barrier(r, 2 * n - 1, barrier_deadline, "before", o)) {
    o.elapsed = between(t0, Clock::now());
    return o;
  }
  for (std::size_t i = 0; i < words_; ++i) s.ws[i].store(0, std::memory_order_relaxed);
  s.fault.store(0, std::memory_order_relaxed);
  s.peer.store(-1, std::memory_order_relaxed);
  s.token.store(-1, std::memory_order_relaxed);
  s.code.store(0, std::memory_order_relaxed);
  s.blocks_done.store(0, std::memory_order_relaxed);
  s.owner.store(owner_word(0, 0), std::memory_order_relaxed);
  kernel_boundary();  // the clearing is done before this rank arrives at the second barrier
  o.cleared = Clock::now();
  if (rules_.reset_barriers) Barrier(r, 2 * n, barrier_deadline, "after", o);
  o.elapsed = between(t0, Clock::now());
  return o;
}

uint32_t Comm::OwnerId(uint32_t id) const {
  if (rules_.plain_ids) return id;
  const uint32_t n = id & 0xffffu;
  return (n << 16) | (~n & 0xffffu);
}

std::string Comm::Describe(int r) const {
  std::ostringstream os;
  os << "rank " << r << ": ";
  switch (code(r)) {
    case kTimeout:
      if (token(r) < 0) {
        os << "timed out waiting for its own kernel's first block to claim the rank";
      } else {
        os << "timed out waiting for rank " << peer(r) << " at token " << token(r);
      }
      break;
    case kConcurrentKernel:
      os << "another kernel of this communicator ran at the same time";
      break;
    case kPeerFailed:
      os << "rank " << peer(r) << " failed";
      break;
    default:
      os << "no failure";
  }
  return os.str();
}

Rows Comm::Check(const Kernel& kn) const {
  Rows rows;
  for (int64_t t = 0; t < kn.call.tokens; ++t) {
    const Sums want = sum_in_rank_order(world_, [&](int j) {
      return Sums{partial(seed_, kn.call.data, t, j, 0), partial(seed_, kn.call.data, t, j, 1)};
    });
    if (std::isnan(kn.q[t]) && std::isnan(kn.k[t])) {
      ++rows.nan;
    } else if (same_bits(Sums{kn.q[t], kn.k[t]}, want)) {
      ++rows.correct;
    } else {
      ++rows.wrong;
      if (rows.first_wrong.empty()) {
        std::ostringstream os;
        os << "rank " << kn.rank << " kernel " << kn.id << " (data " << kn.call.data << ") row "
           << t << ": (" << kn.q[t] << ", " << kn.k[t] << ") expected (" << want.q << ", " << want.k
           << ")";
        rows.first_wrong = os.str();
      }
    }
  }
  return rows;
}

// Joins every kernel the rank launched since its last reset.
void Comm::JoinAll(int r) {
  std::vector<std::shared_ptr<Kernel>> ks;
  {
    std::lock_guard<std::mutex> lock(ranks_[r]->mu);
    ks.swap(ranks_[r]->kernels);
  }
  for (auto& kn : ks) kn->Join();
}

// The rank's kernels have finished and no kernel owns the rank. A failure may leave the owner
// half set for good (a second kernel's claim, a block 0 that never came), so with the rank's
// code set the wait gives up after its bound; without, the owner is a kernel still running.
bool Comm::Quiesce(int r, ResetOutcome& o) {
  JoinAll(r);
  RankState& s = *ranks_[r];
  const Clock::time_point start = Clock::now();
  while (word_owner(s.owner.load(std::memory_order_acquire)) != 0) {
    if (Clock::now() - start >= kQuiesceBound) {
      if (s.code.load(std::memory_order_acquire) != 0) break;
      std::ostringstream os;
      os << "rank " << r << ": reset failed: a kernel of this communicator is still running "
         << kQuiesceBound.count() << " ms later";
      o.ok = false;
      o.error = os.str();
      return false;
    }
    std::this_thread::sleep_for(Ms(1));
  }
  o.quiesced = between(start, Clock::now());
  return true;
}

// Arrives at barrier `epoch` and waits, bounded, for every rank to arrive there too.
bool Comm::Barrier(int r, int epoch, Ms deadline, const char* where, ResetOutcome& o) {
  ranks_[r]->epoch.store(epoch);
  const Clock::time_point start = Clock::now();
  for (;;) {
    int missing = -1;
    for (int j = 0; j < world_ && missing < 0; ++j) {
      if (ranks_[j]->epoch.load() < epoch) missing = j;
    }
    if (missing < 0) return true;
    if (Clock::now() - start > deadline) {
      std::ostringstream os;
      os << "rank " << r << ": reset failed: rank " << missing << " did not reach the barrier "
         << where << " clearing within " << deadline.count() << " ms";
      o.ok = false;
      o.missing = missing;
      o.error = os.str();
      return false;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

// mark_fault: rank j's fault word names `failing` unless it names a failure already.
void Comm::MarkFault(int j, int failing) {
  uint64_t none = 0;
  ranks_[j]->fault.compare_exchange_strong(none, static_cast<uint64_t>(failing) + 1,
                                           std::memory_order_acq_rel);
}

// record_failure: the first failure of the rank wins; codes 1 and 2 also mark every rank's
// fault word, so that the peers stop at their next wait check or kernel entry.
bool Comm::RecordFailure(int r, uint32_t code, int peer, int64_t token) {
  RankState& s = *ranks_[r];
  uint32_t none = 0;
  if (!s.code.compare_exchange_strong(none, code, std::memory_order_acq_rel)) return false;
  s.peer.store(peer, std::memory_order_relaxed);
  s.token.store(token, std::memory_order_relaxed);
  if (code != kPeerFailed && rules_.fault_word) {
    for (int j = 0; j < world_; ++j) {
      if (j == r) {
        MarkFault(j, r);
      } else {
        ranks_[j]->fault.store(static_cast<uint64_t>(r) + 1, std::memory_order_release);
      }
    }
  }
  return true;
}

// note_stop: the block's first note wins; codes 1 and 2 mark the rank's own fault word at once,
// so the rank's other blocks stop at their next wait check.
void Comm::NoteStop(Kernel& kn, Note& note, uint32_t code, int peer, int64_t token) {
  if (note.code != 0) return;
  note = Note{code, peer, token};
  kn.notes[code].fetch_add(1);
  if (code != kPeerFailed && rules_.fault_word && rules_.own_mark) MarkFault(kn.rank, kn.rank);
}

// record_note, after the block's loop; returns the code recorded, 0 for none.
uint32_t Comm::RecordNote(Kernel& kn, const Note& note) {
  if (note.code == 0) return 0;
  RankState& s = *ranks_[kn.rank];
  int peer = note.peer;
  if (note.code == kPeerFailed) {
    if (s.code.load(std::memory_order_acquire) != 0) return 0;
    peer = static_cast<int>(s.fault.load(std::memory_order_acquire)) - 1;
    if (peer < 0 || peer == kn.rank) return 0;
  }
  if (!RecordFailure(kn.rank, note.code, peer, note.token)) return 0;
  kn.recorded.fetch_add(1);
  return note.code;
}

// The accounting at a block's exit: the last owner block releases the rank, advancing its call.
void Comm::Account(Kernel& kn, int b, RankState& s, uint32_t call) {
  kn.At(Event::kBeforeAccount, b, -1);
  if (kn.call.blocks == 1) {  // the kernel's one block is its last: no count (rank_claim.cuh)
    s.owner.store(owner_word(0, next_call(call)), std::memory_order_release);
    kn.At(Event::kAfterAccount, b, -1);
    return;
  }
  const uint32_t prev = s.blocks_done.fetch_add(1, std::memory_order_acq_rel);
  if (prev == static_cast<uint32_t>(kn.call.blocks) - 1u) {
    s.blocks_done.store(0, std::memory_order_relaxed);
    s.owner.store(owner_word(0, next_call(call)), std::memory_order_release);
  }
  kn.At(Event::kAfterAccount, b, -1);
}

// NaN into a block's rows from its row `from` on (rows from, from + B, ...).
void Comm::FillNaN(Kernel& kn, int64_t from) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (int64_t t = from; t < kn.call.tokens; t += kn.call.blocks) kn.q[t] = kn.k[t] = nan;
}

// Rank r's partials of token t into slot [bank][t][r] of every rank, its own included.
void Comm::Publish(const Kernel& kn, int64_t t, uint32_t tag, uint32_t ktag, int bank,
                   std::mt19937_64& rng) {
  const int r = kn.rank;
  const float q = partial(seed_, kn.call.data, t, r, 0);
  const float k = partial(seed_, kn.call.data, t, r, 1);
  const std::size_t slot = slot_offset(world_, kCapacity, bank, t, r, SlotLayout::kTokenMajor) / 8;
  for (int j = 0; j < world_; ++j) {
    ranks_[j]->ws[slot].store(pack_word(q, tag), std::memory_order_relaxed);
    ranks_[j]->ws[slot + 1].store(pack_word(k, ktag), std::memory_order_relaxed);
    if (kn.call.jitter && j + 1 < world_) maybe_delay(rng, 96, 100);
  }
}

// The bounded wait for token t's slots; on success the row is written. A slot once seen is not
// read again (each lane of the kernel stops loading its slot once it has it).
bool Comm::Collect(Kernel& kn, RankState& s, int64_t t, uint32_t tag, uint32_t ktag, int bank,
                   Note& note, std::mt19937_64& rng) {
  if (kn.call.jitter) maybe_delay(rng, 48, 200);
  std::vector<uint64_t> w0(world_), w1(world_);
  std::vector<char> have(world_);
  Clock::time_point start{};  // the clock starts at the first check, off the fast path
  auto poll = [&](int j) {
    const std::size_t slot =
        slot_offset(world_, kCapacity, bank, t, j, SlotLayout::kTokenMajor) / 8;
    w0[j] = s.ws[slot].load(std::memory_order_relaxed);
    w1[j] = s.ws[slot + 1].load(std::memory_order_relaxed);
    return word_tag(w0[j]) == tag && word_tag(w1[j]) == ktag;
  };
  auto give_up = [&] {
    const Clock::time_point now = Clock::now();
    if (start == Clock::time_point{}) start = now;
    const bool expired = now - start > kn.call.deadline;
    if (!expired && !FaultSet(s)) return false;
    if (expired) {  // some slot is missing, or the wait would have left
      int first_missing = 0;
      while (have[first_missing]) ++first_missing;
      kn.timed_out.fetch_add(1);
      NoteStop(kn, note, kTimeout, first_missing, t);
    } else {
      NoteStop(kn, note, kPeerFailed, -1, t);
    }
    return true;
  };
  if (!poll_lanes(have, poll, give_up)) return false;
  const Sums sum = sum_in_rank_order(world_, [&](int j) {
    return Sums{word_value(w0[j]), word_value(w1[j])};
  });
  kn.q[t] = sum.q;
  kn.k[t] = sum.k;
  return true;
}

// The claim at entry: the word this block saw (its owner half decides the entry, its call half
// is the call) and whether the rank's fault word was set at the top.
uint64_t Comm::Claim(const Kernel& kn, int b, RankState& s, bool& failed_at_entry) {
  if (rules_.claim && b == 0) {
    const uint64_t old = s.owner.fetch_or(owner_word(OwnerId(kn.id), 0), std::memory_order_acq_rel);
    failed_at_entry = FaultSet(s);
    return old;
  }
  failed_at_entry = FaultSet(s);
  uint64_t w = s.owner.load(std::memory_order_acquire);
  if (!rules_.claim || rules_.accept_free_owner) return w;
  const Clock::time_point start = Clock::now();
  while (word_owner(w) == 0 && Clock::now() - start <= kn.call.deadline) {
    std::this_thread::yield();
    w = s.owner.load(std::memory_order_acquire);
  }
  return w;
}

// One block of a kernel: entry (claim, fault word), its tokens, its note's record, accounting.
void Comm::Block(Kernel& kn, int b) {
  kernel_boundary();  // kernel start
  const int r = kn.rank;
  RankState& s = *ranks_[r];
  const Call& call = kn.call;
  std::mt19937_64 rng(
      splitmix64(seed_ ^ (static_cast<uint64_t>(kn.id) << 8) ^ static_cast<uint64_t>(b)));
  kn.At(Event::kStart, b, -1);

  Note note;
  bool failed_at_entry = false;
  const uint64_t seen = Claim(kn, b, s, failed_at_entry);
  const uint32_t seen_owner = word_owner(seen);
  kn.At(Event::kClaimed, b, seen_owner);
  Entry entry = Entry::kRun;
  if (rules_.claim) {
    const uint32_t id = OwnerId(kn.id);
    const bool free_taken = rules_.accept_free_owner && b != 0 && seen_owner == 0;
    if (b != 0 && seen_owner == 0 && !free_taken) {  // block 0 never came
      kn.claim_timed_out.fetch_add(1);
      NoteStop(kn, note, kTimeout, r, -1);
      entry = Entry::kNotOwner;
    } else if (b == 0 ? seen_owner != 0 : seen_owner != id && !free_taken) {
      NoteStop(kn, note, kConcurrentKernel, -1, -1);
      entry = Entry::kNotOwner;
    }
  }
  if (entry == Entry::kRun && failed_at_entry) {
    NoteStop(kn, note, kPeerFailed, -1, -1);
    entry = Entry::kDead;
  }
  (entry == Entry::kNotOwner ? kn.not_owners : kn.owners).fetch_add(1);
  if (entry == Entry::kDead) kn.dead.fetch_add(1);
  const uint32_t device_call = word_call(seen);

  int64_t poison_from = entry == Entry::kRun ? call.tokens : b;
  if (entry == Entry::kRun) {
    const uint32_t tag = tag_for_call(device_call);
    const uint32_t ktag = tag ^ config_hash(4096, 1024, world_, 1e-6f, 0, call.tokens);
    const int bank = bank_for_call(device_call);
    std::deque<int64_t> pending;  // published, not collected yet
    int64_t unwritten = b;        // rows are written in order: the first one not written yet
    bool ok = true;
    for (int64_t t = b;; t += call.blocks) {
      const bool more = t < call.tokens;
      if (more) {
        kn.At(Event::kBeforePublish, b, t);
        Publish(kn, t, tag, ktag, bank, rng);
        kn.At(Event::kAfterPublish, b, t);
        pending.push_back(t);
      }
      if (!pending.empty() && (static_cast<int>(pending.size()) > call.defer || !more)) {
        const int64_t tw = pending.front();
        if (!Collect(kn, s, tw, tag, ktag, bank, note, rng)) {
          ok = false;
          break;
        }
        pending.pop_front();
        unwritten = tw + call.blocks;
        kn.At(Event::kAfterCollect, b, tw);
      }
      if (!more && pending.empty()) break;
    }
    if (ok) {
      kn.completed.fetch_add(1);
    } else {
      kn.gave_up.fetch_add(1);
      kn.At(Event::kGaveUp, b, unwritten);
      if (rules_.nan_fill) poison_from = unwritten;
    }
  }
  FillNaN(kn, poison_from);
  // After the block-wide barrier: thread 0 records the note, then an owner block counts.
  kn.At(Event::kBeforeRecord, b, note.code);
  kn.At(Event::kRecorded, b, RecordNote(kn, note));
  if (entry != Entry::kNotOwner) Account(kn, b, s, device_call);
  kernel_boundary();  // kernel end
  kn.Exited();
  kn.At(Event::kExit, b, -1);
}

}  // namespace swiftqk::model::failure
