// A CPU model of SwiftQK's failure semantics: what the kernel (src/kernels/swiftqk_fused.cuh,
// src/kernels/exchange.cuh, src/kernels/lamport_exchange.cuh) and the host do when a wait fails,
// when two kernels of one communicator run at once, and how a collective reset recovers. As in
// test_protocol_model.cpp (which covers the happy path), threads stand in for the ranks' hosts,
// short-lived worker threads for a kernel's blocks (one token group per block, so a block's
// thread is also its thread 0), and relaxed atomics for the GPU's system-scope accesses. Every
// output row of every rank and kernel is checked: it either equals the exact sum of the call's
// partials (summed on the host in rank order) or is NaN. A wrong finite row is a silent wrong
// answer and fails the test.
//
// What is modelled, per rank, and where it is in the kernel:
//  - The slots, as in test_protocol_model.cpp: slot_offset() in a workspace per rank, a slot is
//    two 64-bit words {value bits | tag << 32}, call c publishes under tag_for_call(c) and
//    ktag = tag ^ config_hash(..., tokens) into bank_for_call(c), and waits are bounded. Block b
//    of B takes tokens b, b + B, ...; it publishes each into every rank's slot and collects it
//    D tokens later (D = the call's deferral depth), summing the world's partials in rank order.
//  - The failure record {code, peer, token} (record_failure): the first failure wins by a CAS on
//    code. 1 = a wait expired (the peer whose slot was missing, the token; or the rank itself and
//    token -1: the kernel's block 0 never claimed the rank), 2 = another kernel of this
//    communicator was running at the same time, 3 = a peer failed (that peer).
//  - The fault word of every rank: a rank marks its own with CAS(0 -> rank + 1) (mark_fault), so
//    it keeps the first failure the rank saw, and a peer's with a plain release store (the
//    kernel's st.release.sys: atomics on a peer's memory need native P2P atomics), so a peer's
//    word names the last rank that failed.
//  - The claim word W = {owner id << 32 | call} and blocks_done. Every launch has a distinct
//    nonzero id (%gridid: Call::id, or the communicator's next launch number). Block 0 claims
//    with old = fetch_or(W, id << 32) and owns the rank iff old's owner half was 0. Every other
//    block reads W until its owner half is nonzero or the call's deadline passes, and takes part
//    iff the owner half is its own id exactly. The call is the low half of what the block saw.
//  - Notes (note_stop): a block notes why it stops, first note wins: a timeout, a second kernel
//    (code 2) or a peer's failure (code 3). A note of code 1 or 2 marks the rank's own fault word
//    at once. A block whose owner half stayed 0 notes a timeout naming its own rank (token -1); a
//    block that finds another owner (block 0: any owner) notes code 2. Such a block (NotOwner)
//    writes NaN over its rows, publishes nothing and does not count in blocks_done.
//  - Entry: an owner block whose fault word was set when it read it at the top (before its claim
//    wait) is dead: it notes code 3, writes NaN over its rows, publishes nothing and counts.
//  - A wait checks, every 64 polls, its deadline (its clock starts at the first check) and the
//    rank's fault word. Giving up, it notes a timeout if the deadline passed (naming the first
//    rank whose slot was missing; the kernel's lanes race for the note, so any missing rank may be
//    named), else code 3; the block writes NaN over its rows not yet written.
//  - Records (record_note), after the block's loop: a note of code 1 or 2 goes to record_failure,
//    whose winner marks every rank's fault word. A note of code 3 is recorded only while the
//    rank's code is 0 and the fault word names another rank, as code 3 naming that rank; a fault
//    word naming the rank itself is left to the block that marked it, which records the cause.
//  - Accounting: each owner block increments blocks_done; the one that brings it to the kernel's
//    block count stores blocks_done = 0, then W = {call next_call(call), owner 0} (plain stores).
//  - Reset, collective: quiesce (join the rank's kernels, then wait for W's owner half to be 0,
//    giving up after kQuiesceBound if the rank's code is set, since the owner half may stay set
//    for good after a failure; failing if it is not), barrier, clear the rank's slots, fault word,
//    record, blocks_done and W := 0, barrier. Each barrier has a deadline; a rank that does not
//    arrive makes reset fail naming it.
//  - The host refuses to launch (throws) while its rank's record is set, except for graph
//    replays, which launch without the host (Call::replay).
// A kernel boundary orders what a rank did before it, as in test_protocol_model.cpp: a fence at
// the start and end of every block. A call's inputs are named by a data index: rank r publishes
// model::partial(seed, data, t, r). Every row starts as the rank's own partials, standing in for
// an in-place input: finite and plausible, and wrong.
//
// Interleavings that matter are forced, not hoped for: a Call's hook runs at fixed points of each
// block (Event), and the tests hold blocks there on latches or sleeps with generous margins, so
// every scenario, and above all every negative control, takes the same path on every run. Each
// knob of Rules breaks one rule of the protocol (the negative controls).
#include <gtest/gtest.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <iostream>
#include <limits>
#include <memory>
#include <mutex>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "model_helpers.hpp"
#include "protocol.hpp"

namespace swiftqk {
namespace {

using Clock = std::chrono::steady_clock;
using Ms = std::chrono::milliseconds;
using model::float_bits;
using model::pack_word;
using model::partial;
using model::word_tag;
using model::word_value;

constexpr uint32_t kTimeout = 1;
constexpr uint32_t kConcurrentKernel = 2;
constexpr uint32_t kPeerFailed = 3;

// A wait meant to expire; one that must not (a hang then fails the test instead); how late a
// late peer is; reset's quiesce bound (the kernel's is 2 x timeout + 1 s; here every kernel has
// been joined before, so it only bounds the wait for an owner half that stays set); reset's
// barrier deadline (above a failing kernel's deadline plus the stall, so a barrier only fails on
// a rank that really does not come); a forced schedule's latches.
constexpr Ms kFailDeadline{30};
constexpr Ms kLongDeadline{3000};
constexpr Ms kStall{100};
constexpr Ms kQuiesceBound{60};
constexpr Ms kBarrierDeadline{2000};
constexpr Ms kLatchTimeout{2000};
constexpr int64_t kCapacity = 8;  // slots per bank; calls have 1..kCapacity tokens

constexpr uint64_t owner_word(uint32_t owner, uint32_t call) {
  return (static_cast<uint64_t>(owner) << 32) | call;
}
constexpr uint32_t word_owner(uint64_t w) { return static_cast<uint32_t>(w >> 32); }
constexpr uint32_t word_call(uint64_t w) { return static_cast<uint32_t>(w); }

// Launch ids of kernels of one rank that run at once, n-th triple: distinct in their low 16 bits,
// which is what the owner id keeps (OwnerId), and above every id the communicator draws itself
// in these tests.
constexpr uint32_t id_a(int n) { return 0x8000u + 3u * static_cast<uint32_t>(n); }
constexpr uint32_t id_b(int n) { return id_a(n) + 1u; }
constexpr uint32_t id_c(int n) { return id_a(n) + 2u; }

struct Rules {
  bool claim = true;       // false: no claim at all, every block reads the call and takes part
  bool fault_word = true;  // false: no fault word, neither marked nor read
  bool own_mark = true;    // false: a note does not mark the rank's own fault word (only a record
                           // marks the fault words, every rank's)
  bool nan_fill = true;    // false: a failed wait leaves the block's rows as they were
  bool reset_barriers = true;  // false: reset clears at once, with no barrier before or after
  // The rejected claim: a block other than block 0 reads W once and takes part if its owner half
  // is 0 (taken as free) or its own id.
  bool accept_free_owner = false;
  // The rejected owner ids: the launch id itself. The kernel's owner id of launch n is
  // {n << 16 | ~n} over n's low 16 bits, so every id has 16 bits set: no id's bits contain
  // another's and no OR of two ids is an id.
  bool plain_ids = false;
};

// Where a block's hook runs: at kernel start; after the claim (token = the owner half seen),
// before the entry's note; around each publish; after each successful collect; after a failed
// wait (token = the first row left unwritten); before and after recording (token = the code
// noted, then the code this block recorded, 0 for none); around the accounting; and last.
enum class Event {
  kStart,
  kClaimed,
  kBeforePublish,
  kAfterPublish,
  kAfterCollect,
  kGaveUp,
  kBeforeRecord,
  kRecorded,
  kBeforeAccount,
  kAfterAccount,
  kExit
};
using Hook = std::function<void(Event, int block, int64_t token)>;

struct Call {
  int data = 0;  // whose inputs: rank r publishes partial(seed, data, t, r)
  int64_t tokens = 4;
  int blocks = 2;
  int defer = 0;
  bool replay = false;          // a graph replay: launched without the host's check
  Ms deadline = kLongDeadline;  // every wait's: the claim's and the slots'
  uint32_t id = 0;              // the launch id (%gridid); 0: the communicator's next
  bool jitter = false;          // random delays inside the blocks
  Hook hook;
};

// Rows of one or more kernels by outcome.
struct Rows {
  int64_t correct = 0, nan = 0, wrong = 0;
  std::string first_wrong;
  Rows& operator+=(const Rows& o) {
    correct += o.correct;
    nan += o.nan;
    wrong += o.wrong;
    if (first_wrong.empty()) first_wrong = o.first_wrong;
    return *this;
  }
  int64_t total() const { return correct + nan + wrong; }
};

class Latch {
 public:
  explicit Latch(int count = 1) : count_(count) {}
  void CountDown() {
    std::lock_guard<std::mutex> lock(mu_);
    if (count_ > 0 && --count_ == 0) cv_.notify_all();
  }
  // True if the count reached zero before the timeout.
  bool Wait(Ms timeout = kLatchTimeout) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, timeout, [this] { return count_ == 0; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int count_;
};

// A sequence of turns: WaitFor(n) returns once the turns before n have been taken.
class Turns {
 public:
  bool WaitFor(int n, Ms timeout = kLatchTimeout) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return turn_ >= n; });
  }
  void Next() {
    std::lock_guard<std::mutex> lock(mu_);
    ++turn_;
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int turn_ = 0;
};

// A time point that a hook sets once and the test reads after joining.
class Stamp {
 public:
  void Set() {
    std::lock_guard<std::mutex> lock(mu_);
    if (t_ == Clock::time_point{}) t_ = Clock::now();
  }
  Clock::time_point Get() {
    std::lock_guard<std::mutex> lock(mu_);
    return t_;
  }

 private:
  std::mutex mu_;
  Clock::time_point t_{};
};

Ms Between(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration_cast<Ms>(to - from);
}

class Comm;

// One kernel launch of one rank: its blocks' threads, its output rows and how its blocks left.
class Kernel {
 public:
  Kernel(int rank_, uint32_t id_, Call call_)
      : rank(rank_), id(id_), call(std::move(call_)), q(call.tokens), k(call.tokens) {}
  ~Kernel() { Join(); }
  Kernel(const Kernel&) = delete;
  Kernel& operator=(const Kernel&) = delete;

  void Join() {
    std::lock_guard<std::mutex> lock(join_mu_);
    for (std::thread& t : threads_) {
      if (t.joinable()) t.join();
    }
    joined_.store(true);
  }
  bool joined() const { return joined_.load(); }
  // From the launch to the last block's exit.
  Ms elapsed() const {
    return std::chrono::duration_cast<Ms>(std::chrono::nanoseconds(end_ns_.load()));
  }
  int noted(uint32_t code) const { return notes[code].load(); }

  const int rank;
  const uint32_t id;
  const Call call;
  std::vector<float> q, k;  // each row written by the block that owns it, read after Join
  // Blocks by entry (owners: run or dead), by how their loop ended, by why they stopped
  // (timed_out: a slot wait expired; claim_timed_out: the owner half stayed 0), and how many of
  // their notes won the rank's record.
  std::atomic<int> owners{0}, not_owners{0}, dead{0}, gave_up{0}, completed{0};
  std::atomic<int> timed_out{0}, claim_timed_out{0}, recorded{0};
  std::array<std::atomic<int>, 4> notes{};  // by code

 private:
  friend class Comm;
  void At(Event e, int block, int64_t token) const {
    if (call.hook) call.hook(e, block, token);
  }
  void Exited() {
    const int64_t ns =
        std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start_).count();
    int64_t seen = end_ns_.load();
    while (seen < ns && !end_ns_.compare_exchange_weak(seen, ns)) {
    }
  }

  const Clock::time_point start_ = Clock::now();
  std::atomic<int64_t> end_ns_{0};
  std::vector<std::thread> threads_;
  std::mutex join_mu_;
  std::atomic<bool> joined_{false};
};

struct ResetOutcome {
  bool ok = true;
  int missing = -1;  // the first rank that did not reach a barrier in time
  std::string error;
  Ms quiesced{0};               // how long the quiesce waited for the owner half
  Clock::time_point cleared{};  // when this rank cleared its state; epoch if it did not
  Ms elapsed{0};
};

class Comm {
 public:
  explicit Comm(int world, Rules rules = {}, uint64_t seed = 1)
      : world_(world), rules_(rules), seed_(seed) {
    words_ = probe_offset(world, kCapacity) / 8;  // the slots of both banks
    for (int r = 0; r < world; ++r) ranks_.push_back(std::make_unique<RankState>(words_));
  }
  ~Comm() {
    for (int r = 0; r < world_; ++r) JoinAll(r);
  }

  int world() const { return world_; }

  // The host's launch: refused while the rank's record is set, unless it is a replay.
  std::shared_ptr<Kernel> Launch(int r, Call call) {
    RankState& s = *ranks_[r];
    if (!call.replay && s.code.load(std::memory_order_acquire) != 0) {
      throw std::runtime_error(Describe(r));
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

  // The collective reset of rank r, run by its host.
  ResetOutcome Reset(int r, Ms barrier_deadline = kBarrierDeadline) {
    const Clock::time_point t0 = Clock::now();
    ResetOutcome o;
    RankState& s = *ranks_[r];
    if (!Quiesce(r, o)) {
      o.elapsed = Between(t0, Clock::now());
      return o;
    }
    const int n = ++s.resets;
    if (rules_.reset_barriers && !Barrier(r, 2 * n - 1, barrier_deadline, "before", o)) {
      o.elapsed = Between(t0, Clock::now());
      return o;
    }
    for (std::size_t i = 0; i < words_; ++i) s.ws[i].store(0, std::memory_order_relaxed);
    s.fault.store(0, std::memory_order_relaxed);
    s.peer.store(-1, std::memory_order_relaxed);
    s.token.store(-1, std::memory_order_relaxed);
    s.code.store(0, std::memory_order_relaxed);
    s.blocks_done.store(0, std::memory_order_relaxed);
    s.owner.store(owner_word(0, 0), std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    o.cleared = Clock::now();
    if (rules_.reset_barriers) Barrier(r, 2 * n, barrier_deadline, "after", o);
    o.elapsed = Between(t0, Clock::now());
    return o;
  }

  // The owner id that launch id `id` claims with.
  uint32_t OwnerId(uint32_t id) const {
    if (rules_.plain_ids) return id;
    const uint32_t n = id & 0xffffu;
    return (n << 16) | (~n & 0xffffu);
  }

  // Device state, read by the tests once the kernels that write it have finished.
  uint32_t code(int r) const { return ranks_[r]->code.load(); }
  int peer(int r) const { return ranks_[r]->peer.load(); }
  int64_t token(int r) const { return ranks_[r]->token.load(); }
  uint64_t fault(int r) const { return ranks_[r]->fault.load(); }
  uint32_t owner(int r) const { return word_owner(ranks_[r]->owner.load()); }
  uint32_t call(int r) const { return word_call(ranks_[r]->owner.load()); }
  uint32_t blocks_done(int r) const { return ranks_[r]->blocks_done.load(); }

  // What the host says when it refuses a launch.
  std::string Describe(int r) const {
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

  // Every row of a finished kernel: the exact sum (rank order, as every rank adds), NaN, or wrong.
  Rows Check(const Kernel& kn) const {
    Rows rows;
    for (int64_t t = 0; t < kn.call.tokens; ++t) {
      float eq = 0.f, ek = 0.f;
      for (int j = 0; j < world_; ++j) {
        eq += partial(seed_, kn.call.data, t, j, 0);
        ek += partial(seed_, kn.call.data, t, j, 1);
      }
      if (std::isnan(kn.q[t]) && std::isnan(kn.k[t])) {
        ++rows.nan;
      } else if (float_bits(kn.q[t]) == float_bits(eq) && float_bits(kn.k[t]) == float_bits(ek)) {
        ++rows.correct;
      } else {
        ++rows.wrong;
        if (rows.first_wrong.empty()) {
          std::ostringstream os;
          os << "rank " << kn.rank << " kernel " << kn.id << " (data " << kn.call.data << ") row "
             << t << ": (" << kn.q[t] << ", " << kn.k[t] << ") expected (" << eq << ", " << ek
             << ")";
          rows.first_wrong = os.str();
        }
      }
    }
    return rows;
  }

 private:
  struct RankState {
    explicit RankState(std::size_t words) : ws(new std::atomic<uint64_t>[words]) {
      for (std::size_t i = 0; i < words; ++i) ws[i].store(0, std::memory_order_relaxed);
    }
    std::unique_ptr<std::atomic<uint64_t>[]> ws;  // the slots
    std::atomic<uint32_t> code{0};                // the failure record
    std::atomic<int> peer{-1};
    std::atomic<int64_t> token{-1};
    std::atomic<uint64_t> fault{0};
    std::atomic<uint64_t> owner{0};  // W
    std::atomic<uint32_t> blocks_done{0};
    // Host side, outside the workspace (reset does not clear it): barrier arrivals, resets made,
    // and the kernels launched and not yet joined by a reset.
    std::atomic<int> epoch{0};
    int resets = 0;
    std::mutex mu;
    std::vector<std::shared_ptr<Kernel>> kernels;
  };

  // Why a block stops, kept by the block (the kernel's shared-memory FailNote).
  struct Note {
    uint32_t code = 0;
    int peer = -1;
    int64_t token = -1;
  };

  enum class Entry { kRun, kDead, kNotOwner };

  void JoinAll(int r) {
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
  bool Quiesce(int r, ResetOutcome& o) {
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
    o.quiesced = Between(start, Clock::now());
    return true;
  }

  // Arrives at barrier `epoch` and waits, bounded, for every rank to arrive there too.
  bool Barrier(int r, int epoch, Ms deadline, const char* where, ResetOutcome& o) {
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

  bool FaultSet(const RankState& s) const { return s.fault.load(std::memory_order_acquire) != 0; }

  // mark_fault: rank j's fault word names `failing` unless it names a failure already.
  void MarkFault(int j, int failing) {
    uint64_t none = 0;
    ranks_[j]->fault.compare_exchange_strong(none, static_cast<uint64_t>(failing) + 1,
                                             std::memory_order_acq_rel);
  }

  // record_failure: the first failure of the rank wins; codes 1 and 2 also mark every rank's
  // fault word, so that the peers stop at their next wait check or kernel entry.
  bool RecordFailure(int r, uint32_t code, int peer, int64_t token) {
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
  void NoteStop(Kernel& kn, Note& note, uint32_t code, int peer, int64_t token) {
    if (note.code != 0) return;
    note = Note{code, peer, token};
    kn.notes[code].fetch_add(1);
    if (code != kPeerFailed && rules_.fault_word && rules_.own_mark) MarkFault(kn.rank, kn.rank);
  }

  // record_note, after the block's loop; returns the code recorded, 0 for none.
  uint32_t RecordNote(Kernel& kn, const Note& note) {
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

  void Account(Kernel& kn, int b, RankState& s, uint32_t call) {
    kn.At(Event::kBeforeAccount, b, -1);
    const uint32_t prev = s.blocks_done.fetch_add(1, std::memory_order_acq_rel);
    if (prev == static_cast<uint32_t>(kn.call.blocks) - 1u) {
      s.blocks_done.store(0, std::memory_order_relaxed);
      s.owner.store(owner_word(0, next_call(call)), std::memory_order_release);
    }
    kn.At(Event::kAfterAccount, b, -1);
  }

  // NaN into a block's rows from its row `from` on (rows from, from + B, ...).
  static void FillNaN(Kernel& kn, int64_t from) {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    for (int64_t t = from; t < kn.call.tokens; t += kn.call.blocks) kn.q[t] = kn.k[t] = nan;
  }

  void Publish(const Kernel& kn, int64_t t, uint32_t tag, uint32_t ktag, int bank,
               std::mt19937_64& rng) {
    const int r = kn.rank;
    const float q = partial(seed_, kn.call.data, t, r, 0);
    const float k = partial(seed_, kn.call.data, t, r, 1);
    const std::size_t slot =
        slot_offset(world_, kCapacity, bank, t, r, SlotLayout::kTokenMajor) / 8;
    for (int j = 0; j < world_; ++j) {
      ranks_[j]->ws[slot].store(pack_word(q, tag), std::memory_order_relaxed);
      ranks_[j]->ws[slot + 1].store(pack_word(k, ktag), std::memory_order_relaxed);
      if (kn.call.jitter && j + 1 < world_) model::maybe_delay(rng, 96, 100);
    }
  }

  // The bounded wait for token t's slots; on success the row is written. A slot once seen is not
  // read again (each lane of the kernel stops loading its slot once it has it).
  bool Collect(Kernel& kn, RankState& s, int64_t t, uint32_t tag, uint32_t ktag, int bank,
               Note& note, std::mt19937_64& rng) {
    if (kn.call.jitter) model::maybe_delay(rng, 48, 200);
    std::vector<uint64_t> w0(world_), w1(world_);
    std::vector<char> have(world_, 0);
    int missing = world_;
    Clock::time_point start{};  // the clock starts at the first check, off the fast path
    for (uint32_t spin = 1;; ++spin) {
      for (int j = 0; j < world_; ++j) {
        if (have[j]) continue;
        const std::size_t slot =
            slot_offset(world_, kCapacity, bank, t, j, SlotLayout::kTokenMajor) / 8;
        w0[j] = s.ws[slot].load(std::memory_order_relaxed);
        w1[j] = s.ws[slot + 1].load(std::memory_order_relaxed);
        if (word_tag(w0[j]) == tag && word_tag(w1[j]) == ktag) {
          have[j] = 1;
          --missing;
        }
      }
      if (missing == 0) break;
      std::this_thread::yield();
      if ((spin & 63u) == 0u) {
        const Clock::time_point now = Clock::now();
        if (start == Clock::time_point{}) start = now;
        const bool expired = now - start > kn.call.deadline;
        if (expired || FaultSet(s)) {
          if (expired) {  // some slot is missing, or the loop would have left
            int first_missing = 0;
            while (have[first_missing]) ++first_missing;
            kn.timed_out.fetch_add(1);
            NoteStop(kn, note, kTimeout, first_missing, t);
          } else {
            NoteStop(kn, note, kPeerFailed, -1, t);
          }
          return false;
        }
      }
    }
    float q = 0.f, k = 0.f;
    for (int j = 0; j < world_; ++j) {
      q += word_value(w0[j]);
      k += word_value(w1[j]);
    }
    kn.q[t] = q;
    kn.k[t] = k;
    return true;
  }

  // The claim at entry: the word this block saw (its owner half decides the entry, its call half
  // is the call) and whether the rank's fault word was set at the top.
  uint64_t Claim(const Kernel& kn, int b, RankState& s, bool& failed_at_entry) {
    if (rules_.claim && b == 0) {
      const uint64_t old =
          s.owner.fetch_or(owner_word(OwnerId(kn.id), 0), std::memory_order_acq_rel);
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

  void Block(Kernel& kn, int b) {
    std::atomic_thread_fence(std::memory_order_seq_cst);  // kernel start
    const int r = kn.rank;
    RankState& s = *ranks_[r];
    const Call& call = kn.call;
    std::mt19937_64 rng(
        model::splitmix64(seed_ ^ (static_cast<uint64_t>(kn.id) << 8) ^ static_cast<uint64_t>(b)));
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
    std::atomic_thread_fence(std::memory_order_seq_cst);  // kernel end
    kn.Exited();
    kn.At(Event::kExit, b, -1);
  }

  const int world_;
  const Rules rules_;
  const uint64_t seed_;
  std::size_t words_ = 0;
  std::vector<std::unique_ptr<RankState>> ranks_;
  std::atomic<uint32_t> next_id_{1};
};

// ---------------------------------------------------------------- shared pieces of the tests

// Fails the test if the scope it guards runs past `limit`: nothing may hang.
class TimeBound {
 public:
  explicit TimeBound(Ms limit) : limit_(limit) {}
  ~TimeBound() {
    const Ms took = std::chrono::duration_cast<Ms>(Clock::now() - start_);
    EXPECT_LT(took.count(), limit_.count()) << "the scenario ran past its bound";
  }

 private:
  const Clock::time_point start_ = Clock::now();
  const Ms limit_;
};

// Four tokens over two blocks, waits that expire after kFailDeadline.
Call FailingCall(int data = 0) {
  Call c;
  c.data = data;
  c.tokens = 4;
  c.blocks = 2;
  c.deadline = kFailDeadline;
  return c;
}
Call ReplayOf(Call c) {
  c.replay = true;
  return c;
}

Rows CheckAll(const Comm& c, const std::vector<std::shared_ptr<Kernel>>& kernels) {
  Rows rows;
  for (const auto& kn : kernels) {
    kn->Join();
    rows += c.Check(*kn);
  }
  return rows;
}

std::string Refusal(Comm& c, int r, const Call& call) {
  try {
    c.Launch(r, call)->Join();
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "";
}

bool Has(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// Every rank resets at once, each from its own host thread.
std::vector<ResetOutcome> ResetAll(Comm& c, Ms barrier_deadline = kBarrierDeadline) {
  std::vector<ResetOutcome> o(c.world());
  std::vector<std::thread> hosts;
  for (int r = 0; r < c.world(); ++r) {
    hosts.emplace_back([&, r] { o[r] = c.Reset(r, barrier_deadline); });
  }
  for (std::thread& t : hosts) t.join();
  return o;
}

// Nothing recorded, nothing owned, nothing counted: the state of a healthy, idle rank.
void ExpectIdleAndHealthy(const Comm& c, uint32_t call) {
  for (int r = 0; r < c.world(); ++r) {
    EXPECT_EQ(c.code(r), 0u) << "rank " << r << ": " << c.Describe(r);
    EXPECT_EQ(c.fault(r), 0u) << "rank " << r;
    EXPECT_EQ(c.owner(r), 0u) << "rank " << r;
    EXPECT_EQ(c.blocks_done(r), 0u) << "rank " << r;
    EXPECT_EQ(c.call(r), call) << "rank " << r;
  }
}

// Every rank makes `calls` eager calls of data first_data, first_data + 1, ... Ranks agree on the
// token counts (1..kCapacity) and draw their blocks (1-3) and deferral depths (0-2) per call;
// random delays in the blocks and between calls let them drift apart. A refused launch counts
// its rows as wrong.
Rows RunCalls(Comm& c, int calls, int first_data, uint64_t seed) {
  std::vector<Rows> rows(c.world());
  std::vector<std::thread> hosts;
  for (int r = 0; r < c.world(); ++r) {
    hosts.emplace_back([&, r] {
      std::mt19937_64 host_rng(seed);
      std::mt19937_64 rank_rng(model::splitmix64(seed * 977 + static_cast<uint64_t>(r)));
      for (int i = 0; i < calls; ++i) {
        Call call;
        call.data = first_data + i;
        call.tokens = 1 + static_cast<int64_t>(host_rng() % kCapacity);
        call.blocks = 1 + static_cast<int>(rank_rng() % 3);
        call.defer = static_cast<int>(rank_rng() % 3);
        call.jitter = true;
        try {
          auto kn = c.Launch(r, call);
          kn->Join();
          rows[r] += c.Check(*kn);
        } catch (const std::runtime_error& e) {
          Rows refused;
          refused.wrong = call.tokens;
          refused.first_wrong = std::string("refused: ") + e.what();
          rows[r] += refused;
          return;
        }
        model::maybe_delay(rank_rng, 16, 300);
      }
    });
  }
  for (std::thread& t : hosts) t.join();
  Rows all;
  for (const Rows& x : rows) all += x;
  return all;
}

// A late peer, then every rank resets at once (the late rank's kernel still running when the
// others enter reset). past_entry false: the others time out on call 0 before the late rank
// launches it; its blocks start kStall late and give up at entry. past_entry true: the late
// rank's blocks pass entry first, and its block 0 holds its first publish until another rank
// has given up on that token, then kStall more: the late publish comes while the others already
// wait in reset. The reset's barriers keep it before every other rank's clear.
void LatePeerThenReset(Comm& c, int late, bool past_entry) {
  std::vector<std::shared_ptr<Kernel>> kernels;
  Latch late_entered(2), others_gave_up;
  Clock::time_point late_publish{};
  Call late_call = FailingCall();
  late_call.deadline = kLongDeadline;  // the late rank gives up on the fault word, not a deadline
  late_call.hook = [&](Event e, int block, int64_t token) {
    if (e == Event::kStart && !past_entry) std::this_thread::sleep_for(kStall);
    if (e == Event::kClaimed) late_entered.CountDown();
    if (e == Event::kBeforePublish && past_entry && block == 0 && token == 0) {
      EXPECT_TRUE(others_gave_up.Wait());
      std::this_thread::sleep_for(kStall);
    }
    if (e == Event::kAfterPublish && block == 0 && token == 0) late_publish = Clock::now();
  };
  if (past_entry) {
    kernels.push_back(c.Launch(late, late_call));
    ASSERT_TRUE(late_entered.Wait());
  }
  Call on_time = FailingCall();
  on_time.hook = [&](Event e, int, int64_t) {
    if (e == Event::kGaveUp) others_gave_up.CountDown();
  };
  for (int r = 0; r < c.world(); ++r) {
    if (r != late) kernels.push_back(c.Launch(r, on_time));
  }
  for (std::size_t i = past_entry ? 1 : 0; i < kernels.size(); ++i) kernels[i]->Join();
  // Some rank timed out naming the late one. With more than two ranks the others may have given
  // up on its fault word first, recording nothing (LatePeerPastEntryBeforeTheFailure).
  int timed_out_on_late = 0;
  for (int r = 0; r < c.world(); ++r) {
    timed_out_on_late += c.code(r) == kTimeout && c.peer(r) == late;
  }
  EXPECT_GE(timed_out_on_late, 1);
  if (!past_entry) kernels.push_back(c.Launch(late, late_call));

  const std::vector<ResetOutcome> o = ResetAll(c);
  const Rows rows = CheckAll(c, kernels);
  EXPECT_EQ(rows.wrong, 0) << rows.first_wrong;
  EXPECT_GT(rows.nan, 0);
  for (int r = 0; r < c.world(); ++r) {
    EXPECT_TRUE(o[r].ok) << o[r].error;
    if (past_entry && r != late) {
      EXPECT_LT(late_publish, o[r].cleared) << "rank " << r;
    }
  }
  ExpectIdleAndHealthy(c, 0);
}

// ---------------------------------------------------------------- late peer, replays, reset

TEST(FailureModel, LatePeer) {
  const TimeBound bound(Ms(3000));
  Comm c(2);
  // Rank 0 makes call 0 alone: each block publishes its first token and waits for rank 1's.
  auto early = c.Launch(0, FailingCall());
  early->Join();
  EXPECT_EQ(c.code(0), kTimeout);
  EXPECT_EQ(c.peer(0), 1);
  EXPECT_GE(c.token(0), 0);  // a block's first token: 0 or 1
  EXPECT_LT(c.token(0), 2);
  EXPECT_EQ(c.fault(0), 1u);  // rank 0 + 1, in every rank's fault word
  EXPECT_EQ(c.fault(1), 1u);
  // Whichever block times out first marks rank 0's fault word; the other one times out too or
  // stops on that mark. Only one record: the other block's timeout loses the CAS, and its stop on
  // its own rank's mark records nothing.
  EXPECT_GE(early->timed_out.load(), 1);
  EXPECT_EQ(early->gave_up.load(), 2);
  EXPECT_EQ(early->noted(kTimeout) + early->noted(kPeerFailed), 2);
  EXPECT_EQ(early->recorded.load(), 1);
  const Rows early_rows = c.Check(*early);
  EXPECT_EQ(early_rows.nan, 4) << early_rows.first_wrong;

  // Rank 1's record is clean, so its host launches the call: the kernel gives up at entry.
  auto late = c.Launch(1, FailingCall());
  late->Join();
  EXPECT_EQ(late->dead.load(), 2);
  EXPECT_EQ(late->noted(kPeerFailed), 2);
  EXPECT_EQ(late->recorded.load(), 1);
  EXPECT_EQ(c.code(1), kPeerFailed);
  EXPECT_EQ(c.peer(1), 0);
  const Rows late_rows = c.Check(*late);
  EXPECT_EQ(late_rows.nan, 4) << late_rows.first_wrong;

  // Graph replays, which skip the host's check: NaN, on both ranks, every time.
  Rows replays;
  for (int data = 1; data <= 5; ++data) {
    auto a = c.Launch(0, ReplayOf(FailingCall(data)));
    auto b = c.Launch(1, ReplayOf(FailingCall(data)));
    replays += CheckAll(c, {a, b});
    EXPECT_EQ(a->dead.load() + b->dead.load(), 4);
  }
  EXPECT_EQ(replays.nan, 40) << replays.first_wrong;
  EXPECT_EQ(replays.wrong, 0) << replays.first_wrong;

  // The hosts refuse eager launches, naming the rank, the peer and the token.
  const std::string r0 = Refusal(c, 0, FailingCall(6));
  EXPECT_TRUE(Has(r0, "rank 0") && Has(r0, "rank 1") && Has(r0, "token")) << r0;
  const std::string r1 = Refusal(c, 1, FailingCall(6));
  EXPECT_TRUE(Has(r1, "rank 1") && Has(r1, "rank 0 failed")) << r1;

  // Every kernel released the rank and advanced its call, failed or not: no drift.
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(c.owner(r), 0u);
    EXPECT_EQ(c.blocks_done(r), 0u);
    EXPECT_EQ(c.call(r), 6u);
  }
  std::cout << "[ model    ] rank 0 timed out in " << early->elapsed().count()
            << " ms; rank 1's late kernel gave up at entry in " << late->elapsed().count()
            << " ms\n";
}

TEST(FailureModel, LatePeerPastEntryBeforeTheFailure) {
  // Rank 1's blocks pass entry before rank 0 fails; rank 1's block 0 then holds its first
  // publish until rank 0's block 0 has timed out on that token and given up, before publishing
  // token 2. Rank 1 gets token 0 (rank 0 published it before waiting) and gives up on token 2
  // when it finds rank 0's fault in its fault word, which rank 0's record marked.
  const TimeBound bound(Ms(3000));
  Comm c(2);
  Latch entered(2), early_gave_up;
  Call late_call = FailingCall();
  late_call.deadline = kLongDeadline;
  late_call.hook = [&](Event e, int block, int64_t token) {
    if (e == Event::kClaimed) entered.CountDown();
    if (e == Event::kBeforePublish && block == 0 && token == 0) {
      EXPECT_TRUE(early_gave_up.Wait());
    }
  };
  auto late = c.Launch(1, late_call);
  ASSERT_TRUE(entered.Wait());
  Call early_call = FailingCall();
  early_call.hook = [&](Event e, int block, int64_t) {
    if (e == Event::kGaveUp && block == 0) early_gave_up.CountDown();
  };
  auto early = c.Launch(0, early_call);
  early->Join();
  late->Join();
  EXPECT_EQ(c.code(0), kTimeout);
  EXPECT_EQ(c.peer(0), 1);
  EXPECT_EQ(c.token(0), 0);
  const Rows rows = CheckAll(c, {early, late});
  EXPECT_EQ(rows.wrong, 0) << rows.first_wrong;
  EXPECT_TRUE(std::isnan(early->q[0]) && std::isnan(early->q[2]));
  EXPECT_FALSE(std::isnan(late->q[0]));  // correct (rows.wrong is 0)
  EXPECT_TRUE(std::isnan(late->q[2]));
  EXPECT_GE(late->gave_up.load(), 1);
  EXPECT_EQ(late->timed_out.load(), 0);
  // A wait that gives up on a fault word naming a peer records code 3 naming it, after the
  // block's loop: rank 1's host refuses its next launch, and a replay gives up at entry.
  EXPECT_EQ(c.code(1), kPeerFailed);
  EXPECT_EQ(c.peer(1), 0);
  EXPECT_EQ(late->recorded.load(), 1);
  EXPECT_FALSE(Refusal(c, 1, FailingCall(1)).empty());
  auto next = c.Launch(1, ReplayOf(FailingCall(1)));
  next->Join();
  EXPECT_EQ(next->dead.load(), 2);
  EXPECT_EQ(next->recorded.load(), 0);  // the record is rank 1's first failure
  EXPECT_EQ(c.Check(*next).nan, 4);
}

// Rank 0 times out on call 0 (ranks 1 and 2 late); then every rank replays graphs captured
// before the failure: ranks 1 and 2 their call 0 and calls 1..9, rank 0 calls 1..9, all ranks
// at once. Returns how long the replays took.
Ms ReplaysAfterATimeout(Comm& c, Ms deadline, Rows& rows, int& dead_blocks, int& blocks) {
  Call first = FailingCall();
  first.deadline = deadline;
  c.Launch(0, first)->Join();
  EXPECT_EQ(c.code(0), kTimeout);
  EXPECT_TRUE(c.peer(0) == 1 || c.peer(0) == 2) << c.Describe(0);  // a rank whose slot was missing
  std::vector<std::vector<std::shared_ptr<Kernel>>> kernels(c.world());
  const Clock::time_point t0 = Clock::now();
  std::vector<std::thread> hosts;
  for (int r = 0; r < c.world(); ++r) {
    hosts.emplace_back([&, r] {
      for (int data = r == 0 ? 1 : 0; data < 10; ++data) {
        Call call = ReplayOf(FailingCall(data));
        call.deadline = deadline;
        kernels[r].push_back(c.Launch(r, call));
        kernels[r].back()->Join();
      }
    });
  }
  for (std::thread& t : hosts) t.join();
  const Ms took = std::chrono::duration_cast<Ms>(Clock::now() - t0);
  rows = Rows{};
  dead_blocks = blocks = 0;
  for (const auto& ks : kernels) {
    rows += CheckAll(c, ks);
    for (const auto& kn : ks) {
      dead_blocks += kn->dead.load();
      blocks += kn->call.blocks;
    }
  }
  return took;
}

constexpr Ms kReplayDeadline{250};

TEST(FailureModel, ReplayAfterFailure) {
  // The fault word reaches every rank with the failure: each replay gives up at entry, without
  // waiting at all, so 29 replays over three ranks take less than one deadline.
  const TimeBound bound(Ms(3000));
  Comm c(3);
  Rows rows;
  int dead = 0, blocks = 0;
  const Ms took = ReplaysAfterATimeout(c, kReplayDeadline, rows, dead, blocks);
  EXPECT_EQ(rows.wrong, 0) << rows.first_wrong;
  EXPECT_EQ(rows.nan, rows.total());
  EXPECT_EQ(dead, blocks);
  EXPECT_LT(took.count(), kReplayDeadline.count());
  for (int r : {1, 2}) {
    EXPECT_EQ(c.code(r), kPeerFailed) << c.Describe(r);
    EXPECT_EQ(c.peer(r), 0);
  }
  for (int r = 0; r < 3; ++r) EXPECT_EQ(c.blocks_done(r), 0u);
  std::cout << "[ model    ] 29 replays after the failure: " << took.count() << " ms, all NaN\n";
}

TEST(FailureModel, ResetThenManyCorrectCalls) {
  const TimeBound bound(Ms(60000));  // about 5 s on two idle cores
  for (bool past_entry : {false, true}) {
    Comm c(2);
    LatePeerThenReset(c, 1, past_entry);
    const Clock::time_point t0 = Clock::now();
    const Rows rows = RunCalls(c, 1000, 1000, 11 + past_entry);
    EXPECT_EQ(rows.nan + rows.wrong, 0) << rows.first_wrong;
    EXPECT_GT(rows.correct, 1000);
    ExpectIdleAndHealthy(c, 1000);
    std::cout << "[ model    ] world 2, late peer " << (past_entry ? "past entry" : "at entry")
              << ", reset, 1000 calls: " << rows.correct << " rows correct, "
              << std::chrono::duration<double>(Clock::now() - t0).count() << " s\n";
  }
  // Four ranks, the last one late past entry; then they drift apart.
  Comm c(4);
  LatePeerThenReset(c, 3, true);
  const Rows rows = RunCalls(c, 1000, 1000, 13);
  EXPECT_EQ(rows.nan + rows.wrong, 0) << rows.first_wrong;
  EXPECT_GT(rows.correct, 2000);
  ExpectIdleAndHealthy(c, 1000);
}

// The schedule a reset's barriers are there for. Calls of one token, one block. Rank 1's kernel
// of call 0 passes entry, then holds its publish until rank 0 has given up on it, entered reset
// and cleared its workspace; when rank 0 cannot clear before rank 1's kernel ends, rank 1 gives
// up holding kStall after rank 0 entered reset. Rank 0 resets and makes call 1 (the first after
// the reset: device call 0 again, the same tag, bank and token count, hence the same k tag).
// Rank 1 resets and makes call 1 once rank 0 has collected it, or kStall after rank 0 published
// it.
struct LatePublishRows {
  Rows late;   // rank 1's call 0
  Rows after;  // rank 0's call 1
};
LatePublishRows LatePublishAcrossAReset(const Rules& rules) {
  Comm c(2, rules);
  Call one;
  one.tokens = 1;
  one.blocks = 1;
  Latch late_entered, rank0_gave_up, rank0_in_reset, rank0_cleared, rank0_published,
      rank0_collected;
  Call late = one;
  late.hook = [&](Event e, int, int64_t) {
    if (e == Event::kClaimed) late_entered.CountDown();
    if (e == Event::kBeforePublish) {
      EXPECT_TRUE(rank0_gave_up.Wait());
      EXPECT_TRUE(rank0_in_reset.Wait());
      rank0_cleared.Wait(kStall);
    }
  };
  auto k1 = c.Launch(1, late);
  EXPECT_TRUE(late_entered.Wait());
  Call early = one;
  early.deadline = kFailDeadline;
  early.hook = [&](Event e, int, int64_t) {
    if (e == Event::kGaveUp) rank0_gave_up.CountDown();
  };
  auto k0 = c.Launch(0, early);
  k0->Join();
  EXPECT_EQ(c.code(0), kTimeout);

  std::shared_ptr<Kernel> after1;
  ResetOutcome reset1;
  std::thread host1([&] {
    reset1 = c.Reset(1);
    EXPECT_TRUE(rank0_published.Wait());
    rank0_collected.Wait(kStall);
    Call call = one;
    call.data = 1;
    call.deadline = Ms(500);  // without barriers rank 1 may lose rank 0's publish to its clear
    after1 = c.Launch(1, call);
    after1->Join();
  });
  rank0_in_reset.CountDown();
  const ResetOutcome reset0 = c.Reset(0);
  rank0_cleared.CountDown();
  Call call = one;
  call.data = 1;
  call.hook = [&](Event e, int, int64_t) {
    if (e == Event::kAfterPublish) rank0_published.CountDown();
    if (e == Event::kAfterCollect) rank0_collected.CountDown();
  };
  auto after0 = c.Launch(0, call);
  after0->Join();
  host1.join();
  EXPECT_TRUE(reset0.ok && reset1.ok) << reset0.error << reset1.error;
  return {c.Check(*k1), c.Check(*after0)};
}

TEST(FailureModel, ResetBarriersKeepALatePublishOut) {
  // Rank 0 cannot clear before rank 1's kernel has finished, so rank 1's late publish lands
  // before the clear: rank 1 sums rank 0's partial of call 0 (published before rank 0 gave up),
  // and rank 0's call 1 waits for rank 1's real publish.
  const TimeBound bound(Ms(3000));
  const LatePublishRows rows = LatePublishAcrossAReset(Rules{});
  EXPECT_EQ(rows.late.correct, 1) << rows.late.first_wrong;
  EXPECT_EQ(rows.after.correct, 1) << rows.after.first_wrong;
}

TEST(FailureModel, ResetWithMissingPeer) {
  // Rank 0 times out on call 0; ranks 1 and 2 give up at entry; rank 3 never calls reset.
  const TimeBound bound(Ms(3000));
  Comm c(4);
  c.Launch(0, FailingCall())->Join();
  for (int r : {1, 2}) c.Launch(r, FailingCall())->Join();
  const Ms barrier(100);
  std::vector<ResetOutcome> o(3);
  std::vector<std::thread> hosts;
  for (int r = 0; r < 3; ++r) hosts.emplace_back([&, r] { o[r] = c.Reset(r, barrier); });
  for (std::thread& t : hosts) t.join();
  for (int r = 0; r < 3; ++r) {
    EXPECT_FALSE(o[r].ok);
    EXPECT_EQ(o[r].missing, 3);
    EXPECT_TRUE(Has(o[r].error, "rank 3")) << o[r].error;
    EXPECT_GE(o[r].elapsed.count(), barrier.count());
    EXPECT_LT(o[r].elapsed.count(), barrier.count() + 500);
  }
  // The first barrier failed, so nothing was cleared: the communicator is still failed.
  EXPECT_EQ(c.code(0), kTimeout);
  for (int r : {1, 2}) EXPECT_EQ(c.code(r), kPeerFailed);
  EXPECT_FALSE(Refusal(c, 0, FailingCall(1)).empty());
  std::vector<std::shared_ptr<Kernel>> replays;
  for (int r = 0; r < 4; ++r) replays.push_back(c.Launch(r, ReplayOf(FailingCall(1))));
  const Rows rows = CheckAll(c, replays);
  EXPECT_EQ(rows.nan, 16) << rows.first_wrong;
  std::cout << "[ model    ] reset without rank 3 failed after " << o[0].elapsed.count()
            << " ms: " << o[0].error << "\n";
}

TEST(FailureModel, ResetWithAPeerLateForTheBarrier) {
  // Rank 0 gives up on the first barrier before rank 1 arrives there. Rank 1 then finds rank 0's
  // arrival, passes, clears, and fails at the second barrier, naming rank 0: one reset failed
  // with nothing cleared, the other failed after clearing. Rank 1's record is clean, so its host
  // launches again; the kernel times out on rank 0, which is still failed. Loud, never wrong, and
  // the next collective reset recovers both.
  const TimeBound bound(Ms(5000));
  Comm c(2);
  c.Launch(0, FailingCall())->Join();
  c.Launch(1, FailingCall())->Join();
  const Ms barrier(100);
  const ResetOutcome o0 = c.Reset(0, barrier);
  const ResetOutcome o1 = c.Reset(1, barrier);
  EXPECT_FALSE(o0.ok);
  EXPECT_EQ(o0.missing, 1);
  EXPECT_TRUE(Has(o0.error, "before clearing")) << o0.error;
  EXPECT_EQ(o0.cleared, Clock::time_point{});
  EXPECT_EQ(c.code(0), kTimeout);
  EXPECT_FALSE(o1.ok);
  EXPECT_EQ(o1.missing, 0);
  EXPECT_TRUE(Has(o1.error, "after clearing")) << o1.error;
  EXPECT_EQ(c.code(1), 0u);
  EXPECT_EQ(c.fault(1), 0u);

  auto again = c.Launch(1, FailingCall(1));  // the host's check passes
  auto replay = c.Launch(0, ReplayOf(FailingCall(1)));
  const Rows rows = CheckAll(c, {again, replay});
  EXPECT_EQ(rows.wrong, 0) << rows.first_wrong;
  EXPECT_EQ(rows.nan, 8);
  EXPECT_EQ(c.code(1), kTimeout);
  EXPECT_EQ(c.peer(1), 0);

  for (const ResetOutcome& o : ResetAll(c)) EXPECT_TRUE(o.ok) << o.error;
  const Rows after = RunCalls(c, 100, 1000, 23);
  EXPECT_EQ(after.nan + after.wrong, 0) << after.first_wrong;
  ExpectIdleAndHealthy(c, 100);
}

// ---------------------------------------------------------------- stops and records

// Rank 0 (two blocks, deadline kFailDeadline) waits for rank 1 (one block, a long deadline),
// which holds its first publish. Forced: rank 0's block 1 publishes and starts its wait only once
// block 0 has timed out on token 0, and block 0 records only once block 1 has stopped, so block 1
// can only have been stopped by what block 0's note marked at once (rank 0's own fault word).
// Rank 1 publishes only once rank 0's block 1 has stopped: it sums tokens 0 and 1 (published by
// rank 0 before it waited) and then waits on token 2, which rank 0 never publishes, until rank
// 0's record reaches its fault word.
struct TimeoutSchedule {
  std::shared_ptr<Kernel> early, late;
  Clock::time_point b0_gave_up, b1_gave_up, recorded, peer_gave_up;
};
TimeoutSchedule TimeoutOnOneBlock(Comm& c) {
  Latch b0_gave_up, b1_gave_up;
  Stamp t_b0, t_b1, t_recorded, t_peer;
  Call early = FailingCall();
  early.hook = [&](Event e, int block, int64_t token) {
    if (e == Event::kGaveUp) {
      (block == 0 ? t_b0 : t_b1).Set();
      (block == 0 ? b0_gave_up : b1_gave_up).CountDown();
    }
    if (e == Event::kBeforePublish && block == 1 && token == 1) {
      EXPECT_TRUE(b0_gave_up.Wait());
    }
    if (e == Event::kBeforeRecord && block == 0) {
      EXPECT_TRUE(b1_gave_up.Wait());
      t_recorded.Set();  // before the record marks rank 1's fault word
    }
  };
  Call late = FailingCall();
  late.blocks = 1;
  late.deadline = kLongDeadline;
  late.hook = [&](Event e, int, int64_t token) {
    if (e == Event::kBeforePublish && token == 0) {
      EXPECT_TRUE(b1_gave_up.Wait());
    }
    if (e == Event::kGaveUp) t_peer.Set();
  };
  TimeoutSchedule s;
  s.late = c.Launch(1, late);
  s.early = c.Launch(0, early);
  s.early->Join();
  s.late->Join();
  s.b0_gave_up = t_b0.Get();
  s.b1_gave_up = t_b1.Get();
  s.recorded = t_recorded.Get();
  s.peer_gave_up = t_peer.Get();
  return s;
}

TEST(FailureModel, TimeoutStopsTheRanksOtherBlocksAndThenItsPeers) {
  const TimeBound bound(Ms(3000));
  Comm c(2);
  const TimeoutSchedule s = TimeoutOnOneBlock(c);
  const Rows rows = CheckAll(c, {s.early, s.late});
  EXPECT_EQ(rows.wrong, 0) << rows.first_wrong;
  EXPECT_EQ(c.Check(*s.early).nan, 4);
  EXPECT_EQ(c.Check(*s.late).correct, 2);  // tokens 0 and 1
  // Rank 0's block 1 stopped at its wait's first check, on its own rank's fault word: it noted
  // code 3, not a timeout of its own, and recorded nothing (the word names rank 0 itself).
  EXPECT_EQ(s.early->timed_out.load(), 1);
  EXPECT_EQ(s.early->noted(kTimeout), 1);
  EXPECT_EQ(s.early->noted(kPeerFailed), 1);
  EXPECT_EQ(s.early->recorded.load(), 1);
  // The diagnosis: rank 0 names the late peer and the token; rank 1 names rank 0.
  EXPECT_EQ(c.code(0), kTimeout);
  EXPECT_EQ(c.peer(0), 1);
  EXPECT_EQ(c.token(0), 0);
  EXPECT_EQ(c.code(1), kPeerFailed) << c.Describe(1);
  EXPECT_EQ(c.peer(1), 0);
  EXPECT_EQ(s.late->timed_out.load(), 0);
  EXPECT_EQ(s.late->noted(kPeerFailed), 1);
  EXPECT_EQ(s.late->recorded.load(), 1);
  EXPECT_EQ(c.fault(0), 1u);
  EXPECT_EQ(c.fault(1), 1u);
  // Rank 1 stopped on rank 0's record (its fault word is marked by nothing else), well within its
  // own deadline.
  EXPECT_GE(s.peer_gave_up, s.recorded);
  EXPECT_LT(Between(s.recorded, s.peer_gave_up).count(), kLongDeadline.count() / 3);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(c.owner(r), 0u);
    EXPECT_EQ(c.blocks_done(r), 0u);
    EXPECT_EQ(c.call(r), 1u);
  }
  std::cout << "[ model    ] rank 0's block 1 stopped "
            << Between(s.b0_gave_up, s.b1_gave_up).count() << " ms after block 0's timeout; rank 1 "
            << Between(s.recorded, s.peer_gave_up).count() << " ms after rank 0's record\n";
}

// ---------------------------------------------------------------- two kernels of one rank

// Rank 0 runs kernels A (data 0) and B (data 100) at once, rank 1 its call 0 (data 0); two
// tokens, two blocks each, and the n-th pair of ids id_a, id_b. Forced: A's blocks pass their
// claim first; B's blocks publish (if they do) only after A's have; A's blocks account only once
// B's have left, so that A still owns the rank while B runs. peer_after_b: rank 1 starts once
// each of B's blocks has published or left; else it starts with A.
Rows TwoKernelsOnRank0(Comm& c, bool peer_after_b, int n = 0,
                       std::shared_ptr<Kernel>* b_kernel = nullptr) {
  Latch a_claimed(2), a_published(2), b_through(2), b_left(2);
  std::atomic<bool> b_published[2] = {{false}, {false}};
  Call a;
  a.tokens = 2;
  a.id = id_a(n);
  a.hook = [&](Event e, int, int64_t) {
    if (e == Event::kClaimed) a_claimed.CountDown();
    if (e == Event::kAfterPublish) a_published.CountDown();
    if (e == Event::kBeforeAccount) {
      EXPECT_TRUE(b_left.Wait());
    }
  };
  Call b = a;
  b.data = 100;
  b.id = id_b(n);
  b.hook = [&](Event e, int block, int64_t) {
    if (e == Event::kBeforePublish) {
      EXPECT_TRUE(a_published.Wait());
    }
    if (e == Event::kAfterPublish && !b_published[block].exchange(true)) b_through.CountDown();
    if (e == Event::kExit) {
      if (!b_published[block].exchange(true)) b_through.CountDown();
      b_left.CountDown();
    }
  };
  Call peer;
  peer.tokens = 2;
  std::vector<std::shared_ptr<Kernel>> kernels;
  kernels.push_back(c.Launch(0, a));
  if (!peer_after_b) kernels.push_back(c.Launch(1, peer));
  EXPECT_TRUE(a_claimed.Wait());
  kernels.push_back(c.Launch(0, b));
  if (b_kernel != nullptr) *b_kernel = kernels.back();
  if (peer_after_b) {
    EXPECT_TRUE(b_through.Wait());
    kernels.push_back(c.Launch(1, peer));
  }
  return CheckAll(c, kernels);
}

TEST(FailureModel, TwoConcurrentKernelsOnOneRank) {
  const TimeBound bound(Ms(10000));
  Comm c(2);
  // B's block 0 finds A owning rank 0 and B's block 1 finds A | B (or A, had it read W before B's
  // block 0's OR): both note code 2, marking rank 0's fault word, and leave. A's blocks stop on
  // that mark; rank 1, starting after B's record, gives up at entry on rank 0's fault.
  std::shared_ptr<Kernel> b;
  const Rows rows = TwoKernelsOnRank0(c, true, 0, &b);
  EXPECT_EQ(rows.wrong, 0) << rows.first_wrong;
  EXPECT_EQ(rows.nan, 6);
  EXPECT_EQ(b->not_owners.load(), 2);
  EXPECT_EQ(b->noted(kConcurrentKernel), 2);
  EXPECT_EQ(b->recorded.load(), 1);
  EXPECT_EQ(c.code(0), kConcurrentKernel);
  EXPECT_EQ(c.code(1), kPeerFailed);
  EXPECT_EQ(c.peer(1), 0);
  for (int r = 0; r < 2; ++r) {  // A advanced rank 0's call once and cleared B's bits; B not at all
    EXPECT_EQ(c.owner(r), 0u);
    EXPECT_EQ(c.blocks_done(r), 0u);
    EXPECT_EQ(c.call(r), 1u);
  }
  for (const ResetOutcome& o : ResetAll(c)) EXPECT_TRUE(o.ok) << o.error;
  ExpectIdleAndHealthy(c, 0);

  // Rank 1 running alongside: rows are correct where A and rank 1 finished before B's note and
  // record reached them, NaN elsewhere, never wrong.
  Rows mixed;
  for (int rep = 1; rep <= 20; ++rep) {
    mixed += TwoKernelsOnRank0(c, false, rep);
    EXPECT_EQ(c.code(0), kConcurrentKernel);
    for (int r = 0; r < 2; ++r) {
      EXPECT_EQ(c.owner(r), 0u);
      EXPECT_EQ(c.blocks_done(r), 0u);
    }
    for (const ResetOutcome& o : ResetAll(c)) EXPECT_TRUE(o.ok) << o.error;
  }
  EXPECT_EQ(mixed.wrong, 0) << mixed.first_wrong;
  const Rows after = RunCalls(c, 200, 1000, 17);
  EXPECT_EQ(after.nan + after.wrong, 0) << after.first_wrong;
  ExpectIdleAndHealthy(c, 200);
  std::cout << "[ model    ] two kernels beside a running peer, 20 times: " << mixed.correct
            << " rows correct, " << mixed.nan << " NaN, " << mixed.wrong << " wrong\n";
}

TEST(FailureModel, SecondKernelBeforeTheOwnersLaterBlockLeavesTheRankClaimedUntilReset) {
  // A's block 1 starts only once B's block 0 has ORed B's id into W (on the GPU: A's grid is not
  // all resident yet). It reads A | B, which is not A: it notes code 2 and does not count, so A
  // never releases the rank. W keeps {call 0, A | B} and blocks_done 1 after every kernel has
  // finished; every later kernel of rank 0 finds an owner and fails loudly, replays included,
  // until reset, whose quiesce waits out its bound (the owner half never clears; the rank's code
  // is set) and then clears.
  const TimeBound bound(Ms(5000));
  Comm c(2);
  Latch a0_claimed, b0_claimed;
  Call a;
  a.tokens = 2;
  a.id = id_a(0);
  a.hook = [&](Event e, int block, int64_t) {
    if (e == Event::kClaimed && block == 0) a0_claimed.CountDown();
    if (e == Event::kStart && block == 1) {
      EXPECT_TRUE(b0_claimed.Wait());
    }
  };
  Call b = a;
  b.data = 100;
  b.id = id_b(0);
  b.hook = [&](Event e, int block, int64_t) {
    if (e == Event::kClaimed && block == 0) b0_claimed.CountDown();
  };
  Call peer;
  peer.tokens = 2;
  auto ka = c.Launch(0, a);
  auto kp = c.Launch(1, peer);
  EXPECT_TRUE(a0_claimed.Wait());
  auto kb = c.Launch(0, b);
  const Rows rows = CheckAll(c, {ka, kb, kp});
  EXPECT_EQ(rows.wrong, 0) << rows.first_wrong;
  EXPECT_EQ(ka->owners.load(), 1);
  EXPECT_EQ(ka->not_owners.load(), 1);
  EXPECT_EQ(kb->not_owners.load(), 2);
  EXPECT_EQ(c.code(0), kConcurrentKernel);
  const uint32_t both = c.OwnerId(id_a(0)) | c.OwnerId(id_b(0));
  EXPECT_EQ(c.owner(0), both);
  EXPECT_EQ(c.blocks_done(0), 1u);
  EXPECT_EQ(c.call(0), 0u);
  EXPECT_EQ(c.code(1), kPeerFailed);  // rank 1's block 1 waited for rank 0's token 1
  EXPECT_EQ(c.peer(1), 0);

  EXPECT_FALSE(Refusal(c, 0, FailingCall(1)).empty());
  for (int data = 1; data <= 3; ++data) {
    auto replay = c.Launch(0, ReplayOf(FailingCall(data)));
    replay->Join();
    EXPECT_EQ(replay->not_owners.load(), 2);
    EXPECT_EQ(replay->recorded.load(), 0);  // the record keeps the first failure
    EXPECT_EQ(c.Check(*replay).nan, 4);
  }
  // Each replay's block 0 ORed its id in as well.
  EXPECT_EQ(c.owner(0) & both, both);
  EXPECT_EQ(c.blocks_done(0), 1u);

  const std::vector<ResetOutcome> o = ResetAll(c);
  for (const ResetOutcome& x : o) EXPECT_TRUE(x.ok) << x.error;
  EXPECT_GE(o[0].quiesced.count(), kQuiesceBound.count());
  EXPECT_LT(o[1].quiesced.count(), kQuiesceBound.count());
  ExpectIdleAndHealthy(c, 0);
  const Rows after = RunCalls(c, 50, 1000, 29);
  EXPECT_EQ(after.nan + after.wrong, 0) << after.first_wrong;
  ExpectIdleAndHealthy(c, 50);
}

// A second kernel B of rank 0 whose blocks straddle the end of the owner A: B's block 0 claims
// while A owns the rank, B's block 1 starts only once A has finished (on the GPU: B's first block
// fits beside A's persistent grid, the next one gets an SM when A's blocks leave). A's blocks
// account only once B's block 0 has claimed, so A owns the rank then. A's release stores {call 1,
// owner 0}, which clears B's bits. B's block 1 then waits for an owner.
//  - late_note false: B's block 0 notes code 2 at once, marking rank 0's fault word; A stops on
//    it (rank 1 is absent) and releases. With `third`, a replay C claims rank 0 after A's end and
//    holds it until B's block 1 has left: B's block 1 sees C. Else it sees owner 0 until its
//    deadline.
//  - late_note true: B's block 0 stalls between its claim and its note until rank 1's call 1
//    has collected a token or left. A and rank 1's call 0 complete; B's block 1 finds W free at
//    call 1; rank 1's call 1 starts once B's block 1 has published (or left).
// B's deadline (its claim wait's and its slot waits') is `deadline`. Returns the rows of rank 0's
// kernels, of rank 1's and of B, and the kernels B and C.
struct StraddleRows {
  Rows rank0, rank1, b;
  std::shared_ptr<Kernel> b_kernel, c_kernel;
};
StraddleRows StraddlingSecondKernel(Comm& c, bool late_note, bool third, Ms deadline) {
  Latch a_claimed(2), a_exited(2), b0_claimed, c_claimed, b1_left, b1_through, peer_collected;
  std::atomic<bool> b1_published{false};
  Call a;  // A stops on rank 0's fault word, or completes with rank 1, never on its deadline
  a.tokens = 2;
  a.id = id_a(0);
  a.hook = [&](Event e, int, int64_t) {
    if (e == Event::kClaimed) a_claimed.CountDown();
    if (e == Event::kBeforeAccount) {  // A owns the rank until B's block 0 has claimed
      EXPECT_TRUE(b0_claimed.Wait());
    }
    if (e == Event::kExit) a_exited.CountDown();
  };
  Call b = a;
  b.data = 100;
  b.id = id_b(0);
  b.deadline = deadline;
  b.hook = [&](Event e, int block, int64_t) {
    if (block == 0 && e == Event::kClaimed) b0_claimed.CountDown();
    if (block == 0 && e == Event::kClaimed && late_note) {
      EXPECT_TRUE(peer_collected.Wait());
    }
    if (block == 1 && e == Event::kStart) {
      EXPECT_TRUE(a_exited.Wait());
      if (third) {
        EXPECT_TRUE(c_claimed.Wait());
      }
    }
    if (block == 1 && (e == Event::kAfterPublish || e == Event::kExit) &&
        !b1_published.exchange(true)) {
      b1_through.CountDown();
    }
    if (block == 1 && e == Event::kExit) b1_left.CountDown();
  };
  std::vector<std::shared_ptr<Kernel>> kernels;
  kernels.push_back(c.Launch(0, a));
  if (late_note) {
    Call peer;
    peer.tokens = 2;
    kernels.push_back(c.Launch(1, peer));
  }
  EXPECT_TRUE(a_claimed.Wait());
  StraddleRows out;
  out.b_kernel = c.Launch(0, b);
  kernels.push_back(out.b_kernel);
  if (third) {
    EXPECT_TRUE(a_exited.Wait());
    Call cc = ReplayOf(FailingCall(2));
    cc.tokens = 2;
    cc.id = id_c(0);
    cc.hook = [&](Event e, int block, int64_t) {
      if (e == Event::kClaimed && block == 0) c_claimed.CountDown();
      if (e == Event::kBeforeAccount) {
        EXPECT_TRUE(b1_left.Wait());
      }
    };
    out.c_kernel = c.Launch(0, cc);
    kernels.push_back(out.c_kernel);
  }
  if (late_note) {
    EXPECT_TRUE(b1_through.Wait());
    kernels[1]->Join();  // stream order: rank 1's call 1 follows its call 0
    Call peer;
    peer.tokens = 2;
    peer.data = 1;
    peer.hook = [&](Event e, int, int64_t) {
      if (e == Event::kAfterCollect || e == Event::kExit) peer_collected.CountDown();
    };
    kernels.push_back(c.Launch(1, peer));
  }
  for (const auto& kn : kernels) (kn->rank == 0 ? out.rank0 : out.rank1) += CheckAll(c, {kn});
  out.b = c.Check(*out.b_kernel);
  return out;
}

TEST(FailureModel, SecondKernelStraddlingTheOwnersEndFailsLoudly) {
  // B's block 1 never takes part: it waits for an owner, sees none until its deadline (a timeout
  // naming its own rank, token -1: block 0 "never came") or sees C, another kernel (code 2), and
  // leaves without publishing or counting. No wrong row; the rank is released and counted right,
  // so replays account normally (dead at entry) until reset.
  const TimeBound bound(Ms(5000));
  for (bool third : {false, true}) {
    Comm c(2);
    const StraddleRows s = StraddlingSecondKernel(c, false, third, kFailDeadline);
    EXPECT_EQ(s.rank0.wrong, 0) << s.rank0.first_wrong;
    EXPECT_EQ(s.b.nan, 2);
    EXPECT_EQ(c.code(0), kConcurrentKernel);  // B's block 0 recorded first
    EXPECT_EQ(s.b_kernel->not_owners.load(), 2);
    EXPECT_EQ(s.b_kernel->claim_timed_out.load(), third ? 0 : 1);
    EXPECT_EQ(s.b_kernel->noted(kConcurrentKernel), third ? 2 : 1);
    if (third) {
      EXPECT_EQ(s.c_kernel->dead.load(), 2);
    }
    EXPECT_EQ(c.owner(0), 0u);
    EXPECT_EQ(c.blocks_done(0), 0u);
    EXPECT_EQ(c.call(0), third ? 2u : 1u);
    auto replay = c.Launch(0, ReplayOf(FailingCall(3)));
    replay->Join();
    EXPECT_EQ(replay->dead.load(), 2);
    EXPECT_EQ(c.Check(*replay).nan, 4);
    EXPECT_EQ(c.blocks_done(0), 0u);
    EXPECT_EQ(c.call(0), third ? 3u : 2u);
    for (const ResetOutcome& o : ResetAll(c)) EXPECT_TRUE(o.ok) << o.error;
    ExpectIdleAndHealthy(c, 0);
  }
}

TEST(FailureModel, SecondKernelStraddlingTheOwnersEndWithALateNoteFailsLoudly) {
  // Nothing is marked while B's block 1 waits: A and rank 1's call 0 complete, correct, and A
  // releases W = {call 1, owner 0}. B's block 1 sees owner 0 until its deadline, notes a timeout
  // naming its own rank and leaves, publishing nothing; its record reaches rank 1, whose call 1
  // gives up at entry. B's block 0's code 2 comes later and loses to that record: rank 0's
  // diagnosis blames its own grid's residency rather than the second kernel.
  const TimeBound bound(Ms(5000));
  Comm c(2);
  const Ms deadline(200);  // B's block 1 must not time out on rank 1 under the rejected claim
  const StraddleRows s = StraddlingSecondKernel(c, true, false, deadline);
  EXPECT_EQ(s.rank0.wrong + s.rank1.wrong, 0) << s.rank0.first_wrong << s.rank1.first_wrong;
  EXPECT_EQ(s.rank0.correct, 2);  // A
  EXPECT_EQ(s.b.nan, 2);
  EXPECT_EQ(s.rank1.correct, 2);  // call 0
  EXPECT_EQ(s.rank1.nan, 2);      // call 1
  EXPECT_EQ(s.b_kernel->claim_timed_out.load(), 1);
  EXPECT_EQ(s.b_kernel->noted(kConcurrentKernel), 1);
  EXPECT_EQ(s.b_kernel->recorded.load(), 1);
  EXPECT_EQ(c.code(0), kTimeout) << c.Describe(0);
  EXPECT_EQ(c.peer(0), 0);
  EXPECT_EQ(c.token(0), -1);
  EXPECT_EQ(c.code(1), kPeerFailed);
  EXPECT_EQ(c.peer(1), 0);
  EXPECT_EQ(c.owner(0), 0u);
  EXPECT_EQ(c.blocks_done(0), 0u);
  EXPECT_EQ(c.call(0), 1u);  // A's call only
  std::cout << "[ model    ] " << c.Describe(0) << "\n";
  for (const ResetOutcome& o : ResetAll(c)) EXPECT_TRUE(o.ok) << o.error;
  const Rows after = RunCalls(c, 100, 1000, 19);
  EXPECT_EQ(after.nan + after.wrong, 0) << after.first_wrong;
  ExpectIdleAndHealthy(c, 100);
}

// ---------------------------------------------------------------- negative controls

TEST(FailureModelNegative, ResetWithoutBarriersAcceptsALatePublish) {
  // Rank 0 clears while rank 1's kernel of call 0 still runs; its publish lands in the cleared
  // workspace under the tag that the first call after the reset uses again, and rank 0 sums it.
  const TimeBound bound(Ms(3000));
  Rules rules;
  rules.reset_barriers = false;
  const Rows rows = LatePublishAcrossAReset(rules).after;
  EXPECT_EQ(rows.wrong, 1);
  std::cout << "[ detected ] " << rows.first_wrong << "\n";
}

TEST(FailureModelNegative, WithoutTheOwnerClaimTwoKernelsMixPartials) {
  // Both kernels read call 0 and publish under its tag: B's partials overwrite A's in rank 1's
  // workspace and rank 1 sums them; B sums rank 1's partials of A's call. The call counter rises
  // by one for the two kernels.
  const TimeBound bound(Ms(3000));
  Rules rules;
  rules.claim = false;
  Comm c(2, rules);
  const Rows rows = TwoKernelsOnRank0(c, true);
  EXPECT_GE(rows.wrong, 2);
  EXPECT_EQ(c.code(0) + c.code(1), 0u);  // and nobody noticed
  EXPECT_EQ(c.call(0), 1u);
  std::cout << "[ detected ] " << rows.wrong << " wrong rows, " << rows.first_wrong << "\n";
}

TEST(FailureModelNegative, WithoutTheOwnerClaimBlocksDoneDrifts) {
  // Kernels A (two blocks) and B (three blocks) of rank 0 share blocks_done. Accounting in the
  // order A0, B0, B1, A1, B2: B1 brings it to B's count (3) and zeroes it, A1 and B2 leave 2
  // behind. Every later kernel of two blocks then counts past 1 without ever hitting it: rank
  // 0's call counter stops.
  const TimeBound bound(Ms(5000));
  Rules rules;
  rules.claim = false;
  Comm c(2, rules);
  Turns turns;
  auto in_turn = [&](int n) {
    return [&turns, n](Event e, int, int64_t) {
      if (e == Event::kBeforeAccount) {
        EXPECT_TRUE(turns.WaitFor(n));
      }
      if (e == Event::kAfterAccount) turns.Next();
    };
  };
  const int a_turn[2] = {0, 3}, b_turn[3] = {1, 2, 4};
  Call a;
  a.tokens = 2;
  a.hook = [&](Event e, int block, int64_t t) { in_turn(a_turn[block])(e, block, t); };
  Call b = a;
  b.blocks = 3;
  b.hook = [&](Event e, int block, int64_t t) { in_turn(b_turn[block])(e, block, t); };
  Call peer;
  peer.tokens = 2;
  CheckAll(c, {c.Launch(0, a), c.Launch(0, b), c.Launch(1, peer)});
  EXPECT_EQ(c.blocks_done(0), 2u);
  EXPECT_EQ(c.call(0), 1u);
  // The next call completes on both ranks, but rank 0's counter does not move.
  Call next = peer;
  next.data = 1;
  CheckAll(c, {c.Launch(0, next), c.Launch(1, next)});
  EXPECT_EQ(c.blocks_done(0), 4u);
  EXPECT_EQ(c.call(0), 1u);
  EXPECT_EQ(c.call(1), 2u);
}

TEST(FailureModelNegative, WithoutNaNFillAFailedWaitLeavesThePlausibleInput) {
  // The late-peer schedule: rank 0's rows keep the in-place input, finite and wrong.
  const TimeBound bound(Ms(3000));
  Rules rules;
  rules.nan_fill = false;
  Comm c(2, rules);
  auto early = c.Launch(0, FailingCall());
  early->Join();
  EXPECT_EQ(c.code(0), kTimeout);
  const Rows rows = c.Check(*early);
  EXPECT_EQ(rows.wrong, 4);
  for (int64_t t = 0; t < 4; ++t) EXPECT_TRUE(std::isfinite(early->q[t]));
  std::cout << "[ detected ] " << rows.first_wrong << "\n";
}

TEST(FailureModelNegative, WithoutTheFaultWordLatePeersWaitOutTheirDeadline) {
  // No wrong row without the fault word, but no quick failure either: ranks 1 and 2 run their
  // late call 0 as if nothing had happened, take rank 0's first tokens (published before it
  // gave up), and wait a full deadline for the rest. They then blame rank 0 with a timeout of
  // their own rather than reporting its failure. A wait reads no record, only the fault word, so
  // nothing stops the later replays either: out of step with rank 0, they wait out deadlines too.
  const TimeBound bound(Ms(5000));
  const Ms deadline(100);
  Rules rules;
  rules.fault_word = false;
  Comm c(3, rules);
  Rows rows;
  int dead = 0, blocks = 0;
  const Ms took = ReplaysAfterATimeout(c, deadline, rows, dead, blocks);
  EXPECT_EQ(rows.wrong, 0) << rows.first_wrong;
  EXPECT_GE(took.count(), deadline.count());
  EXPECT_LT(dead, blocks);
  for (int r : {1, 2}) {
    EXPECT_EQ(c.code(r), kTimeout) << c.Describe(r);
    EXPECT_EQ(c.peer(r), 0);
  }
  std::cout << "[ detected ] replays took " << took.count() << " ms (deadline " << deadline.count()
            << " ms); " << c.Describe(1) << "\n";
}

TEST(FailureModelNegative, WithoutTheOwnMarkTheRanksOtherBlocksWaitOutTheirDeadline) {
  // The timeout schedule with a note that marks nothing: rank 0's block 1 has no fault word to
  // see until block 0 records (held until block 1 has stopped), so it waits its whole deadline and
  // times out on its own. On the GPU the hold is the block-wide barrier before the record: a
  // group that timed out waits there for its block's other groups.
  const TimeBound bound(Ms(3000));
  Rules rules;
  rules.own_mark = false;
  Comm c(2, rules);
  const TimeoutSchedule s = TimeoutOnOneBlock(c);
  const Rows rows = CheckAll(c, {s.early, s.late});
  EXPECT_EQ(rows.wrong, 0) << rows.first_wrong;
  EXPECT_EQ(s.early->timed_out.load(), 2);
  EXPECT_EQ(s.early->noted(kPeerFailed), 0);
  EXPECT_GE(Between(s.b0_gave_up, s.b1_gave_up).count(), kFailDeadline.count());
  std::cout << "[ detected ] rank 0's block 1 stopped "
            << Between(s.b0_gave_up, s.b1_gave_up).count() << " ms after block 0's timeout\n";
}

TEST(FailureModelNegative, AcceptingAFreeOwnerLetsAStraddlingKernelRun) {
  // The straddle under the rejected claim, where a block other than block 0 takes owner 0 as
  // free. Late note: B's block 1 finds W = {call 1, owner 0}, runs call 1 and publishes B's
  // partial; rank 1's call 1 sums it (a silent wrong row, on the peer), and B's block 1 counts for
  // a kernel that never releases: blocks_done stays 1 with nobody owning the rank. Note at once:
  // B's block 1 is dead at entry but still counts, so blocks_done drifts the same way.
  const TimeBound bound(Ms(5000));
  Rules rules;
  rules.accept_free_owner = true;
  {
    Comm c(2, rules);
    const StraddleRows s = StraddlingSecondKernel(c, true, false, Ms(200));
    EXPECT_GE(s.rank1.wrong, 1);
    EXPECT_EQ(s.b_kernel->owners.load(), 1);
    EXPECT_EQ(c.owner(0), 0u);
    EXPECT_EQ(c.blocks_done(0), 1u);
    std::cout << "[ detected ] " << s.rank1.first_wrong << "; rank 0's blocks_done left at "
              << c.blocks_done(0) << "\n";
  }
  Comm c(2, rules);
  const StraddleRows s = StraddlingSecondKernel(c, false, false, kFailDeadline);
  EXPECT_EQ(s.rank0.wrong, 0) << s.rank0.first_wrong;
  EXPECT_EQ(s.b_kernel->dead.load(), 1);
  EXPECT_EQ(c.owner(0), 0u);
  EXPECT_EQ(c.blocks_done(0), 1u);
}

// ---------------------------------------------------------------- a gap in the claim

// Rank 0 runs A and B at once, where B's id contains every bit of A's (an even id and the next
// one: 0x1000 and 0x1001), so B's block 0 turns W's owner half into A | B = B. Rank 1 runs call 0.
// Two tokens, two blocks each. Forced: A's blocks pass their claim first and publish; B's block 1
// starts once B's block 0 has claimed and publishes only after A's blocks have; rank 1 starts
// once B's block 1 has published or left; B's block 0 stalls between its claim and its note until
// rank 1's block 1 and B's block 1 have each collected a token or left.
struct CoverRun {
  Rows rank0, rank1, b;
  std::shared_ptr<Kernel> a_kernel, b_kernel, peer_kernel;
};
CoverRun SecondKernelWhoseIdCoversTheOwners(Comm& c) {
  Latch a_claimed(2), a_published(2), b0_claimed, b1_through, collected(2);
  std::atomic<bool> b1_published{false}, b1_collected{false}, peer_collected{false};
  Call a;
  a.tokens = 2;
  a.id = 0x1000;
  a.hook = [&](Event e, int, int64_t) {
    if (e == Event::kClaimed) a_claimed.CountDown();
    if (e == Event::kAfterPublish) a_published.CountDown();
  };
  Call b = a;
  b.data = 100;
  b.id = 0x1001;
  b.hook = [&](Event e, int block, int64_t) {
    if (block == 0 && e == Event::kClaimed) {
      b0_claimed.CountDown();
      EXPECT_TRUE(collected.Wait());
    }
    if (block == 1 && e == Event::kStart) {
      EXPECT_TRUE(b0_claimed.Wait());
    }
    if (block == 1 && e == Event::kBeforePublish) {
      EXPECT_TRUE(a_published.Wait());
    }
    if (block == 1 && (e == Event::kAfterPublish || e == Event::kExit) &&
        !b1_published.exchange(true)) {
      b1_through.CountDown();
    }
    if (block == 1 && (e == Event::kAfterCollect || e == Event::kExit) &&
        !b1_collected.exchange(true)) {
      collected.CountDown();
    }
  };
  Call peer;
  peer.tokens = 2;
  peer.hook = [&](Event e, int block, int64_t) {
    if (block == 1 && (e == Event::kAfterCollect || e == Event::kExit) &&
        !peer_collected.exchange(true)) {
      collected.CountDown();
    }
  };
  CoverRun run;
  run.a_kernel = c.Launch(0, a);
  EXPECT_TRUE(a_claimed.Wait());
  run.b_kernel = c.Launch(0, b);
  EXPECT_TRUE(b1_through.Wait());
  run.peer_kernel = c.Launch(1, peer);
  run.rank0 = CheckAll(c, {run.a_kernel, run.b_kernel});
  run.rank1 = CheckAll(c, {run.peer_kernel});
  run.b = c.Check(*run.b_kernel);
  return run;
}

TEST(FailureModelNegative, WithPlainIdsASecondKernelWhoseIdCoversTheOwnersTakesPart) {
  // With launch ids as they come, B's id 0x1001 covers A's 0x1000, so A | B is B: B's block 1
  // sees exactly its own id, takes part in A's call 0 with nothing marked yet (it read the fault
  // word at the top), and publishes B's partial of token 1 under call 0's tag over A's. Rank 1
  // sums it: a silent wrong row on the peer, whose block completes before any failure reaches
  // it; B's own row 1 is wrong too. Three blocks count for A's two. The failure is recorded
  // (code 2, by B's block 0) only after the wrong rows are out.
  const TimeBound bound(Ms(5000));
  Rules rules;
  rules.plain_ids = true;
  Comm c(2, rules);
  const CoverRun run = SecondKernelWhoseIdCoversTheOwners(c);
  EXPECT_EQ(run.rank1.wrong, 1) << run.rank1.first_wrong;
  EXPECT_EQ(run.b.wrong, 1) << run.b.first_wrong;
  EXPECT_EQ(run.a_kernel->owners.load() + run.b_kernel->owners.load(), 3);
  EXPECT_GE(run.peer_kernel->completed.load(), 1);
  EXPECT_EQ(c.code(0), kConcurrentKernel);
  EXPECT_EQ(c.fault(1), 1u);
  std::cout << "[ detected ] " << run.rank1.first_wrong << "; " << run.b.first_wrong << "\n";
}

TEST(FailureModel, ASecondKernelWhoseLaunchIdCoversTheOwnersFailsLoudly) {
  // The same launch ids and schedule with the kernel's owner ids (constant weight): A | B is not
  // B, so B's block 1 leaves with code 2, marking rank 0's fault word (A stops on it) and,
  // through its record, rank 1's (which then gives up at entry). The rank is released and
  // counted right.
  const TimeBound bound(Ms(5000));
  Comm c(2);
  const CoverRun run = SecondKernelWhoseIdCoversTheOwners(c);
  EXPECT_EQ(run.rank0.wrong + run.rank1.wrong, 0) << run.rank0.first_wrong << run.rank1.first_wrong;
  EXPECT_EQ(run.b_kernel->not_owners.load(), 2);
  EXPECT_EQ(run.peer_kernel->dead.load(), 2);
  EXPECT_EQ(c.code(0), kConcurrentKernel);
  EXPECT_EQ(c.code(1), kPeerFailed);
  EXPECT_EQ(c.owner(0), 0u);
  EXPECT_EQ(c.blocks_done(0), 0u);
  EXPECT_EQ(c.call(0), 1u);
  for (const ResetOutcome& o : ResetAll(c)) EXPECT_TRUE(o.ok) << o.error;
  const Rows after = RunCalls(c, 100, 1000, 31);
  EXPECT_EQ(after.nan + after.wrong, 0) << after.first_wrong;
  ExpectIdleAndHealthy(c, 100);
}

}  // namespace
}  // namespace swiftqk
