// A CPU model of the kernel's partial-sum exchange (src/kernels/swiftqk_fused.cuh,
// exchange_partials and the call-counter advance at the end of swiftqk_fused_kernel), with one
// std::thread per rank and short-lived worker threads per call standing in for the rank's blocks.
// It shows that reusing the two slot banks across consecutive calls is safe while ranks drift
// apart, including across the wrap of the 30-bit call counter and with tags that repeat far
// sooner than on the GPU (so that the scrub calls are what keeps a stale slot from matching),
// and, with deliberately broken variants, that the model does detect a broken protocol.
//
// What is modelled, as in the kernel:
//  - Each rank owns a workspace of kSlotBanks x capacity x world slots laid out by slot_offset();
//    a slot is two 64-bit words {value bits | tag << 32} accessed with relaxed atomics (the
//    kernel's st/ld.relaxed.sys of single-copy-atomic 64-bit words).
//  - Each rank keeps its own call counter from first_call; call c uses tag_for_call(c),
//    ktag = tag ^ config_hash(...) and bank_for_call(c). Calls of 0 tokens are skipped on every
//    rank without touching the counter (launch.cu returns before launching).
//  - A call's tokens are split over W workers ("blocks") as the kernel does: worker b handles
//    tokens b, b + W, ... in increasing order. Per token a worker publishes the rank's (q, k)
//    partials into slot [bank][t][rank] of EVERY rank (itself included); then, D tokens later
//    (the kernel's deferral depth, drawn per rank and call from [0, max_defer] so that ranks with
//    different depths meet too; the rest at the end), it waits with a deadline for all world
//    slots [bank][t][*] of its own workspace to carry (tag, ktag) and sums them in rank order
//    0..world-1 in float. Consumed slots keep their contents.
//  - In scrub calls (is_scrub_call) each worker, after its last collect, zeroes the slots of its
//    own token sequence up to the capacity in the call's bank (scrub_own_slots).
//  - When all workers of a rank have been joined (the kernel has finished), the counter advances
//    with next_call(). W is drawn per rank and call: ranks need not agree on it.
//  - A kernel launch boundary orders everything a rank did in call c before what it does in call
//    c + 1, for observers on other GPUs too. The model states this with a fence at the start and
//    at the end of every worker; the slot accesses themselves stay relaxed.
#include <gtest/gtest.h>

#include <algorithm>
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
#include <vector>

#include "model_helpers.hpp"
#include "protocol.hpp"

namespace swiftqk {
namespace {

using Clock = std::chrono::steady_clock;

struct Knobs {
  int world = 2;
  int calls = 2000;       // host-level calls, including the 0-token ones
  int64_t capacity = 12;  // slots per bank; tokens per call are drawn from [0, capacity]
  int max_workers = 3;    // "blocks" per rank and call, drawn from [1, max_workers]
  int max_defer = 0;      // deferral depth per rank and call, drawn from [0, max_defer]
  SlotLayout layout = SlotLayout::kTokenMajor;  // the order of every workspace's slots
  int max_rows = 1;         // rows a worker handles per iteration (packed groups sharing a
                            // warp), drawn per rank and call from the powers of two <= max_rows
  uint32_t first_call = 0;  // initial value of every rank's device call counter
  uint64_t seed = 1;
  bool random_delays = true;
  std::chrono::milliseconds deadline{10000};  // per token wait; a hang fails instead
  // Broken variants (negative controls); the defaults are the real protocol.
  int fixed_tokens = -1;                 // >= 0: every call has this many tokens
  bool two_banks = true;                 // false: every call uses bank 0
  bool scrub = true;                     // false: no scrub calls
  bool scrub_to_capacity = true;         // false: a scrub zeroes only the call's tokens' slots
  uint32_t scrub_period = kScrubPeriod;  // scrub calls are the last two of every period
  uint32_t tag_period = 0;     // > 0: tag = tag_for_call(call % tag_period), i.e. tags are reused
  int skip_rank = -1;          // this rank advances its counter an extra time ...
  int skip_at = -1;            // ... before its first call with tokens at or after skip_at
  int other_config_rank = -1;  // this rank hashes another eps into its k tags
  int other_tokens_rank = -1;  // this rank is called with one token fewer (or more) each time
  bool hash_tokens = true;     // false: the token count left out of the k-tag hash (a control)
  int slow_rank = -1;          // this rank sleeps slow_us ...
  int slow_us = 0;
  bool slow_before_publish = false;           // ... before publishing a token (else before reading)
  bool collect_before_all_published = false;  // a packed warp collects after its first row only
};

struct Outcome {
  int64_t exchanges = 0;            // tokens summed successfully, over all ranks
  int64_t wrong_sums = 0;           // sums that differ from the independent expectation
  int64_t timeouts = 0;             // waits that ran past the deadline
  int64_t run_ahead = 0;            // calls started while another rank had not finished the last
  int64_t writes_into_lagging = 0;  // publishes into a rank still in its previous call
  int64_t lag_violations = 0;       // a rank found another two calls behind (impossible)
  int max_defer_seen = 0;           // the deepest deferral any rank used
  int max_rows_seen = 1;            // the most rows a worker handled at once
  std::string first_failure;
};

// Deterministic, call-dependent partial sums of squares (nonnegative floats with full
// mantissas) and the slot words that carry them.
using model::float_bits;
using model::pack_word;
using model::partial;
using model::splitmix64;
using model::word_tag;
using model::word_value;

class Model {
 public:
  explicit Model(const Knobs& k) : k_(k), finished_(k.world) {
    words_ = workspace_bytes(k.world, k.capacity) / 8;
    for (int r = 0; r < k.world; ++r) {
      ws_.emplace_back(new std::atomic<uint64_t>[words_]);
      for (std::size_t i = 0; i < words_; ++i) ws_.back()[i].store(0, std::memory_order_relaxed);
      finished_[r].store(0, std::memory_order_relaxed);
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
    o.writes_into_lagging = writes_into_lagging_.load();
    o.lag_violations = lag_violations_.load();
    o.max_defer_seen = max_defer_seen_.load();
    o.max_rows_seen = max_rows_seen_.load();
    o.first_failure = first_failure_;
    return o;
  }

 private:
  // Index of the first 64-bit word of the slot of (bank, token, src) in a rank's workspace.
  std::size_t word_index(int bank, int64_t token, int src) const {
    return slot_offset(k_.world, k_.capacity, bank, token, src, k_.layout) / 8;
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

  void RankMain(int r) {
    std::mt19937_64 host_rng(k_.seed);  // the same sequence on every rank: they agree on T
    std::mt19937_64 rank_rng(splitmix64(k_.seed * 977 + r));
    const float eps = r == k_.other_config_rank ? 1e-5f : 1e-6f;
    uint32_t call = k_.first_call;
    int64_t done = 0;  // calls of this rank that exchanged something
    bool skipped = false;
    for (int i = 0; i < k_.calls && !abort_.load(); ++i) {
      const uint64_t draw = host_rng();
      int64_t tokens =
          k_.fixed_tokens >= 0
              ? k_.fixed_tokens
              : (draw % 8 == 0 ? 0 : 1 + static_cast<int64_t>((draw >> 8) % k_.capacity));
      if (tokens == 0) continue;  // the host returns early: no launch, no counter advance
      if (r == k_.other_tokens_rank) tokens = tokens > 1 ? tokens - 1 : tokens + 1;
      if (r == k_.skip_rank && i >= k_.skip_at && !skipped) {
        call = next_call(call);  // a rank that missed a launch the others made
        skipped = true;
      }

      // Progress bookkeeping: a peer may still be in our previous call (run-ahead), never in an
      // earlier one (lag violation).
      for (int o = 0; o < k_.world; ++o) {
        if (o == r) continue;
        const int64_t f = finished_[o].load(std::memory_order_relaxed);
        if (f < done) run_ahead_.fetch_add(1, std::memory_order_relaxed);
        if (f < done - 1) lag_violations_.fetch_add(1, std::memory_order_relaxed);
      }

      const uint32_t tag = tag_for_call(k_.tag_period > 0 ? call % k_.tag_period : call);
      const uint32_t ktag =
          tag ^ config_hash(4096, 1024, k_.world, eps, 0, k_.hash_tokens ? tokens : 0);
      const int bank = k_.two_banks ? bank_for_call(call) : 0;
      const int workers = 1 + static_cast<int>(rank_rng() % k_.max_workers);
      const int defer = static_cast<int>(rank_rng() % (k_.max_defer + 1));
      max_defer_seen_.store(std::max(max_defer_seen_.load(), defer));
      int rows = 1;  // a power of two up to max_rows: ranks may pick different layouts
      while (rows * 2 <= k_.max_rows && rank_rng() % 2 == 0) rows *= 2;
      max_rows_seen_.store(std::max(max_rows_seen_.load(), rows));
      std::vector<std::thread> blocks;
      for (int b = 0; b < workers; ++b) {
        const uint64_t worker_seed = rank_rng();
        blocks.emplace_back([this, r, i, done, call, tokens, b, workers, rows, defer, tag, ktag,
                             bank, worker_seed] {
          Worker(r, i, done, call, tokens, b, workers, rows, defer, tag, ktag, bank, worker_seed);
        });
      }
      for (std::thread& t : blocks) t.join();
      // The kernel has finished: the last block advanced the counter.
      finished_[r].store(done + 1, std::memory_order_relaxed);
      ++done;
      call = next_call(call);
      MaybeDelay(rank_rng, 16, 300);
    }
  }

  // One warp of the kernel: `rows` groups of it (1 = a group of a warp or more; 2 or 4 = packed
  // rows, groups of 16 or 8 lanes) take tokens b * rows + j, + workers * rows, ... Each
  // iteration every group publishes its row, then the warp collects the rows of D iterations
  // back together (it leaves the collect only when all of them are in). In a scrub call it then
  // zeroes its sequence's slots up to the capacity.
  void Worker(int r, int call_index, int64_t done, uint32_t call, int64_t tokens, int b,
              int workers, int rows, int defer, uint32_t tag, uint32_t ktag, int bank,
              uint64_t seed) {
    std::atomic_thread_fence(std::memory_order_seq_cst);  // kernel start
    std::mt19937_64 rng(seed);
    std::vector<std::vector<int64_t>> pending;  // per iteration, rows published and not collected
    for (int64_t base = static_cast<int64_t>(b) * rows; !abort_.load(std::memory_order_relaxed);
         base += static_cast<int64_t>(workers) * rows) {
      std::vector<int64_t> now;
      for (int j = 0; j < rows && base + j < tokens; ++j) now.push_back(base + j);
      // Every group publishes before the warp collects (the broken variant: only the first).
      const std::size_t before =
          k_.collect_before_all_published ? std::min<std::size_t>(1, now.size()) : now.size();
      for (std::size_t j = 0; j < before; ++j) {
        Publish(r, done, now[j], call_index, tag, ktag, bank, rng);
      }
      const bool more = !now.empty();
      if (more) pending.push_back(now);
      // The kernel's iteration i collects token i - D; past the last token it drains the rest.
      if (!pending.empty() && (static_cast<int>(pending.size()) > defer || !more)) {
        for (int64_t t : pending.front()) {
          if (!Collect(r, t, call_index, tag, ktag, bank, rng)) return;
        }
        pending.erase(pending.begin());
      }
      for (std::size_t j = before; j < now.size(); ++j) {
        Publish(r, done, now[j], call_index, tag, ktag, bank, rng);
      }
      if (!more && pending.empty()) break;
    }
    if (k_.scrub && is_scrub_call(call, k_.scrub_period)) {
      MaybeDelay(rng, 4, 200);  // a slow scrub must not erase a peer's next write
      const int64_t end = k_.scrub_to_capacity ? k_.capacity : tokens;
      for (int64_t base = static_cast<int64_t>(b) * rows; base < end;
           base += static_cast<int64_t>(workers) * rows) {
        for (int j = 0; j < rows && base + j < end; ++j) {
          for (int src = 0; src < k_.world; ++src) {
            const std::size_t s = word_index(bank, base + j, src);
            ws_[r][s].store(0, std::memory_order_relaxed);
            ws_[r][s + 1].store(0, std::memory_order_relaxed);
          }
        }
      }
    }
    std::atomic_thread_fence(std::memory_order_seq_cst);  // kernel end
  }

  void Publish(int r, int64_t done, int64_t t, int call_index, uint32_t tag, uint32_t ktag,
               int bank, std::mt19937_64& rng) {
    const int world = k_.world;
    {
      const float q = partial(k_.seed, call_index, t, r, 0);
      const float k = partial(k_.seed, call_index, t, r, 1);
      if (r == k_.slow_rank && k_.slow_before_publish) {
        std::this_thread::sleep_for(std::chrono::microseconds(k_.slow_us));
      }
      MaybeDelay(rng, 48, 200);

      // Publish into every rank's slot [bank][t][r], own workspace included.
      const std::size_t slot = word_index(bank, t, r);
      for (int j = 0; j < world; ++j) {
        if (j != r && finished_[j].load(std::memory_order_relaxed) < done) {
          writes_into_lagging_.fetch_add(1, std::memory_order_relaxed);
        }
        ws_[j][slot].store(pack_word(q, tag), std::memory_order_relaxed);
        ws_[j][slot + 1].store(pack_word(k, ktag), std::memory_order_relaxed);
        if (j + 1 < world) MaybeDelay(rng, 96, 100);  // peers see the publish at different times
      }
    }
  }

  // Waits for, checks and consumes token t's slots; false if the wait failed or was abandoned.
  bool Collect(int r, int64_t t, int call_index, uint32_t tag, uint32_t ktag, int bank,
               std::mt19937_64& rng) {
    const int world = k_.world;
    std::atomic<uint64_t>* mine = ws_[r].get();
    std::vector<uint64_t> w0(world), w1(world);
    std::vector<char> have(world);
    {
      if (r == k_.slow_rank && !k_.slow_before_publish) {
        std::this_thread::sleep_for(std::chrono::microseconds(k_.slow_us));
      }
      MaybeDelay(rng, 48, 200);

      // Bounded wait: "lane" j keeps slot [bank][t][j] once both its tags match.
      std::fill(have.begin(), have.end(), 0);
      int missing = world;
      const Clock::time_point start = Clock::now();
      for (uint32_t spin = 1; missing > 0; ++spin) {
        for (int j = 0; j < world; ++j) {
          if (have[j]) continue;
          const std::size_t s = word_index(bank, t, j);
          w0[j] = mine[s].load(std::memory_order_relaxed);
          w1[j] = mine[s + 1].load(std::memory_order_relaxed);
          if (word_tag(w0[j]) == tag && word_tag(w1[j]) == ktag) {
            have[j] = 1;
            --missing;
          }
        }
        if (missing == 0) break;
        std::this_thread::yield();
        if ((spin & 63u) == 0u) {
          if (abort_.load(std::memory_order_relaxed)) return false;
          if (Clock::now() - start > k_.deadline) {
            std::ostringstream os;
            os << "rank " << r << " call #" << call_index << " token " << t << " waited past "
               << k_.deadline.count() << " ms for tags (" << tag << ", " << ktag << "):";
            for (int j = 0; j < world; ++j) {
              if (!have[j]) {
                os << " rank " << j << "'s slot has tags (" << word_tag(w0[j]) << ", "
                   << word_tag(w1[j]) << ")";
              }
            }
            Fail(timeouts_, os.str());
            return false;
          }
        }
      }

      // Sum in rank order and compare bitwise with an independent evaluation.
      float tq = 0.f, tk = 0.f, eq = 0.f, ek = 0.f;
      for (int j = 0; j < world; ++j) {
        tq += word_value(w0[j]);
        tk += word_value(w1[j]);
        eq += partial(k_.seed, call_index, t, j, 0);
        ek += partial(k_.seed, call_index, t, j, 1);
      }
      if (float_bits(tq) != float_bits(eq) || float_bits(tk) != float_bits(ek)) {
        std::ostringstream os;
        os << "rank " << r << " call #" << call_index << " token " << t << ": sum (" << tq << ", "
           << tk << ") expected (" << eq << ", " << ek << ")";
        Fail(wrong_sums_, os.str());
        return false;
      }
      exchanges_.fetch_add(1, std::memory_order_relaxed);
    }
    return true;
  }

  const Knobs k_;
  std::size_t words_ = 0;
  std::vector<std::unique_ptr<std::atomic<uint64_t>[]>> ws_;
  std::vector<std::atomic<int64_t>> finished_;  // calls with tokens each rank has completed
  std::atomic<bool> abort_{false};
  std::atomic<int> max_defer_seen_{0};
  std::atomic<int> max_rows_seen_{1};
  std::atomic<int64_t> exchanges_{0}, wrong_sums_{0}, timeouts_{0}, run_ahead_{0},
      writes_into_lagging_{0}, lag_violations_{0};
  std::mutex mu_;
  std::string first_failure_;
};

// Expected number of successful exchanges: every rank sums every token of every call.
int64_t ExpectedExchanges(const Knobs& k) {
  std::mt19937_64 host_rng(k.seed);
  int64_t n = 0;
  for (int i = 0; i < k.calls; ++i) {
    const uint64_t draw = host_rng();
    n += k.fixed_tokens >= 0
             ? k.fixed_tokens
             : (draw % 8 == 0 ? 0 : 1 + static_cast<int64_t>((draw >> 8) % k.capacity));
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
  // The interleavings that matter did happen: ranks started a call while a peer was still in
  // the previous one, and wrote into its workspace meanwhile.
  if (k.random_delays && k.world > 1) {
    EXPECT_GT(o.run_ahead, 0);
    EXPECT_GT(o.writes_into_lagging, 0);
  }
  EXPECT_EQ(o.max_defer_seen, k.max_defer);  // the deepest depth asked for did run
  EXPECT_EQ(o.max_rows_seen, k.max_rows);    // and the most rows a warp, when packing
  std::cout << "[ model    ] world " << k.world << ", " << k.calls << " calls from 0x" << std::hex
            << k.first_call << std::dec << ": " << o.exchanges << " exchanges, run-ahead "
            << o.run_ahead << ", writes into a lagging rank " << o.writes_into_lagging << ", "
            << secs << " s\n";
}

// ---------------------------------------------------------------- the real protocol

TEST(ProtocolModel, World2) {
  Knobs k;
  k.world = 2;
  k.calls = 2000;
  ExpectCorrect(k);
}

TEST(ProtocolModel, World4) {
  Knobs k;
  k.world = 4;
  k.calls = 2000;
  k.seed = 2;
  ExpectCorrect(k);
}

TEST(ProtocolModel, World8) {
  Knobs k;
  k.world = 8;
  k.calls = 2000;
  k.max_workers = 2;
  k.seed = 3;
  ExpectCorrect(k);
}

// Worlds 2, 4 and 8 with up to max_defer deferred collects and up to max_rows rows a warp, drawn
// per rank and call; then the tightest reuse: one slot per bank, one worker per rank.
void ExpectCorrectWithMixedLayouts(int max_defer, int max_rows, uint64_t seed,
                                   SlotLayout layout = SlotLayout::kTokenMajor) {
  for (int world : {2, 4, 8}) {
    Knobs k;
    k.world = world;
    k.layout = layout;
    k.calls = world == 8 ? 600 : 1200;
    k.max_workers = world == 8 ? 2 : 3;
    k.max_defer = max_defer;
    k.max_rows = max_rows;
    k.seed = seed + world;
    ExpectCorrect(k);
  }
  Knobs k;
  k.world = 4;
  k.layout = layout;
  k.calls = 800;
  k.capacity = 1;
  k.max_workers = 1;
  k.max_defer = max_defer;
  k.max_rows = max_rows;
  k.seed = seed + 9;
  ExpectCorrect(k);
}

TEST(ProtocolModel, DeferredCollectsOfMixedDepths) {
  // The kernel with peers collects token i - D while publishing token i, D = log2(world) by
  // default and whatever LaunchTuning::defer says per process: every rank and call here draws its
  // own D in [0, 3], so workers hold up to 3 published, unread tokens while peers of other depths
  // run ahead into the next call. No deadlock, no wrong or stale sum.
  ExpectCorrectWithMixedLayouts(3, 1, 20);
}

TEST(ProtocolModel, PackedRowsOfMixedLayouts) {
  // With peers, short rows go 2 or 4 to a warp when the GPU is full (packed_kernel_shape); a
  // warp then waits for all its rows of D iterations back at once. Each rank and call here draws
  // its own rows per warp (1, 2 or 4) and depth (0-3), so peers run different layouts, as
  // processes on GPUs of different load may; with one slot per bank a packed warp often holds
  // one row and a group past the end. No deadlock, no wrong or stale sum.
  ExpectCorrectWithMixedLayouts(3, 4, 40);
}

TEST(ProtocolModel, PackedRowsWithSourceMajorSlots) {
  // Short rows (choose_slot_layout) order the slots by source: the same protocol on another
  // map of (bank, token, source) to words, so each bank still has its own region and a scrub
  // still reaches every slot of it.
  ExpectCorrectWithMixedLayouts(3, 4, 60, SlotLayout::kSourceMajor);
}

TEST(ProtocolModel, CounterWrapsAt2To30) {
  for (int world : {2, 4}) {
    Knobs k;
    k.world = world;
    k.calls = 400;
    k.first_call = 0x3ffffff0u;
    k.seed = 4 + world;
    ExpectCorrect(k);
  }
}

TEST(ProtocolModel, OneTokenCallsAndOneSlotCapacity) {
  // The tightest reuse: each call writes the same single slot of its bank.
  Knobs k;
  k.world = 4;
  k.calls = 1500;
  k.capacity = 1;
  k.seed = 7;
  ExpectCorrect(k);
}

TEST(ProtocolModel, ScrubCallsMakeReusedTagsSafe) {
  // Tags that repeat every 8 calls (as after the 2^30 wrap, only far sooner) with scrub calls
  // every 4, and tags that repeat every other call with a scrub in every call: a slot left from
  // an earlier use of the same tag is zeroed before that tag comes back, so only a fresh write
  // can match it. Token counts vary per call, so slots past a call's tokens stay stale for many
  // calls and only the scrub up to the capacity removes them.
  for (const auto& [tag_period, scrub_period] : {std::pair{8u, 4u}, std::pair{2u, 1u}}) {
    Knobs k;
    k.world = 4;
    k.calls = 800;
    k.tag_period = tag_period;
    k.scrub_period = scrub_period;
    k.seed = 8 + tag_period;
    ExpectCorrect(k);
  }
}

TEST(ProtocolModel, ScrubCallsCoverEveryReuseOfATag) {
  // The rule behind is_scrub_call, checked over whole call sequences: for every call c0 and the
  // next call c1 > c0 with the same tag (tag period P), some call in [c0, c1) of c0's bank is a
  // scrub call (scrub period S). It holds for every power of two S up to P (the GPU's S is a
  // quarter of P) and fails for S = 2P.
  auto covered = [](uint32_t P, uint32_t S) {
    for (uint32_t c0 = 0; c0 < 4 * P; ++c0) {
      bool ok = false;
      for (uint32_t c = c0; c < c0 + P; c += 2) ok = ok || is_scrub_call(c, S);
      if (!ok) return false;
    }
    return true;
  };
  for (uint32_t P : {2u, 4u, 8u, 64u, 1024u}) {
    for (uint32_t S = 1; S <= P; S *= 2) EXPECT_TRUE(covered(P, S)) << "P " << P << " S " << S;
    EXPECT_FALSE(covered(P, 2 * P)) << "P " << P;
  }
  EXPECT_TRUE(is_scrub_call(kScrubPeriod - 2) && is_scrub_call(kScrubPeriod - 1));
  EXPECT_FALSE(is_scrub_call(0) || is_scrub_call(1) || is_scrub_call(kScrubPeriod));
  EXPECT_TRUE(is_scrub_call(kCallPeriod - 1));  // the last call before the counter wraps
}

// ---------------------------------------------------------------- negative controls

// The schedules the negative controls force, shared with the positive runs below.
Knobs ReaderDawdlesSchedule() {
  // Rank 1 publishes, then sleeps before reading: rank 0 finishes the call and starts the next
  // one while rank 1 still has to read the slot rank 0 wrote.
  Knobs k;
  k.world = 2;
  k.calls = 20;
  k.fixed_tokens = 1;
  k.max_workers = 1;
  k.random_delays = false;
  k.slow_rank = 1;
  k.slow_us = 5000;
  return k;
}

Knobs WriterDawdlesSchedule() {
  // Rank 1 sleeps before each publish: rank 0 reaches a call's wait before rank 1 has written.
  Knobs k = ReaderDawdlesSchedule();
  k.fixed_tokens = 2;
  k.slow_before_publish = true;
  return k;
}

TEST(ProtocolModel, ForcedSchedulesPassWithTheRealProtocol) {
  for (const Knobs& k : {ReaderDawdlesSchedule(), WriterDawdlesSchedule()}) {
    Knobs slow = k;
    slow.max_workers = 2;
    for (const Knobs& x : {k, slow}) {
      const Outcome o = Model(x).Run();
      EXPECT_EQ(o.wrong_sums + o.timeouts, 0) << o.first_failure;
      EXPECT_EQ(o.exchanges, ExpectedExchanges(x));
    }
  }
  // Under the reader-dawdles schedule rank 0 does write its next call into rank 1's workspace
  // while rank 1 is still reading the previous call.
  const Outcome o = Model(ReaderDawdlesSchedule()).Run();
  EXPECT_GT(o.writes_into_lagging, 0);
}

Outcome RunBroken(Knobs k) {
  k.deadline = std::chrono::milliseconds(200);
  const Clock::time_point t0 = Clock::now();
  const Outcome o = Model(k).Run();
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(5));
  std::cout << "[ detected ] " << (o.first_failure.empty() ? "nothing" : o.first_failure) << "\n";
  return o;
}

TEST(ProtocolModelNegative, SingleBankLetsAFastRankOverwriteAnUnreadSlot) {
  // One bank: rank 0's next call overwrites, in rank 1's workspace, the slot rank 1 has not read.
  Knobs k = ReaderDawdlesSchedule();
  k.two_banks = false;
  const Outcome o = RunBroken(k);
  EXPECT_GT(o.timeouts, 0);
}

TEST(ProtocolModelNegative, SingleBankWithRepeatedTagsGivesAWrongSum) {
  // With one bank and one tag for every call, the overwritten slot even matches: rank 1 sums
  // rank 0's partial of the next call.
  Knobs k = ReaderDawdlesSchedule();
  k.two_banks = false;
  k.tag_period = 1;
  const Outcome o = RunBroken(k);
  EXPECT_GT(o.wrong_sums, 0);
}

TEST(ProtocolModelNegative, NoScrubWithRepeatedTagsReadsAStaleSlot) {
  // Tags repeat every other call and nothing is scrubbed: a reader two calls later finds the
  // slow rank's old partial under the matching tag and sums it.
  Knobs k = WriterDawdlesSchedule();
  k.scrub = false;
  k.tag_period = 2;
  const Outcome o = RunBroken(k);
  EXPECT_GT(o.wrong_sums, 0);
}

TEST(ProtocolModelNegative, ScrubsRarerThanTheTagPeriodReadAStaleSlot) {
  // Tags repeat every other call, scrubs come in two calls of every four: the calls after an
  // unscrubbed one read its partials as theirs.
  Knobs k = WriterDawdlesSchedule();
  k.tag_period = 2;
  k.scrub_period = 4;
  const Outcome o = RunBroken(k);
  EXPECT_GT(o.wrong_sums, 0);
  k.scrub_period = 2;  // the same schedule with scrubs as often as the tags repeat is correct
  const Outcome fixed = Model(k).Run();
  EXPECT_EQ(fixed.wrong_sums + fixed.timeouts, 0) << fixed.first_failure;
  EXPECT_EQ(fixed.exchanges, ExpectedExchanges(k));
}

TEST(ProtocolModelNegative, ScrubOfOnlyTheCallsTokensLeavesStaleSlots) {
  // A scrub that zeroes only the slots of the call's own tokens leaves those of an earlier,
  // longer call: when a later call with the same tag reaches that token first, the slow writer's
  // stale partial is taken.
  Knobs k = WriterDawdlesSchedule();
  k.fixed_tokens = -1;  // token counts drawn per call from [0, capacity]
  k.capacity = 6;
  k.calls = 80;
  k.slow_us = 1000;
  k.tag_period = 8;
  k.scrub_period = 4;
  k.scrub_to_capacity = false;
  const Outcome o = RunBroken(k);
  EXPECT_GT(o.wrong_sums, 0);
  k.scrub_to_capacity = true;  // the same schedule with the whole bank scrubbed is correct
  const Outcome fixed = Model(k).Run();
  EXPECT_EQ(fixed.wrong_sums + fixed.timeouts, 0) << fixed.first_failure;
  EXPECT_EQ(fixed.exchanges, ExpectedExchanges(k));
}

TEST(ProtocolModelNegative, PackedWarpCollectingBeforeAllItsRowsArePublishedHangs) {
  // The kernel publishes every group's row before the warp-wide collect. A warp that collected
  // after publishing only its first row would, without deferral, wait on its own second row:
  // the bounded wait catches it.
  Knobs k;
  k.world = 2;
  k.calls = 40;
  k.max_rows = 2;
  k.collect_before_all_published = true;
  k.seed = 13;
  const Outcome o = RunBroken(k);
  EXPECT_GT(o.timeouts, 0);
  EXPECT_EQ(o.wrong_sums, 0);
}

TEST(ProtocolModelNegative, RankThatSkipsACallIsDetected) {
  Knobs k;
  k.world = 4;
  k.calls = 200;
  k.skip_rank = 2;
  k.skip_at = 20;
  k.seed = 11;
  const Outcome o = RunBroken(k);
  EXPECT_GT(o.timeouts, 0);
  EXPECT_EQ(o.wrong_sums, 0);
}

TEST(ProtocolModelNegative, RankWithAnotherConfigIsDetected) {
  // Same call tags, different eps: the k-word tag differs, so nobody accepts the slot.
  Knobs k;
  k.world = 2;
  k.calls = 20;
  k.other_config_rank = 1;
  const Outcome o = RunBroken(k);
  EXPECT_GT(o.timeouts, 0);
  EXPECT_EQ(o.exchanges, 0);
}

TEST(ProtocolModelNegative, RankWithAnotherTokenCountIsDetected) {
  // The token count is part of the k-tag hash: no slot of a call with another token count is
  // ever accepted, so no rank sums partials of a different call's data.
  Knobs k;
  k.world = 2;
  k.calls = 20;
  k.fixed_tokens = 6;
  k.other_tokens_rank = 1;
  const Outcome o = RunBroken(k);
  EXPECT_GT(o.timeouts, 0);
  EXPECT_EQ(o.exchanges, 0);
}

TEST(ProtocolModelNegative, WithoutTheTokenCountInTheHashMismatchedCallsExchange) {
  // Control: leave the token count out of the hash and the rank with fewer tokens accepts the
  // other's first partials (on the GPU those belong to different data: a silent wrong answer).
  Knobs k;
  k.world = 2;
  k.calls = 20;
  k.fixed_tokens = 6;
  k.other_tokens_rank = 1;
  k.hash_tokens = false;
  const Outcome o = RunBroken(k);
  EXPECT_GT(o.exchanges, 0);
}

}  // namespace
}  // namespace swiftqk
