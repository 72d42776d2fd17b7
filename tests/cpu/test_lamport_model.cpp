// A CPU model of the MiniMax-fused baseline's Lamport exchange (src/kernels/lamport_exchange.cuh
// and the kLamport parts of swiftqk_fused_kernel in src/kernels/swiftqk_fused.cuh), with one
// std::thread per rank and short-lived worker threads per call standing in for the rank's blocks.
// It shows that three rotating buffers, each cleared by the call after the one that used it for
// the token count that call had, stay correct while ranks drift apart and token counts shrink and
// grow, and, with deliberately broken variants, that the model does detect a broken protocol.
//
// What is modelled, as in the kernel:
//  - Each rank owns kLamportBuffers x capacity x world slots laid out by lamport_slot_offset();
//    a slot is four 32-bit words, each its own relaxed atomic. The kernel's 16-byte accesses
//    (st/ld.relaxed.sys.v4.b32, and the uint4 store of the clearing) are not single-copy atomic
//    as a whole, so the model stores and loads the four words one at a time in a random order.
//    Every word starts as kLamportEmpty (-0.0), as mark_lamport_empty() leaves it.
//  - Each rank keeps its device state {lamport_call, lamport_tokens}, starting at {0, 0}. Calls
//    of 0 tokens are skipped on every rank without touching it (launch.cu returns before
//    launching); the token counts come from a seeded generator every rank replays identically.
//  - A call of T tokens runs W = min(drawn, T) workers ("blocks": plan_grid never launches more
//    blocks than tokens). At kernel start every worker refills with -0.0, grid-stride over
//    lamport_tokens x world slots (slot i = b, b + W, ...), this rank's slots of buffer
//    (lamport_call + 2) % 3; then worker b handles tokens b, b + W, ... in increasing order: it
//    computes the rank's (q, k) partials, maps a -0.0 bit pattern to +0.0 (lamport_word), stores
//    {q, k, 0, 0} into slot [lamport_call][t][rank] of EVERY rank (its own included), waits with a
//    deadline until none of the four words of any of the world slots [lamport_call][t][*] of its
//    own workspace is -0.0, and sums q and k in rank order in float. The sum is compared bitwise
//    with an independent evaluation of the same partials.
//  - There is no barrier between one worker's clearing and another worker's tokens (the kernel has
//    no grid barrier). Moreover the clearing stores are weak stores with no fence before the
//    worker's publishes, so nothing orders them before those publishes for observers on other
//    GPUs: the model lets some workers' clearing stores land late, in the middle of or after their
//    token loop, but always before the kernel ends (kernel completion orders them).
//  - When all workers of a rank have been joined (the kernel has finished), the rank sets
//    lamport_tokens = T and lamport_call = (lamport_call + 1) % 3, as the last block does.
//  - A kernel boundary orders everything a rank did in one call before what it does in the next,
//    for observers on other GPUs too: a fence at the start and at the end of every worker. The
//    slot accesses themselves stay relaxed.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <memory>
#include <mutex>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "model_helpers.hpp"
#include "protocol.hpp"

namespace swiftqk {
namespace {

using Clock = std::chrono::steady_clock;

static_assert(kSlotBytes == 16, "a Lamport slot is four 32-bit words");
static_assert(kLamportBuffers == 3, "the model's real protocol rotates three buffers");

// Which buffer, and how many tokens of it, a call refills at kernel start.
enum class ClearRule {
  kPrevious,        // the kernel: buffer (call + B - 1) % B, lamport_tokens tokens
  kNone,            // broken: nothing is cleared
  kCurrent,         // broken: buffer call (the one this call uses), lamport_tokens tokens
  kMinTokens,       // broken: the previous buffer, min(T, lamport_tokens) tokens
  kThisCallTokens,  // broken: the previous buffer, T tokens (the host's count, not the device's)
};

struct Knobs {
  int world = 2;
  int calls = 2000;       // host-level calls, including the 0-token ones
  int64_t capacity = 16;  // tokens per call are drawn from [0, capacity]
  int max_workers = 3;    // "blocks" per rank and call, drawn from [1, max_workers], at most T
  uint64_t seed = 1;
  bool random_delays = true;
  int zero_one_in = 24;                // a partial is -0.0 (and +0.0) once in 2 * zero_one_in
  std::vector<int64_t> token_pattern;  // non-empty: call i has token_pattern[i % size] tokens
  std::chrono::milliseconds deadline{10000};  // per token wait; a hang fails instead
  // Forced schedules (no effect at -1).
  int slow_rank = -1;  // sleeps slow_us before publishing each token
  int slow_us = 0;
  int late_rank = -1;  // its clearing lands after its last token, late_us after it
  int late_us = 0;
  int torn_rank = -1;  // stores the q word first, then sleeps torn_us, then the other words
  int torn_us = 0;
  // Broken variants (negative controls); the defaults are the real protocol.
  int buffers = kLamportBuffers;
  ClearRule clear = ClearRule::kPrevious;
  bool map_negative_zero = true;  // false: a -0.0 partial is stored as is (reads as empty)
  bool check_all_words = true;    // false: the reader checks the q word only
  // Model options.
  bool late_clears = true;  // false: clearing stores land in program order (before the tokens)
};

struct Outcome {
  int64_t exchanges = 0;                 // tokens summed successfully, over all ranks
  int64_t wrong_sums = 0;                // sums that differ from the independent expectation
  int64_t timeouts = 0;                  // waits that ran past the deadline
  int64_t run_ahead = 0;                 // calls started while a peer had not finished the last
  int64_t lag_violations = 0;            // a peer found two calls behind (impossible)
  int64_t writes_into_lagging = 0;       // publishes into a rank still in its previous call
  int64_t writes_during_peer_clear = 0;  // ... whose clearing had not all landed yet
  int64_t late_clears = 0;               // slots cleared after their worker's first publish
  int64_t negative_zeros = 0;            // -0.0 partials published
  int64_t positive_zeros = 0;            // +0.0 partials published
  std::string first_failure;
};

#if defined(__SANITIZE_THREAD__)
#define SWIFTQK_MODEL_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define SWIFTQK_MODEL_TSAN 1
#endif
#endif

// A kernel boundary. ThreadSanitizer does not support std::atomic_thread_fence (GCC rejects it
// with -Werror=tsan), so under TSan a seq_cst read-modify-write of one shared word stands in: it
// orders all boundaries in one total order, which TSan does understand (every shared word of the
// model is an atomic anyway, so TSan checks the harness, not the protocol's orderings).
#ifdef SWIFTQK_MODEL_TSAN
std::atomic<uint64_t> g_kernel_boundaries{0};
void kernel_boundary() { g_kernel_boundaries.fetch_add(1, std::memory_order_seq_cst); }
#else
void kernel_boundary() { std::atomic_thread_fence(std::memory_order_seq_cst); }
#endif

using model::bits_float;
using model::float_bits;
using model::splitmix64;

// Deterministic partial sums of call `call_index` (host-level), token, rank: nonnegative floats
// with full mantissas, exactly -0.0 or +0.0 now and then.
float partial(const Knobs& k, int call_index, int64_t token, int rank, int which) {
  const uint64_t h = model::partial_hash(k.seed, call_index, token, rank, which);
  if (k.zero_one_in > 0) {
    const uint64_t z = (h >> 8) % (2 * static_cast<uint64_t>(k.zero_one_in));
    if (z == 0) return -0.0f;
    if (z == 1) return 0.0f;
  }
  return model::partial_from_hash(h);
}

// The writer's word for a value, as lamport_word() computes it.
uint32_t slot_word(float v, bool map_negative_zero) {
  const uint32_t b = float_bits(v);
  return map_negative_zero && b == kLamportEmpty ? 0u : b;
}

// Tokens of host-level call i; `draw` is the i-th output of the generator every rank replays.
int64_t tokens_of_call(const Knobs& k, int i, uint64_t draw) {
  if (!k.token_pattern.empty()) return k.token_pattern[i % k.token_pattern.size()];
  // Always within [0, capacity], as launch.cu chunks larger calls.
  const int64_t x = static_cast<int64_t>(draw >> 8);
  switch (draw % 16) {
    case 0:
    case 1:
      return 0;  // skipped by the host
    case 2:
    case 3:
    case 4:
    case 5:
      return std::min<int64_t>(k.capacity, 1 + x % 3);  // few: much of a large call to clear
    case 6:
    case 7:
      return k.capacity;
    default:
      return 1 + x % k.capacity;
  }
}

class Model {
 public:
  explicit Model(const Knobs& k) : k_(k), finished_(k.world), clearing_(k.world) {
    words_ = (lamport_slot_offset(k.world, k.capacity, kLamportBuffers, 0, 0) -
              lamport_offset(k.world, k.capacity)) /
             4;
    for (int r = 0; r < k.world; ++r) {
      ws_.emplace_back(new std::atomic<uint32_t>[words_]);
      for (std::size_t i = 0; i < words_; ++i) {
        ws_.back()[i].store(kLamportEmpty, std::memory_order_relaxed);
      }
      finished_[r].store(0, std::memory_order_relaxed);
      clearing_[r].store(0, std::memory_order_relaxed);
    }
  }

  Outcome Run() {
    std::vector<std::thread> ranks;
    for (int r = 0; r < k_.world; ++r) ranks.emplace_back([this, r] { RankMain(r); });
    for (std::thread& t : ranks) t.join();
    Outcome o;
    o.exchanges = exchanges_.load();
    o.wrong_sums = wrong_sums_.load();
    o.timeouts = timeouts_.load();
    o.run_ahead = run_ahead_.load();
    o.lag_violations = lag_violations_.load();
    o.writes_into_lagging = writes_into_lagging_.load();
    o.writes_during_peer_clear = writes_during_peer_clear_.load();
    o.late_clears = late_clears_.load();
    o.negative_zeros = negative_zeros_.load();
    o.positive_zeros = positive_zeros_.load();
    o.first_failure = first_failure_;
    return o;
  }

 private:
  // What a rank's kernel reads from its device state and its launch arguments.
  struct Kernel {
    int rank;
    int call_index;  // host-level call number (selects the partials)
    int64_t n;       // this rank's kernels completed before this one
    int buf;         // lamport_call
    int64_t tokens;  // T
    int workers;     // W (blocks_per_rank)
    int clear_buf;
    int64_t clear_tokens;
  };

  // Index of the first word of slot [buf][token][src] in a rank's Lamport buffers.
  std::size_t word_index(int buf, int64_t token, int src) const {
    return (lamport_slot_offset(k_.world, k_.capacity, buf, token, src) -
            lamport_offset(k_.world, k_.capacity)) /
           4;
  }

  void Fail(std::atomic<int64_t>& counter, const std::string& what) {
    counter.fetch_add(1);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (first_failure_.empty()) first_failure_ = what;
    }
    abort_.store(true);  // like the kernel's failure record: every other waiter gives up
  }

  void MaybeDelay(std::mt19937_64& rng, int one_in, int max_us) {
    if (k_.random_delays) model::maybe_delay(rng, one_in, max_us);
  }

  // Stores four words one at a time in a random order (a 16-byte store is not single-copy
  // atomic); a torn writer stores the q word first and the rest torn_us later.
  void StoreSlot(std::atomic<uint32_t>* slot, const std::array<uint32_t, 4>& v,
                 std::mt19937_64& rng, bool torn) {
    std::array<int, 4> order = {0, 1, 2, 3};
    if (torn) {
      std::shuffle(order.begin() + 1, order.end(), rng);
    } else {
      std::shuffle(order.begin(), order.end(), rng);
    }
    for (int i = 0; i < 4; ++i) {
      slot[order[i]].store(v[order[i]], std::memory_order_relaxed);
      if (torn && i == 0) std::this_thread::sleep_for(std::chrono::microseconds(k_.torn_us));
      if (i < 3) MaybeDelay(rng, 512, 50);
    }
  }

  void RankMain(int r) {
    std::mt19937_64 host_rng(k_.seed);  // the same sequence on every rank: they agree on T
    std::mt19937_64 rank_rng(splitmix64(k_.seed * 1000003 + static_cast<uint64_t>(r)));
    uint32_t lamport_call = 0, lamport_tokens = 0;  // this rank's device state
    int64_t n = 0;                                  // kernels this rank has completed
    for (int i = 0; i < k_.calls && !abort_.load(); ++i) {
      const int64_t tokens = tokens_of_call(k_, i, host_rng());
      if (tokens == 0) continue;  // the host returns early: no launch, no state change

      // Progress bookkeeping: a peer may still be in our previous call (run-ahead), never in an
      // earlier one (lag violation).
      for (int o = 0; o < k_.world; ++o) {
        if (o == r) continue;
        const int64_t f = finished_[o].load(std::memory_order_relaxed);
        if (f < n) run_ahead_.fetch_add(1, std::memory_order_relaxed);
        if (f < n - 1) lag_violations_.fetch_add(1, std::memory_order_relaxed);
      }

      Kernel kn;
      kn.rank = r;
      kn.call_index = i;
      kn.n = n;
      kn.buf = static_cast<int>(lamport_call);
      kn.tokens = tokens;
      kn.workers = static_cast<int>(
          std::min<int64_t>(tokens, 1 + static_cast<int64_t>(rank_rng() % k_.max_workers)));
      const int previous = static_cast<int>((lamport_call + k_.buffers - 1) % k_.buffers);
      switch (k_.clear) {
        case ClearRule::kPrevious:
          kn.clear_buf = previous;
          kn.clear_tokens = lamport_tokens;
          break;
        case ClearRule::kNone:
          kn.clear_buf = previous;
          kn.clear_tokens = 0;
          break;
        case ClearRule::kCurrent:
          kn.clear_buf = kn.buf;
          kn.clear_tokens = lamport_tokens;
          break;
        case ClearRule::kMinTokens:
          kn.clear_buf = previous;
          kn.clear_tokens = std::min<int64_t>(tokens, lamport_tokens);
          break;
        case ClearRule::kThisCallTokens:
          kn.clear_buf = previous;
          kn.clear_tokens = tokens;
          break;
      }
      std::vector<std::thread> blocks;
      for (int b = 0; b < kn.workers; ++b) {
        const uint64_t worker_seed = rank_rng();
        blocks.emplace_back([this, kn, b, worker_seed] { Worker(kn, b, worker_seed); });
      }
      for (std::thread& t : blocks) t.join();
      // The kernel has finished: its last block advanced the device state.
      lamport_tokens = static_cast<uint32_t>(tokens);
      lamport_call = (lamport_call + 1) % static_cast<uint32_t>(k_.buffers);
      finished_[r].store(n + 1, std::memory_order_relaxed);
      ++n;
      MaybeDelay(rank_rng, 12, 300);
    }
  }

  void Worker(const Kernel& kn, int b, uint64_t seed) {
    kernel_boundary();  // kernel start
    std::mt19937_64 rng(seed);
    const int r = kn.rank;
    const int world = k_.world;
    const int W = kn.workers;
    std::atomic<uint32_t>* mine = ws_[r].get();
    MaybeDelay(rng, 4, 200);  // blocks start at different times

    // The clearing, grid-stride over this rank's slots [clear_buf][0, clear_tokens)[*]. Each slot
    // gets a landing point: 0 = before the first token (program order), j = after the j-th token
    // of this worker. Some workers' clearing lands late (allowed: no fence before the publishes).
    const int64_t my_tokens = (kn.tokens - b + W - 1) / W;  // >= 1 since W <= T
    const bool forced_late = r == k_.late_rank;
    const bool late = forced_late || (k_.late_clears && k_.random_delays && rng() % 4 == 0);
    std::vector<std::pair<int64_t, int64_t>> clears;  // (landing point, slot)
    for (int64_t s = b; s < kn.clear_tokens * world; s += W) {
      const int64_t land =
          forced_late ? my_tokens : (late ? static_cast<int64_t>(rng() % (my_tokens + 1)) : 0);
      clears.emplace_back(land, s);
    }
    std::stable_sort(clears.begin(), clears.end(),
                     [](const auto& x, const auto& y) { return x.first < y.first; });
    if (!clears.empty()) clearing_[r].fetch_add(1, std::memory_order_relaxed);
    std::size_t landed = 0;
    const std::array<uint32_t, 4> empty = {kLamportEmpty, kLamportEmpty, kLamportEmpty,
                                           kLamportEmpty};
    auto land_clears = [&](int64_t upto) {
      if (landed == clears.size()) return;
      while (landed < clears.size() && clears[landed].first <= upto) {
        const int64_t s = clears[landed].second;
        StoreSlot(mine + word_index(kn.clear_buf, s / world, static_cast<int>(s % world)), empty,
                  rng, false);
        if (clears[landed].first > 0) late_clears_.fetch_add(1, std::memory_order_relaxed);
        ++landed;
        MaybeDelay(rng, 64, 100);
      }
      if (landed == clears.size()) clearing_[r].fetch_sub(1, std::memory_order_relaxed);
    };
    land_clears(0);

    std::vector<std::array<uint32_t, 4>> got(world);
    std::vector<char> have(world);
    std::vector<int> targets(world);
    for (int j = 0; j < world; ++j) targets[j] = j;
    int64_t done_tokens = 0;
    for (int64_t t = b; t < kn.tokens; t += W) {
      if (abort_.load(std::memory_order_relaxed)) return;
      const float q = partial(k_, kn.call_index, t, r, 0);
      const float k = partial(k_, kn.call_index, t, r, 1);
      for (float v : {q, k}) {
        if (float_bits(v) == kLamportEmpty) negative_zeros_.fetch_add(1, std::memory_order_relaxed);
        if (float_bits(v) == 0u) positive_zeros_.fetch_add(1, std::memory_order_relaxed);
      }
      if (r == k_.slow_rank) std::this_thread::sleep_for(std::chrono::microseconds(k_.slow_us));
      MaybeDelay(rng, 32, 200);

      // Publish {q, k, 0, 0} into slot [buf][t][r] of every rank, own workspace included; lanes
      // store in parallel, so peers see the copies in any order.
      const std::array<uint32_t, 4> v = {slot_word(q, k_.map_negative_zero),
                                         slot_word(k, k_.map_negative_zero), 0u, 0u};
      std::shuffle(targets.begin(), targets.end(), rng);
      for (int j : targets) {
        if (j != r && finished_[j].load(std::memory_order_relaxed) < kn.n) {
          writes_into_lagging_.fetch_add(1, std::memory_order_relaxed);
          if (clearing_[j].load(std::memory_order_relaxed) > 0) {
            writes_during_peer_clear_.fetch_add(1, std::memory_order_relaxed);
          }
        }
        StoreSlot(ws_[j].get() + word_index(kn.buf, t, r), v, rng, r == k_.torn_rank);
        MaybeDelay(rng, 96, 100);
      }
      MaybeDelay(rng, 32, 200);

      // Bounded wait: "lane" j keeps slot [buf][t][j] once none of its words is -0.0.
      std::fill(have.begin(), have.end(), 0);
      int missing = world;
      const Clock::time_point start = Clock::now();
      for (uint32_t spin = 1;; ++spin) {
        for (int j = 0; j < world; ++j) {
          if (have[j]) continue;
          std::atomic<uint32_t>* slot = mine + word_index(kn.buf, t, j);
          std::array<int, 4> order = {0, 1, 2, 3};
          std::shuffle(order.begin(), order.end(), rng);
          for (int w : order) got[j][w] = slot[w].load(std::memory_order_relaxed);
          bool ok = got[j][0] != kLamportEmpty;
          if (k_.check_all_words) {
            for (int w = 1; w < 4; ++w) ok = ok && got[j][w] != kLamportEmpty;
          }
          if (ok) {
            have[j] = 1;
            --missing;
          }
        }
        if (missing == 0) break;
        // Back off after a few polls: with many more spinning threads than cores, yielding alone
        // burns the CPU time the ranks being waited for need.
        if (spin < 16) {
          std::this_thread::yield();
        } else {
          std::this_thread::sleep_for(std::chrono::microseconds(20));
        }
        if ((spin & 63u) == 0u) {
          if (abort_.load(std::memory_order_relaxed)) return;
          if (Clock::now() - start > k_.deadline) {
            std::ostringstream os;
            os << "rank " << r << " call #" << kn.call_index << " (kernel " << kn.n << ", buffer "
               << kn.buf << ", " << kn.tokens << " tokens) token " << t << " waited past "
               << k_.deadline.count() << " ms:" << std::hex;
            for (int j = 0; j < world; ++j) {
              if (!have[j]) {
                os << " rank " << j << "'s slot holds {0x" << got[j][0] << ", 0x" << got[j][1]
                   << ", 0x" << got[j][2] << ", 0x" << got[j][3] << "}";
              }
            }
            Fail(timeouts_, os.str());
            return;
          }
        }
      }

      // Sum in rank order and compare bitwise with an independent evaluation (+0.0 for -0.0).
      float tq = 0.f, tk = 0.f, eq = 0.f, ek = 0.f;
      for (int j = 0; j < world; ++j) {
        tq += bits_float(got[j][0]);
        tk += bits_float(got[j][1]);
        const float pq = partial(k_, kn.call_index, t, j, 0);
        const float pk = partial(k_, kn.call_index, t, j, 1);
        eq += pq == 0.0f ? 0.0f : pq;
        ek += pk == 0.0f ? 0.0f : pk;
      }
      if (float_bits(tq) != float_bits(eq) || float_bits(tk) != float_bits(ek)) {
        std::ostringstream os;
        os << "rank " << r << " call #" << kn.call_index << " (kernel " << kn.n << ", buffer "
           << kn.buf << ", " << kn.tokens << " tokens) token " << t << ": sum (" << tq << ", " << tk
           << ") expected (" << eq << ", " << ek << ")";
        Fail(wrong_sums_, os.str());
        return;
      }
      exchanges_.fetch_add(1, std::memory_order_relaxed);

      ++done_tokens;
      if (forced_late && done_tokens == my_tokens) {
        std::this_thread::sleep_for(std::chrono::microseconds(k_.late_us));
      }
      land_clears(done_tokens);
    }
    kernel_boundary();  // kernel end
  }

  const Knobs k_;
  std::size_t words_ = 0;
  std::vector<std::unique_ptr<std::atomic<uint32_t>[]>> ws_;
  std::vector<std::atomic<int64_t>> finished_;  // kernels each rank has completed
  std::vector<std::atomic<int>> clearing_;      // workers of each rank with clears not landed
  std::atomic<bool> abort_{false};
  std::atomic<int64_t> exchanges_{0}, wrong_sums_{0}, timeouts_{0}, run_ahead_{0},
      lag_violations_{0}, writes_into_lagging_{0}, writes_during_peer_clear_{0}, late_clears_{0},
      negative_zeros_{0}, positive_zeros_{0};
  std::mutex mu_;
  std::string first_failure_;
};

// Expected number of successful exchanges: every rank sums every token of every call.
int64_t ExpectedExchanges(const Knobs& k) {
  std::mt19937_64 host_rng(k.seed);
  int64_t n = 0;
  for (int i = 0; i < k.calls; ++i) {
    const int64_t t = tokens_of_call(k, i, host_rng());
    EXPECT_TRUE(t >= 0 && t <= k.capacity) << "call #" << i << " has " << t << " tokens";
    n += t;
  }
  return n * k.world;
}

void ExpectCorrect(const Knobs& k) {
  const Clock::time_point t0 = Clock::now();
  const Outcome o = Model(k).Run();
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  EXPECT_EQ(o.wrong_sums, 0) << o.first_failure;
  EXPECT_EQ(o.timeouts, 0) << o.first_failure;
  EXPECT_EQ(o.lag_violations, 0);
  EXPECT_EQ(o.exchanges, ExpectedExchanges(k));
  if (k.random_delays) {
    // The interleavings that matter did happen: ranks started a call while a peer was still in
    // the previous one and wrote into it meanwhile, even while its clearing was still landing;
    // clearing landed after publishes; exact zeros of both signs were exchanged.
    EXPECT_GT(o.run_ahead, 0);
    EXPECT_GT(o.writes_into_lagging, 0);
    if (k.late_clears) {
      EXPECT_GT(o.writes_during_peer_clear, 0);
      EXPECT_GT(o.late_clears, 0);
    }
    EXPECT_GT(o.negative_zeros, 0);
    EXPECT_GT(o.positive_zeros, 0);
  }
  std::cout << "[ model    ] world " << k.world << ", " << k.calls << " calls: " << o.exchanges
            << " exchanges, run-ahead " << o.run_ahead << ", writes into a lagging rank "
            << o.writes_into_lagging << " (" << o.writes_during_peer_clear
            << " while its clearing was landing), late clears " << o.late_clears << ", -0.0/+0.0 "
            << o.negative_zeros << "/" << o.positive_zeros << ", " << secs << " s\n";
}

// ---------------------------------------------------------------- the real protocol

TEST(LamportModel, World2) {
  Knobs k;
  k.world = 2;
  ExpectCorrect(k);
}

TEST(LamportModel, World4) {
  Knobs k;
  k.world = 4;
  k.seed = 2;
  ExpectCorrect(k);
}

TEST(LamportModel, World8) {
  Knobs k;
  k.world = 8;
  k.max_workers = 2;
  k.seed = 3;
  ExpectCorrect(k);
}

TEST(LamportModel, OneSlotCapacity) {
  // The tightest reuse: every call writes the single token slot of its buffer.
  Knobs k;
  k.world = 4;
  k.calls = 1000;
  k.capacity = 1;
  k.seed = 4;
  ExpectCorrect(k);
}

TEST(LamportModel, TokenCountsSwingBetweenOneAndCapacity) {
  // Large calls followed by one-token calls and back: most of a buffer is stale between uses.
  Knobs k;
  k.world = 4;
  k.calls = 600;
  k.capacity = 24;
  k.token_pattern = {24, 1, 0, 1, 24, 3, 1, 0, 0, 17, 24, 2, 1, 1, 24};
  k.seed = 5;
  ExpectCorrect(k);
}

TEST(LamportModel, ClearingInProgramOrder) {
  // No late landing: every worker's clearing precedes its first publish. (A peer then never
  // writes into a rank whose clearing is pending: it needs every worker's partials first.)
  Knobs k;
  k.world = 4;
  k.calls = 600;
  k.late_clears = false;
  k.seed = 6;
  ExpectCorrect(k);
}

// ---------------------------------------------------------------- forced schedules

Knobs ForcedSchedule() {
  Knobs k;
  k.world = 2;
  k.calls = 24;
  k.max_workers = 1;
  k.random_delays = false;
  k.zero_one_in = 0;
  k.token_pattern = {4, 1, 1, 4, 2, 0, 3};
  return k;
}

Knobs SlowPublisherSchedule() {
  // Rank 1 sleeps before each publish: rank 0 polls its slots for rank 1's partials before they
  // are written, so whatever a slot still holds from an earlier use is read as fresh.
  Knobs k = ForcedSchedule();
  k.slow_rank = 1;
  k.slow_us = 2000;
  return k;
}

Knobs LateClearSchedule() {
  // Rank 0's clearing lands 3 ms after its last publish: rank 1 finishes the call meanwhile and
  // starts the next one, writing into rank 0 before rank 0's kernel (with its clearing) is done.
  Knobs k = ForcedSchedule();
  k.token_pattern = {1};
  k.late_rank = 0;
  k.late_us = 3000;
  return k;
}

Knobs TornWriterSchedule() {
  // Rank 1 stores the q word of every slot 2 ms before the k word.
  Knobs k = ForcedSchedule();
  k.token_pattern = {2};
  k.calls = 8;
  k.torn_rank = 1;
  k.torn_us = 2000;
  return k;
}

TEST(LamportModel, ForcedSchedulesPassWithTheRealProtocol) {
  for (const Knobs& k : {SlowPublisherSchedule(), LateClearSchedule(), TornWriterSchedule()}) {
    const Outcome o = Model(k).Run();
    EXPECT_EQ(o.wrong_sums + o.timeouts, 0) << o.first_failure;
    EXPECT_EQ(o.exchanges, ExpectedExchanges(k));
  }
  // Under the late-clear schedule rank 1 does write into rank 0 while rank 0 is still clearing.
  const Outcome o = Model(LateClearSchedule()).Run();
  EXPECT_GT(o.writes_into_lagging, 0);
  EXPECT_GT(o.late_clears, 0);
}

// ---------------------------------------------------------------- negative controls

Outcome RunBroken(Knobs k) {
  k.deadline = std::chrono::milliseconds(300);
  const Clock::time_point t0 = Clock::now();
  const Outcome o = Model(k).Run();
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(5));
  std::cout << "[ detected ] " << (o.first_failure.empty() ? "nothing" : o.first_failure) << "\n";
  return o;
}

TEST(LamportModelNegative, NoClearingReadsStaleSlotsAsFresh) {
  // Three calls later a buffer still holds the old partials: rank 0 sums rank 1's partial of
  // call #0 for call #3 before rank 1 has written the new one.
  Knobs k = SlowPublisherSchedule();
  k.clear = ClearRule::kNone;
  const Outcome o = RunBroken(k);
  EXPECT_GT(o.wrong_sums, 0);
}

TEST(LamportModelNegative, ClearingTheCurrentBufferIsDetected) {
  // Clearing the buffer this call uses erases what a peer that is already in this call wrote
  // into it (a hang), and leaves the previous buffer dirty for its next use (a stale read).
  Knobs k = SlowPublisherSchedule();
  k.clear = ClearRule::kCurrent;
  const Outcome o = RunBroken(k);
  EXPECT_GT(o.wrong_sums + o.timeouts, 0);
}

TEST(LamportModelNegative, ClearingOnlyMinOfBothTokenCountsLeavesStaleSlots) {
  // 4 tokens, then 1: call #1 clears only token 0 of call #0's buffer, call #3 (4 tokens) reads
  // tokens 1..3 of it stale.
  Knobs k = SlowPublisherSchedule();
  k.clear = ClearRule::kMinTokens;
  const Outcome o = RunBroken(k);
  EXPECT_GT(o.wrong_sums, 0);
}

TEST(LamportModelNegative, ClearingThisCallsTokenCountLeavesStaleSlots) {
  // The host's T of the current call instead of the device's lamport_tokens: same stale slots
  // after a shrink (and why the count is kept on the device, for graph replays).
  Knobs k = SlowPublisherSchedule();
  k.clear = ClearRule::kThisCallTokens;
  const Outcome o = RunBroken(k);
  EXPECT_GT(o.wrong_sums, 0);
}

TEST(LamportModelNegative, TwoBuffersLetALateClearEraseAPeersNextCall) {
  // With two buffers the previous buffer is also the next one. A peer may be in the next call
  // as soon as it has all of this call's partials, while this rank's clearing (no fence before
  // its publishes) is still landing: the clearing erases the peer's next-call slot and this rank
  // waits for it forever. Three buffers keep the next call out of the buffer being cleared.
  // (Only a late-landing clear exposes this: in program order, with no block without tokens,
  // every worker has cleared before the peer can have all of this call's partials.)
  Knobs k = LateClearSchedule();
  k.buffers = 2;
  const Outcome o = RunBroken(k);
  EXPECT_GT(o.timeouts, 0);
  EXPECT_EQ(o.wrong_sums, 0);
}

TEST(LamportModelNegative, TwoBuffersFailUnderRandomSchedules) {
  // The same with the random late landing of the real-protocol runs.
  Knobs k;
  k.world = 4;
  k.calls = 2000;
  k.buffers = 2;
  k.seed = 9;
  const Outcome o = RunBroken(k);
  EXPECT_GT(o.timeouts + o.wrong_sums, 0);
}

TEST(LamportModelNegative, UnmappedNegativeZeroReadsAsEmpty) {
  // A partial of exactly -0.0 stored as is looks like an empty word: its readers time out.
  Knobs k;
  k.world = 2;
  k.calls = 200;
  k.zero_one_in = 4;
  k.map_negative_zero = false;
  const Outcome o = RunBroken(k);
  EXPECT_GT(o.timeouts, 0);
  EXPECT_EQ(o.wrong_sums, 0);
}

TEST(LamportModelNegative, CheckingOnlyTheQWordReadsATornSlot) {
  // The 16-byte store is not single-copy atomic: a reader that checks one word sees rank 1's q
  // before its k and sums the -0.0 still in the k word.
  Knobs k = TornWriterSchedule();
  k.check_all_words = false;
  const Outcome o = RunBroken(k);
  EXPECT_GT(o.wrong_sums, 0);
}

}  // namespace
}  // namespace swiftqk
