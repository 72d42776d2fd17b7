#include "protocol_model.hpp"

#include <algorithm>
#include <atomic>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace swiftqk::model::protocol {
namespace {

// Tokens of a host-level call from the generator's draw for it: 0 (skipped by the host) one time
// in eight, else 1 to the capacity.
int64_t tokens_of_call(const Knobs& k, uint64_t draw) {
  if (k.fixed_tokens >= 0) return k.fixed_tokens;
  return draw % 8 == 0 ? 0 : 1 + static_cast<int64_t>((draw >> 8) % k.capacity);
}

class Model {
 public:
  explicit Model(const Knobs& k) : k_(k), ranks_(k.world, k.random_delays) {
    words_ = workspace_bytes(k.world, k.capacity) / 8;
    for (int r = 0; r < k.world; ++r) {
      ws_.emplace_back(new std::atomic<uint64_t>[words_]);
      for (std::size_t i = 0; i < words_; ++i) ws_.back()[i].store(0, std::memory_order_relaxed);
    }
  }

  Outcome Run() {
    Outcome o;
    static_cast<Tally&>(o) = ranks_.Run([this](int r) { RankMain(r); });
    o.max_defer_seen = max_defer_seen_.load();
    o.max_rows_seen = max_rows_seen_.load();
    return o;
  }

 private:
  // Index of the first 64-bit word of the slot of (bank, token, src) in a rank's workspace.
  std::size_t word_index(int bank, int64_t token, int src) const {
    return slot_offset(k_.world, k_.capacity, bank, token, src, k_.layout) / 8;
  }

  void RankMain(int r) {
    std::mt19937_64 host_rng(k_.seed);  // the same sequence on every rank: they agree on T
    std::mt19937_64 rank_rng(splitmix64(k_.seed * 977 + r));
    const float eps = r == k_.other_config_rank ? 1e-5f : 1e-6f;
    uint32_t call = k_.first_call;
    int64_t done = 0;  // calls of this rank that exchanged something
    bool skipped = false;
    for (int i = 0; i < k_.calls && !ranks_.aborted(); ++i) {
      int64_t tokens = tokens_of_call(k_, host_rng());
      if (tokens == 0) continue;  // the host returns early: no launch, no counter advance
      if (r == k_.other_tokens_rank) tokens = tokens > 1 ? tokens - 1 : tokens + 1;
      if (r == k_.skip_rank && i >= k_.skip_at && !skipped) {
        call = next_call(call);  // a rank that missed a launch the others made
        skipped = true;
      }
      ranks_.StartCall(r, done);

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
      run_blocks(workers, rank_rng, [&](int b, uint64_t seed) {
        Worker(r, i, done, call, tokens, b, workers, rows, defer, tag, ktag, bank, seed);
      });
      // The kernel has finished: the last block advanced the counter.
      ranks_.FinishCall(r, done + 1);
      ++done;
      call = next_call(call);
      ranks_.MaybeDelay(rank_rng, 16, 300);
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
    kernel_boundary();  // kernel start
    std::mt19937_64 rng(seed);
    std::vector<std::vector<int64_t>> pending;  // per iteration, rows published and not collected
    for (int64_t base = static_cast<int64_t>(b) * rows; !ranks_.aborted();
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
      ranks_.MaybeDelay(rng, 4, 200);  // a slow scrub must not erase a peer's next write
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
    kernel_boundary();  // kernel end
  }

  void Publish(int r, int64_t done, int64_t t, int call_index, uint32_t tag, uint32_t ktag,
               int bank, std::mt19937_64& rng) {
    const int world = k_.world;
    const float q = partial(k_.seed, call_index, t, r, 0);
    const float k = partial(k_.seed, call_index, t, r, 1);
    if (r == k_.slow_rank && k_.slow_before_publish) {
      std::this_thread::sleep_for(std::chrono::microseconds(k_.slow_us));
    }
    ranks_.MaybeDelay(rng, 48, 200);

    // Publish into every rank's slot [bank][t][r], own workspace included.
    const std::size_t slot = word_index(bank, t, r);
    for (int j = 0; j < world; ++j) {
      if (j != r) ranks_.WriteInto(j, done);
      ws_[j][slot].store(pack_word(q, tag), std::memory_order_relaxed);
      ws_[j][slot + 1].store(pack_word(k, ktag), std::memory_order_relaxed);
      if (j + 1 < world)
        ranks_.MaybeDelay(rng, 96, 100);  // peers see the publish at different times
    }
  }

  // Waits for, checks and consumes token t's slots; false if the wait failed or was abandoned.
  bool Collect(int r, int64_t t, int call_index, uint32_t tag, uint32_t ktag, int bank,
               std::mt19937_64& rng) {
    const int world = k_.world;
    std::atomic<uint64_t>* mine = ws_[r].get();
    std::vector<uint64_t> w0(world), w1(world);
    std::vector<char> have(world);
    if (r == k_.slow_rank && !k_.slow_before_publish) {
      std::this_thread::sleep_for(std::chrono::microseconds(k_.slow_us));
    }
    ranks_.MaybeDelay(rng, 48, 200);

    // Bounded wait: "lane" j keeps slot [bank][t][j] once both its tags match.
    const Clock::time_point start = Clock::now();
    auto poll = [&](int j) {
      const std::size_t s = word_index(bank, t, j);
      w0[j] = mine[s].load(std::memory_order_relaxed);
      w1[j] = mine[s + 1].load(std::memory_order_relaxed);
      return word_tag(w0[j]) == tag && word_tag(w1[j]) == ktag;
    };
    auto give_up = [&] {
      if (ranks_.aborted()) return true;
      if (Clock::now() - start <= k_.deadline) return false;
      std::ostringstream os;
      os << "rank " << r << " call #" << call_index << " token " << t << " waited past "
         << k_.deadline.count() << " ms for tags (" << tag << ", " << ktag << "):";
      for (int j = 0; j < world; ++j) {
        if (!have[j]) {
          os << " rank " << j << "'s slot has tags (" << word_tag(w0[j]) << ", " << word_tag(w1[j])
             << ")";
        }
      }
      ranks_.TimedOut(os.str());
      return true;
    };
    if (!poll_lanes(have, poll, give_up)) return false;

    // Sum in rank order and compare bitwise with an independent evaluation.
    const Sums got = sum_in_rank_order(world, [&](int j) {
      return Sums{word_value(w0[j]), word_value(w1[j])};
    });
    const Sums want = sum_in_rank_order(world, [&](int j) {
      return Sums{partial(k_.seed, call_index, t, j, 0), partial(k_.seed, call_index, t, j, 1)};
    });
    if (!same_bits(got, want)) {
      std::ostringstream os;
      os << "rank " << r << " call #" << call_index << " token " << t << ": sum (" << got.q << ", "
         << got.k << ") expected (" << want.q << ", " << want.k << ")";
      ranks_.WrongSum(os.str());
      return false;
    }
    ranks_.Exchanged();
    return true;
  }

  const Knobs k_;
  SimulatedRanks ranks_;
  std::size_t words_ = 0;
  std::vector<std::unique_ptr<std::atomic<uint64_t>[]>> ws_;
  std::atomic<int> max_defer_seen_{0};
  std::atomic<int> max_rows_seen_{1};
};

}  // namespace

Outcome run_model(const Knobs& k) { return Model(k).Run(); }

int64_t expected_exchanges(const Knobs& k) {
  return model::expected_exchanges(k.world, k.calls, k.seed,
                                   [&k](int, uint64_t draw) { return tokens_of_call(k, draw); });
}

}  // namespace swiftqk::model::protocol
