#include "lamport_model.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <utility>

namespace swiftqk::model::lamport {
namespace {

static_assert(kSlotBytes == 16, "a Lamport slot is four 32-bit words");
static_assert(kLamportBuffers == 3, "the model's real protocol rotates three buffers");

// Deterministic partial sums of call `call_index` (host-level), token, rank: nonnegative floats
// with full mantissas, exactly -0.0 or +0.0 now and then.
float partial(const Knobs& k, int call_index, int64_t token, int rank, int which) {
  const uint64_t h = partial_hash(k.seed, call_index, token, rank, which);
  if (k.zero_one_in > 0) {
    const uint64_t z = (h >> 8) % (2 * static_cast<uint64_t>(k.zero_one_in));
    if (z == 0) return -0.0f;
    if (z == 1) return 0.0f;
  }
  return partial_from_hash(h);
}

// The writer's word for a value, as lamport_word() computes it.
uint32_t slot_word(float v, bool map_negative_zero) {
  const uint32_t b = float_bits(v);
  return map_negative_zero && b == kLamportEmpty ? 0u : b;
}

class Model {
 public:
  explicit Model(const Knobs& k) : k_(k), ranks_(k.world, k.random_delays), clearing_(k.world) {
    words_ = (lamport_slot_offset(k.world, k.capacity, kLamportBuffers, 0, 0) -
              lamport_offset(k.world, k.capacity)) /
             4;
    for (int r = 0; r < k.world; ++r) {
      ws_.emplace_back(new std::atomic<uint32_t>[words_]);
      for (std::size_t i = 0; i < words_; ++i) {
        ws_.back()[i].store(kLamportEmpty, std::memory_order_relaxed);
      }
      clearing_[r].store(0, std::memory_order_relaxed);
    }
  }

  Outcome Run() {
    Outcome o;
    static_cast<Tally&>(o) = ranks_.Run([this](int r) { RankMain(r); });
    o.writes_during_peer_clear = writes_during_peer_clear_.load();
    o.late_clears = late_clears_.load();
    o.negative_zeros = negative_zeros_.load();
    o.positive_zeros = positive_zeros_.load();
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
      if (i < 3) ranks_.MaybeDelay(rng, 512, 50);
    }
  }

  void RankMain(int r) {
    std::mt19937_64 host_rng(k_.seed);  // the same sequence on every rank: they agree on T
    std::mt19937_64 rank_rng(splitmix64(k_.seed * 1000003 + static_cast<uint64_t>(r)));
    uint32_t lamport_call = 0, lamport_tokens = 0;  // this rank's device state
    int64_t n = 0;                                  // kernels this rank has completed
    for (int i = 0; i < k_.calls && !ranks_.aborted(); ++i) {
      const int64_t tokens = tokens_of_call(k_, i, host_rng());
      if (tokens == 0) continue;  // the host returns early: no launch, no state change
      ranks_.StartCall(r, n);

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
      run_blocks(kn.workers, rank_rng, [&](int b, uint64_t seed) { Worker(kn, b, seed); });
      // The kernel has finished: its last block advanced the device state.
      lamport_tokens = static_cast<uint32_t>(tokens);
      lamport_call = (lamport_call + 1) % static_cast<uint32_t>(k_.buffers);
      ranks_.FinishCall(r, n + 1);
      ++n;
      ranks_.MaybeDelay(rank_rng, 12, 300);
    }
  }

  void Worker(const Kernel& kn, int b, uint64_t seed) {
    kernel_boundary();  // kernel start
    std::mt19937_64 rng(seed);
    const int r = kn.rank;
    const int world = k_.world;
    const int W = kn.workers;
    std::atomic<uint32_t>* mine = ws_[r].get();
    ranks_.MaybeDelay(rng, 4, 200);  // blocks start at different times

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
        ranks_.MaybeDelay(rng, 64, 100);
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
      if (ranks_.aborted()) return;
      const float q = partial(k_, kn.call_index, t, r, 0);
      const float k = partial(k_, kn.call_index, t, r, 1);
      for (float v : {q, k}) {
        if (float_bits(v) == kLamportEmpty) negative_zeros_.fetch_add(1, std::memory_order_relaxed);
        if (float_bits(v) == 0u) positive_zeros_.fetch_add(1, std::memory_order_relaxed);
      }
      if (r == k_.slow_rank) std::this_thread::sleep_for(std::chrono::microseconds(k_.slow_us));
      ranks_.MaybeDelay(rng, 32, 200);

      // Publish {q, k, 0, 0} into slot [buf][t][r] of every rank, own workspace included; lanes
      // store in parallel, so peers see the copies in any order.
      const std::array<uint32_t, 4> v = {slot_word(q, k_.map_negative_zero),
                                         slot_word(k, k_.map_negative_zero), 0u, 0u};
      std::shuffle(targets.begin(), targets.end(), rng);
      for (int j : targets) {
        if (j != r && ranks_.WriteInto(j, kn.n) &&
            clearing_[j].load(std::memory_order_relaxed) > 0) {
          writes_during_peer_clear_.fetch_add(1, std::memory_order_relaxed);
        }
        StoreSlot(ws_[j].get() + word_index(kn.buf, t, r), v, rng, r == k_.torn_rank);
        ranks_.MaybeDelay(rng, 96, 100);
      }
      ranks_.MaybeDelay(rng, 32, 200);

      // Bounded wait: "lane" j keeps slot [buf][t][j] once none of its words is -0.0. It backs
      // off to sleeps after 16 passes: a rank's many blocks spin at once.
      const Clock::time_point start = Clock::now();
      auto poll = [&](int j) {
        std::atomic<uint32_t>* slot = mine + word_index(kn.buf, t, j);
        std::array<int, 4> order = {0, 1, 2, 3};
        std::shuffle(order.begin(), order.end(), rng);
        for (int w : order) got[j][w] = slot[w].load(std::memory_order_relaxed);
        bool ok = got[j][0] != kLamportEmpty;
        if (k_.check_all_words) {
          for (int w = 1; w < 4; ++w) ok = ok && got[j][w] != kLamportEmpty;
        }
        return ok;
      };
      auto give_up = [&] {
        if (ranks_.aborted()) return true;
        if (Clock::now() - start <= k_.deadline) return false;
        std::ostringstream os;
        os << "rank " << r << " call #" << kn.call_index << " (kernel " << kn.n << ", buffer "
           << kn.buf << ", " << kn.tokens << " tokens) token " << t << " waited past "
           << k_.deadline.count() << " ms:" << std::hex;
        for (int j = 0; j < world; ++j) {
          if (!have[j]) {
            os << " rank " << j << "'s slot holds {0x" << got[j][0] << ", 0x" << got[j][1] << ", 0x"
               << got[j][2] << ", 0x" << got[j][3] << "}";
          }
        }
        ranks_.TimedOut(os.str());
        return true;
      };
      if (!poll_lanes(have, poll, give_up, 16)) return;

      // Sum in rank order and compare bitwise with an independent evaluation (+0.0 for -0.0).
      const Sums sum = sum_in_rank_order(world, [&](int j) {
        return Sums{bits_float(got[j][0]), bits_float(got[j][1])};
      });
      const Sums want = sum_in_rank_order(world, [&](int j) {
        const float pq = partial(k_, kn.call_index, t, j, 0);
        const float pk = partial(k_, kn.call_index, t, j, 1);
        return Sums{pq == 0.0f ? 0.0f : pq, pk == 0.0f ? 0.0f : pk};
      });
      if (!same_bits(sum, want)) {
        std::ostringstream os;
        os << "rank " << r << " call #" << kn.call_index << " (kernel " << kn.n << ", buffer "
           << kn.buf << ", " << kn.tokens << " tokens) token " << t << ": sum (" << sum.q << ", "
           << sum.k << ") expected (" << want.q << ", " << want.k << ")";
        ranks_.WrongSum(os.str());
        return;
      }
      ranks_.Exchanged();

      ++done_tokens;
      if (forced_late && done_tokens == my_tokens) {
        std::this_thread::sleep_for(std::chrono::microseconds(k_.late_us));
      }
      land_clears(done_tokens);
    }
    kernel_boundary();  // kernel end
  }

  const Knobs k_;
  SimulatedRanks ranks_;
  std::size_t words_ = 0;
  std::vector<std::unique_ptr<std::atomic<uint32_t>[]>> ws_;
  std::vector<std::atomic<int>> clearing_;  // workers of each rank with clears not landed
  std::atomic<int64_t> writes_during_peer_clear_{0}, late_clears_{0}, negative_zeros_{0},
      positive_zeros_{0};
};

}  // namespace

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

Outcome run_model(const Knobs& k) { return Model(k).Run(); }

}  // namespace swiftqk::model::lamport
