// What the CPU models of the exchange protocols share: the SwiftQK slot exchange
// (protocol_model), the MiniMax-fused Lamport exchange (lamport_model) and SwiftQK's failure
// semantics (failure_model). Threads stand in for the ranks' hosts and, short-lived, for a
// kernel's blocks; relaxed atomics for the GPU's system-scope accesses; a fence for a kernel
// boundary. Here are the partial sums they exchange, the ranks and blocks as threads, random
// delays, the bounded waits, the tallies of a run with the checks on them, and the latches and
// stamps that force a schedule.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <functional>
#include <iostream>
#include <limits>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace swiftqk::model {

using Clock = std::chrono::steady_clock;
using Ms = std::chrono::milliseconds;

// Wall-clock bounds that only guard against a hang (a scenario's TimeBound, a forced schedule's
// waits, the deadlines that must not expire) stretch by this factor under ThreadSanitizer, which
// runs the models' threads several times slower; deadlines meant to expire keep their length.
#if defined(__SANITIZE_THREAD__)
constexpr int kHangBoundScale = 4;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
constexpr int kHangBoundScale = 4;
#else
constexpr int kHangBoundScale = 1;
#endif
#else
constexpr int kHangBoundScale = 1;
#endif

// ---------------------------------------------------------------- the data exchanged

inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/// The hash behind partial sum `which` (0 = q, 1 = k) of a call, token and rank.
inline uint64_t partial_hash(uint64_t seed, int call_index, int64_t token, int rank, int which) {
  return splitmix64(seed ^
                    splitmix64((static_cast<uint64_t>(call_index) << 24) ^
                               (static_cast<uint64_t>(token) << 5) ^
                               (static_cast<uint64_t>(rank) << 1) ^ static_cast<uint64_t>(which)));
}

/// A nonnegative partial sum of squares with a full mantissa, from its hash.
inline float partial_from_hash(uint64_t h) {
  return static_cast<float>(h >> 40) * (100.0f / 16777216.0f) + 0.001f;
}

inline uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
inline float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

/// Partial sum `which` (0 = q, 1 = k) of a call's data, token and rank.
inline float partial(uint64_t seed, int call_index, int64_t token, int rank, int which) {
  return partial_from_hash(partial_hash(seed, call_index, token, rank, which));
}

/// A SwiftQK slot word: {value bits | tag << 32}.
inline uint64_t pack_word(float value, uint32_t tag) {
  return static_cast<uint64_t>(float_bits(value)) | (static_cast<uint64_t>(tag) << 32);
}
inline uint32_t word_tag(uint64_t w) { return static_cast<uint32_t>(w >> 32); }
inline float word_value(uint64_t w) { return bits_float(static_cast<uint32_t>(w)); }

/// A token's q and k sums of squares.
struct Sums {
  float q = 0.f, k = 0.f;
};

/// The world's values of one token summed in rank order 0..world-1, in float, as every rank of
/// the kernel adds them; value_of(j) is rank j's.
template <typename ValueOf>
Sums sum_in_rank_order(int world, ValueOf&& value_of) {
  Sums s;
  for (int j = 0; j < world; ++j) {
    const Sums v = value_of(j);
    s.q += v.q;
    s.k += v.k;
  }
  return s;
}

/// Bitwise equality: a sum is right only if it is exactly the sum every rank computes.
inline bool same_bits(const Sums& a, const Sums& b) {
  return float_bits(a.q) == float_bits(b.q) && float_bits(a.k) == float_bits(b.k);
}

// ---------------------------------------------------------------- ranks, blocks and time

/// A kernel boundary: it orders everything a rank did before it before what it does after, for
/// observers on other GPUs too.
void kernel_boundary();

/// Once in `one_in` draws: a yield or a sleep of up to max_us microseconds, so that ranks and
/// blocks drift apart.
void maybe_delay(std::mt19937_64& rng, int one_in, int max_us);

/// Runs host(r) for every rank r of `world`, each on its own thread, and joins them.
void on_every_rank(int world, const std::function<void(int rank)>& host);

/// One kernel of a rank: block(b, seed) for b in [0, blocks), each on its own thread, with a
/// seed drawn from `seeds` in block order; returns once every block has left.
void run_blocks(int blocks, std::mt19937_64& seeds,
                const std::function<void(int block, uint64_t seed)>& block);

/// A bounded wait over `have.size()` lanes, one per rank's slot: polls every lane not yet in
/// with poll(j) (true: lane j is in) until all are. Between passes it yields, and once
/// yield_passes passes have gone by it sleeps 20 us instead (with many more spinning threads
/// than cores, yielding alone burns the time the ranks being waited for need). Every 64 passes
/// it asks give_up() whether to stop. Returns true when every lane is in, false when it gave up.
template <typename Poll, typename GiveUp>
bool poll_lanes(std::vector<char>& have, Poll&& poll, GiveUp&& give_up,
                uint32_t yield_passes = std::numeric_limits<uint32_t>::max()) {
  std::fill(have.begin(), have.end(), 0);
  std::size_t missing = have.size();
  for (uint32_t pass = 1;; ++pass) {
    for (std::size_t j = 0; j < have.size(); ++j) {
      if (!have[j] && poll(static_cast<int>(j))) {
        have[j] = 1;
        --missing;
      }
    }
    if (missing == 0) return true;
    if (pass < yield_passes) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
    if ((pass & 63u) == 0u && give_up()) return false;
  }
}

// ---------------------------------------------------------------- a run's tallies

/// What a run of an exchange model counted; a model's outcome adds its own counters.
struct Tally {
  int64_t exchanges = 0;            // tokens summed correctly, over all ranks
  int64_t wrong_sums = 0;           // sums that differ from the independent expectation
  int64_t timeouts = 0;             // waits that ran past the deadline
  int64_t run_ahead = 0;            // calls started while a peer had not finished the last
  int64_t writes_into_lagging = 0;  // publishes into a rank still in its previous call
  int64_t lag_violations = 0;       // a peer found two calls behind (impossible)
  std::string first_failure;
};

/// The ranks of an exchange model as they run: one host thread each, the calls each has
/// completed, the counters of a Tally, and the first failure, which makes every other waiter
/// give up (like the kernel's failure record).
class SimulatedRanks {
 public:
  SimulatedRanks(int world, bool random_delays);

  /// Runs rank_main(r) for every rank on its own thread; returns what they counted.
  Tally Run(const std::function<void(int rank)>& rank_main);

  /// Rank r starts a call having completed `done`: a peer may still be in r's previous call
  /// (run-ahead), never in an earlier one (lag violation).
  void StartCall(int r, int64_t done);
  /// Rank r's kernel has finished: it has completed `done` calls.
  void FinishCall(int r, int64_t done);
  /// Rank r, in the call after its `done`-th, writes into peer j: true (and counted) if j is
  /// still in an earlier call.
  bool WriteInto(int j, int64_t done);

  /// maybe_delay, when the run has random delays.
  void MaybeDelay(std::mt19937_64& rng, int one_in, int max_us) const;

  bool aborted() const { return abort_.load(std::memory_order_relaxed); }
  void Exchanged() { exchanges_.fetch_add(1, std::memory_order_relaxed); }
  void WrongSum(const std::string& what) { Fail(wrong_sums_, what); }
  void TimedOut(const std::string& what) { Fail(timeouts_, what); }

 private:
  void Fail(std::atomic<int64_t>& counter, const std::string& what);

  const int world_;
  const bool random_delays_;
  std::vector<std::atomic<int64_t>> finished_;  // calls each rank has completed
  std::atomic<bool> abort_{false};
  std::atomic<int64_t> exchanges_{0}, wrong_sums_{0}, timeouts_{0}, run_ahead_{0},
      writes_into_lagging_{0}, lag_violations_{0};
  std::mutex mu_;
  std::string first_failure_;
};

/// Exchanges a run makes when nothing fails: every rank sums every token of every host-level
/// call, where tokens(i, draw) is call i's token count from the i-th output of the generator
/// (seeded with `seed`) that every rank replays.
int64_t expected_exchanges(int world, int calls, uint64_t seed,
                           const std::function<int64_t(int call, uint64_t draw)>& tokens);

/// A run of the real protocol: no wrong sum, no timeout, no lag violation, every exchange made.
/// With `interleavings`, the ones that matter did happen too: ranks started a call while a peer
/// was still in the previous one, and wrote into its workspace meanwhile.
void expect_correct_run(const Tally& o, int64_t expected, bool interleavings);

/// A forced schedule under the real protocol: nothing failed and every exchange was made.
void expect_clean_run(const Tally& o, int64_t expected);

// ---------------------------------------------------------------- forced schedules

/// Fails the test if the scope it guards runs past `limit`: nothing may hang.
class TimeBound {
 public:
  explicit TimeBound(Ms limit) : limit_(limit * kHangBoundScale) {}
  ~TimeBound();
  TimeBound(const TimeBound&) = delete;
  TimeBound& operator=(const TimeBound&) = delete;

 private:
  const Clock::time_point start_ = Clock::now();
  const Ms limit_;
};

/// Runs a broken variant of a protocol (a negative control), which must not hang, and says what
/// it detected.
template <typename Run>
auto run_negative_control(Run&& run) {
  const TimeBound bound(Ms(5000));
  auto o = run();
  std::cout << "[ detected ] " << (o.first_failure.empty() ? "nothing" : o.first_failure) << "\n";
  return o;
}

/// How long a forced schedule waits for its turn: generous, so that a wait only runs out when
/// the schedule is broken.
constexpr Ms kScheduleTimeout{2000 * kHangBoundScale};

/// Counts down to zero once; Wait returns whether it got there within the timeout.
class Latch {
 public:
  explicit Latch(int count = 1) : count_(count) {}
  void CountDown();
  bool Wait(Ms timeout = kScheduleTimeout);

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int count_;
};

/// A sequence of turns: WaitFor(n) returns once the turns before n have been taken.
class Turns {
 public:
  bool WaitFor(int n, Ms timeout = kScheduleTimeout);
  void Next();

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int turn_ = 0;
};

/// A time point that a hook sets once and the test reads after joining.
class Stamp {
 public:
  void Set();
  Clock::time_point Get();

 private:
  std::mutex mu_;
  Clock::time_point t_{};
};

inline Ms between(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration_cast<Ms>(to - from);
}

}  // namespace swiftqk::model
