// A CPU model of SwiftQK's failure semantics: what the kernel (src/kernels/swiftqk_fused.cuh,
// rank_claim.cuh, exchange_lanes.cuh, exchange.cuh, lamport_exchange.cuh) and the host do when a
// wait fails, when two kernels of one communicator run at once, and how a collective reset
// recovers. As in the slot exchange model (protocol_model.hpp, which covers the happy path),
// threads stand in for the ranks' hosts, short-lived worker threads for a kernel's blocks (one
// token group per block, so a block's thread is also its thread 0), and relaxed atomics for the
// GPU's system-scope accesses. Every output row of every rank and kernel is checked: it either
// equals the exact sum of the call's partials (summed on the host in rank order) or is NaN. A wrong
// finite row is a silent wrong answer and fails the test.
//
// What is modelled, per rank, and where it is in the kernel:
//  - The slots, as in protocol_model.hpp: slot_offset() in a workspace per rank, a slot is
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
//    A kernel of one block a rank skips the count and stores W alone.
//  - Reset, collective: quiesce (join the rank's kernels, then wait for W's owner half to be 0,
//    giving up after kQuiesceBound if the rank's code is set, since the owner half may stay set
//    for good after a failure; failing if it is not), barrier, clear the rank's slots, fault word,
//    record, blocks_done and W := 0, barrier. Each barrier has a deadline; a rank that does not
//    arrive makes reset fail naming it.
//  - The host refuses to launch (throws swiftqk::Error) while its rank's record is set, except
//    for graph replays, which launch without the host (Call::replay).
// A kernel boundary orders what a rank did before it, as in protocol_model.hpp: one at the start
// and end of every block. A call's inputs are named by a data index: rank r publishes
// model::partial(seed, data, t, r). Every row starts as the rank's own partials, standing in for
// an in-place input: finite and plausible, and wrong.
//
// Interleavings that matter are forced, not hoped for: a Call's hook runs at fixed points of each
// block (Event), and the scenarios (test_failure_model_*.cpp) hold blocks there on latches or
// sleeps with generous margins, so every scenario, and above all every negative control, takes
// the same path on every run. Each knob of Rules breaks one rule of the protocol (the negative
// controls).#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "harness.hpp"

namespace swiftqk::model::failure {

constexpr uint32_t kTimeout = 1;
constexpr uint32_t kConcurrentKernel = 2;
constexpr uint32_t kPeerFailed = 3;

// A wait meant to expire; one that must not (a hang then fails the test instead); how late a
// late peer is; reset's quiesce bound (the kernel's is 2 x timeout + 1 s; here every kernel has
// been joined before, so it only bounds the wait for an owner half that stays set); reset's
// barrier deadline (above a failing kernel's deadline plus the stall, so a barrier only fails on
// a rank that really does not come).
constexpr Ms kFailDeadline{30};
constexpr Ms kLongDeadline{3000 * kHangBoundScale};
constexpr Ms kStall{100};
constexpr Ms kQuiesceBound{60};
constexpr Ms kBarrierDeadline{2000 * kHangBoundScale};
constexpr int64_t kCapacity = 8;  // slots per bank; calls have 1..kCapacity tokens

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
  Rows& operator+=(const Rows& o);
  int64_t total() const { return correct + nan + wrong; }
};

class Comm;

// One kernel launch of one rank: its blocks' threads, its output rows and how its blocks left.
class Kernel {
 public:
  Kernel(int rank_, uint32_t id_, Call call_);
  ~Kernel() { Join(); }
  Kernel(const Kernel&) = delete;
  Kernel& operator=(const Kernel&) = delete;

  void Join();
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
  void Exited();

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

// The ranks of one communicator: each rank's workspace and device state, its host's launches
// and resets, and the blocks of its kernels as threads.
class Comm {
 public:
  explicit Comm(int world, Rules rules = {}, uint64_t seed = 1);
  ~Comm();

  int world() const { return world_; }

  // The host's launch: refused while the rank's record is set, unless it is a replay.
  std::shared_ptr<Kernel> Launch(int r, Call call);

  // The collective reset of rank r, run by its host.
  ResetOutcome Reset(int r, Ms barrier_deadline = kBarrierDeadline);

  // The owner id that launch id `id` claims with.
  uint32_t OwnerId(uint32_t id) const;

  // Device state, read by the tests once the kernels that write it have finished.
  uint32_t code(int r) const { return ranks_[r]->code.load(); }
  int peer(int r) const { return ranks_[r]->peer.load(); }
  int64_t token(int r) const { return ranks_[r]->token.load(); }
  uint64_t fault(int r) const { return ranks_[r]->fault.load(); }
  uint32_t owner(int r) const;
  uint32_t call(int r) const;
  uint32_t blocks_done(int r) const { return ranks_[r]->blocks_done.load(); }

  // What the host says when it refuses a launch.
  std::string Describe(int r) const;

  // Every row of a finished kernel: the exact sum (rank order, as every rank adds), NaN, or wrong.
  Rows Check(const Kernel& kn) const;

 private:
  struct RankState {
    explicit RankState(std::size_t words);
    std::unique_ptr<std::atomic<uint64_t>[]> ws;  // the slots
    std::atomic<uint32_t> code{0};                // the failure record
    std::atomic<int> peer{-1};
    std::atomic<int64_t> token{-1};
    std::atomic<uint64_t> fault{0};
    std::atomic<uint64_t> owner{0};  // W
    std::atomic<uint32_t> blocks_done{0};
    // Host side, outside the workspace (reset does not clear it): barrier arrivals, resets begun
    // (each numbers its two barriers), and the kernels launched and not yet joined by a reset.
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

  void JoinAll(int r);
  bool Quiesce(int r, ResetOutcome& o);
  bool Barrier(int r, int epoch, Ms deadline, const char* where, ResetOutcome& o);
  bool FaultSet(const RankState& s) const;
  void MarkFault(int j, int failing);
  bool RecordFailure(int r, uint32_t code, int peer, int64_t token);
  void NoteStop(Kernel& kn, Note& note, uint32_t code, int peer, int64_t token);
  uint32_t RecordNote(Kernel& kn, const Note& note);
  void Account(Kernel& kn, int b, RankState& s, uint32_t call);
  static void FillNaN(Kernel& kn, int64_t from);
  void Publish(const Kernel& kn, int64_t t, uint32_t tag, uint32_t ktag, int bank,
               std::mt19937_64& rng);
  bool Collect(Kernel& kn, RankState& s, int64_t t, uint32_t tag, uint32_t ktag, int bank,
               Note& note, std::mt19937_64& rng);
  uint64_t Claim(const Kernel& kn, int b, RankState& s, bool& failed_at_entry);
  void Block(Kernel& kn, int b);

  const int world_;
  const Rules rules_;
  const uint64_t seed_;
  std::size_t words_ = 0;
  std::vector<std::unique_ptr<RankState>> ranks_;
  std::atomic<uint32_t> next_id_{1};
};

}  // namespace swiftqk::model::failure
