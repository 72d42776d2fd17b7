// Consumed exchange slots are not cleared one by one: they keep their partials until a scrub call
// (is_scrub_call, the last two calls of every kScrubPeriod) zeroes its whole bank, every token up
// to the capacity. These tests read the workspaces back around the scrub calls: what an ordinary
// call leaves, what a scrub call removes (including tokens past its own count), and that the
// outputs stay right throughout.
#include <gtest/gtest.h>

#include <vector>

#include "comm_state.hpp"
#include "problem.hpp"
#include "protocol.hpp"
#include "require_gpu.hpp"

namespace swiftqk::testing {
namespace {

constexpr int64_t kCapacity = 300;  // room for source-major calls (256 tokens and more)

// Per rank, per bank: how many slots are zero and which tags (word 0) the others carry.
struct BankView {
  int64_t zero = 0;
  std::vector<uint32_t> tags;  // [token * world + src], 0 for zero slots
};

// The calls below have 1024 + 512 elements, rows of at most 768 elements a rank: calls of 256
// tokens or more at world 8 run source-major slots, the others token-major ones
// (choose_slot_layout), so a bank is written in one order and scrubbed in the other.
constexpr int64_t kQWidth = 1024, kKWidth = 512;

// tags of bank `bank` as the call of `tokens` tokens that wrote it laid them out
BankView read_bank(const Communicator& c, int bank, int64_t tokens) {
  const detail::CommState& s = c.state();
  const int world = s.world;
  const SlotLayout layout = choose_slot_layout(world, kQWidth, kKWidth, tokens);
  // A bank is one region of capacity x world slots in either layout.
  const std::size_t base = bank * slot_bank_bytes(world, kCapacity);
  std::vector<uint64_t> words(static_cast<std::size_t>(kCapacity) * world * 2);
  SWIFTQK_CUDA_TRY(cudaMemcpy(words.data(), s.local_ws + base, words.size() * sizeof(uint64_t),
                              cudaMemcpyDeviceToHost));
  BankView v;
  v.tags.resize(static_cast<std::size_t>(kCapacity) * world);
  for (int64_t t = 0; t < kCapacity; ++t) {
    for (int src = 0; src < world; ++src) {
      const std::size_t w = (slot_offset(world, kCapacity, bank, t, src, layout) - base) / 8;
      const uint64_t w0 = words[w], w1 = words[w + 1];
      if (w0 == 0 && w1 == 0) {
        ++v.zero;
      } else {
        v.tags[static_cast<std::size_t>(t) * world + src] = static_cast<uint32_t>(w0 >> 32);
      }
    }
  }
  return v;
}

void set_call(std::vector<Communicator>& comms, uint32_t call) {
  for (auto& c : comms) {
    SWIFTQK_CUDA_TRY(
        cudaMemcpy(&c.state().d_state->call, &call, sizeof call, cudaMemcpyHostToDevice));
  }
}

// One eager call of `tokens` tokens on every virtual rank, checked against float64.
void run_checked(std::vector<Communicator>& comms, int64_t tokens, uint64_t seed, cudaStream_t s) {
  const int world = static_cast<int>(comms.size());
  const Problem p =
      Problem::random(tokens, kQWidth, kKWidth, DType::kBF16, NormOrder::kOlmo2, 1e-6f, seed);
  std::vector<RankData> data;
  std::vector<QkNormParams> pp;
  std::vector<Communicator*> cp;
  for (int r = 0; r < world; ++r) {
    data.push_back(make_rank(p, world, r, Layout::kSeparate));
    poison(data.back(), s);
    pp.push_back(data.back().params);
    cp.push_back(&comms[r]);
  }
  launch_qk_norm_group(cp, pp, s);
  for (auto& c : comms) c.synchronize(s);
  std::vector<RankData*> rp;
  for (auto& d : data) rp.push_back(&d);
  const Check chk = check_ranks(p, world, rp);
  EXPECT_EQ(chk.wrong, 0) << tokens << " tokens: " << chk.first_error;
  EXPECT_TRUE(chk.rstd_identical);
}

TEST(SlotScrub, ScrubCallsZeroTheirWholeBankOrdinaryCallsLeaveTheirSlots) {
  REQUIRE_GPU();
  for (int world : {2, 4, 8}) {
    SCOPED_TRACE("world " + std::to_string(world));
    CommConfig cfg;
    cfg.token_capacity = kCapacity;
    cfg.timeout_s = wait_s(10.0);
    auto comms = Communicator::create_local_group(std::vector<int>(world, 0), cfg);
    cudaStream_t s;
    SWIFTQK_CUDA_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    const int64_t slots = kCapacity * world;
    const uint32_t c0 = kScrubPeriod - 4;  // bank 0, then banks 1, 0 (scrub), 1 (scrub), 0
    ASSERT_FALSE(is_scrub_call(c0) || is_scrub_call(c0 + 1));
    ASSERT_TRUE(is_scrub_call(c0 + 2) && is_scrub_call(c0 + 3) && !is_scrub_call(c0 + 4));
    set_call(comms, c0);

    // Two ordinary calls, of 260 tokens on bank 0 (source-major at world 8) and 90 on bank 1:
    // their slots keep the partials under their call's tag.
    const int64_t n0 = 260, n1 = 90;
    run_checked(comms, n0, 1, s);
    run_checked(comms, n1, 2, s);
    for (auto& c : comms) {
      for (int bank : {0, 1}) {
        const int64_t n = bank == 0 ? n0 : n1;
        const BankView v = read_bank(c, bank, n);
        EXPECT_EQ(v.zero, slots - n * world) << "rank " << c.rank() << " bank " << bank;
        for (int64_t i = 0; i < n * world; ++i) {
          ASSERT_EQ(v.tags[i], tag_for_call(c0 + bank)) << "rank " << c.rank() << " slot " << i;
        }
      }
    }
    // A scrub call of 3 tokens (token-major) on bank 0: afterwards all of bank 0 is zero, tokens
    // 3..259 of the earlier call included, whatever their order; bank 1 is untouched.
    run_checked(comms, 3, 3, s);
    for (auto& c : comms) {
      EXPECT_EQ(read_bank(c, 0, 3).zero, slots) << "rank " << c.rank();
      EXPECT_EQ(read_bank(c, 1, n1).zero, slots - n1 * world) << "rank " << c.rank();
    }
    // The second scrub call, 270 tokens on bank 1 (source-major at world 8): it clears what the
    // token-major call left there, and its own slots.
    run_checked(comms, 270, 4, s);
    for (auto& c : comms) {
      EXPECT_EQ(read_bank(c, 0, 3).zero, slots) << "rank " << c.rank();
      EXPECT_EQ(read_bank(c, 1, 270).zero, slots) << "rank " << c.rank();
    }
    // Ordinary again: 7 tokens on bank 0 leave exactly their slots.
    run_checked(comms, 7, 5, s);
    for (auto& c : comms) {
      const BankView v = read_bank(c, 0, 7);
      EXPECT_EQ(v.zero, slots - 7 * world) << "rank " << c.rank();
      EXPECT_EQ(v.tags[0], tag_for_call(c0 + 4));
    }
    SWIFTQK_CUDA_TRY(cudaStreamDestroy(s));
  }
}

}  // namespace
}  // namespace swiftqk::testing
