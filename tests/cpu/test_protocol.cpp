// Tests for what host and kernels agree on (protocol.hpp): which rank a block serves, the slot
// layout and order, the workspace's layout, call tags and banks, and the configuration hash.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "launch_plan.hpp"
#include "protocol.hpp"

namespace swiftqk {
namespace {

// ---------------------------------------------------------------- slot layout

constexpr SlotLayout kTM = SlotLayout::kTokenMajor;
constexpr SlotLayout kSM = SlotLayout::kSourceMajor;
static_assert(slot_offset(2, 4, 0, 0, 0, kTM) == 0, "first slot at 0");
static_assert(slot_offset(2, 4, 0, 0, 1, kTM) == 16, "token-major: sources of a token adjacent");
static_assert(slot_offset(2, 4, 0, 1, 0, kTM) == 32, "token-major: tokens follow each other");
static_assert(slot_offset(2, 4, 1, 0, 0, kTM) == 2 * 4 * 16, "bank 1 after bank 0");
static_assert(slot_offset(2, 4, 0, 1, 0, kSM) == 16, "source-major: a source's tokens adjacent");
static_assert(slot_offset(2, 4, 0, 0, 1, kSM) == 4 * 16, "source-major: sources follow");
static_assert(slot_offset(2, 4, 1, 0, 0, kSM) == 2 * 4 * 16, "the same bank regions");
static_assert(slot_token_stride(8, kTM) == 8 * 16 && slot_token_stride(8, kSM) == 16,
              "a token step is world slots token-major, one source-major");
static_assert(probe_offset(2, 4) == 2 * 2 * 4 * 16, "probe after both banks");
static_assert(fault_offset(2, 4) == probe_offset(2, 4) + 16, "8 probe bytes per rank");
static_assert(lamport_offset(2, 4) == fault_offset(2, 4) + 16, "the fault word, 16-aligned");
static_assert(workspace_bytes(2, 4) == lamport_offset(2, 4) + 3 * 4 * 2 * 16,
              "three Lamport buffers last");

// Every block of a launch serves exactly one (rank, block) pair and every pair has one block, in
// both orders; interleaved, consecutive blocks serve consecutive ranks.
TEST(BlockOrder, EveryRankBlockPairOnceInBothOrders) {
  for (int ranks : {1, 2, 3, 8, 16}) {
    for (int bpr : {1, 5, 64, 264}) {
      for (BlockOrder order : {BlockOrder::kRankMajor, BlockOrder::kInterleaved}) {
        std::vector<int> seen(static_cast<std::size_t>(ranks) * bpr, 0);
        for (int b = 0; b < ranks * bpr; ++b) {
          const BlockRole r = block_role(b, ranks, bpr, order);
          ASSERT_GE(r.rank, 0);
          ASSERT_LT(r.rank, ranks);
          ASSERT_GE(r.block, 0);
          ASSERT_LT(r.block, bpr);
          ++seen[static_cast<std::size_t>(r.rank) * bpr + r.block];
          if (order == BlockOrder::kInterleaved) {
            ASSERT_EQ(r.rank, b % ranks);
          } else {
            ASSERT_EQ(r.rank, b / bpr);
          }
        }
        for (int v : seen) ASSERT_EQ(v, 1) << ranks << " ranks, " << bpr << " blocks each";
      }
    }
  }
}

TEST(SlotLayout, InjectiveContiguousAndInsideTheWorkspace) {
  for (const SlotLayout layout : {kTM, kSM}) {
    for (int world : {1, 2, 3, 4, 8}) {
      for (int64_t capacity : {1, 2, 3, 17, 64}) {
        SCOPED_TRACE("layout " + std::to_string(static_cast<int>(layout)) + " world " +
                     std::to_string(world) + " capacity " + std::to_string(capacity));
        const std::size_t bank_bytes = static_cast<std::size_t>(capacity) * world * kSlotBytes;
        std::set<std::size_t> seen;
        std::size_t max_end = 0;
        for (int bank = 0; bank < kSlotBanks; ++bank) {
          for (int64_t t = 0; t < capacity; ++t) {
            for (int src = 0; src < world; ++src) {
              const std::size_t off = slot_offset(world, capacity, bank, t, src, layout);
              ASSERT_TRUE(seen.insert(off).second)
                  << "bank " << bank << " t " << t << " src " << src;
              ASSERT_EQ(off % kSlotBytes, 0u);  // 16-byte vector accesses
              // Every slot of a bank lies in that bank's region, whatever the layout: a scrub
              // of a bank in one layout clears what a call in the other one left there.
              ASSERT_GE(off, bank * bank_bytes);
              ASSERT_LT(off, (bank + 1) * bank_bytes);
              const std::size_t expect =
                  (layout == kTM ? (static_cast<std::size_t>(bank) * capacity + t) * world + src
                                 : (static_cast<std::size_t>(bank) * world + src) * capacity + t) *
                  kSlotBytes;
              ASSERT_EQ(off, expect);
              if (t + 1 < capacity) {  // what the kernel adds per token
                ASSERT_EQ(slot_offset(world, capacity, bank, t + 1, src, layout),
                          off + slot_token_stride(world, layout));
              }
              max_end = std::max(max_end, off + kSlotBytes);
            }
            if (layout == kTM) {  // a token's world slots are one run of world * 16 bytes
              ASSERT_EQ(
                  slot_offset(world, capacity, bank, t, world - 1, layout),
                  slot_offset(world, capacity, bank, t, 0, layout) + (world - 1) * kSlotBytes);
            }
          }
        }
        EXPECT_EQ(seen.size(), static_cast<std::size_t>(kSlotBanks * capacity * world));
        // Dense: the slots exactly fill [0, probe_offset).
        EXPECT_EQ(max_end, probe_offset(world, capacity));
        EXPECT_EQ(max_end, static_cast<std::size_t>(kSlotBanks * capacity * world) * kSlotBytes);
      }
    }
  }
  for (int world : {1, 2, 3, 4, 8}) {
    for (int64_t capacity : {1, 2, 3, 17, 64}) {
      SCOPED_TRACE("world " + std::to_string(world) + " capacity " + std::to_string(capacity));
      EXPECT_EQ(probe_offset(world, capacity) % 8, 0u);
      // The probe words, the fault word, then the Lamport buffers (16-byte aligned, dense,
      // non-overlapping).
      const std::size_t fault = fault_offset(world, capacity);
      EXPECT_EQ(fault, probe_offset(world, capacity) + 8 * static_cast<std::size_t>(world));
      EXPECT_EQ(fault % 8, 0u);
      const std::size_t lam = lamport_offset(world, capacity);
      EXPECT_GE(lam, fault + 8);
      EXPECT_LT(lam, fault + 8 + 16);
      EXPECT_EQ(lam % 16, 0u);
      EXPECT_EQ(lamport_slot_offset(world, capacity, 0, 0, 0), lam);
      EXPECT_EQ(lamport_slot_offset(world, capacity, 1, 0, 0) - lam,
                static_cast<std::size_t>(capacity) * world * kSlotBytes);
      EXPECT_EQ(lamport_slot_offset(world, capacity, 0, 1, 0) - lam, world * kSlotBytes);
      EXPECT_EQ(workspace_bytes(world, capacity),
                lam + static_cast<std::size_t>(kLamportBuffers) * capacity * world * kSlotBytes);
    }
  }
}

TEST(SlotLayout, SourceMajorForRowsOfAtMost512ElementsAtTp8To16From256Tokens) {
  // The model shapes (Q, K) at 4096 tokens: OLMoE at TP 8, and four models at TP 16.
  EXPECT_EQ(choose_slot_layout(8, 2048, 2048, 4096), kSM);   // OLMoE, 512 elements a rank
  EXPECT_EQ(choose_slot_layout(4, 2048, 2048, 4096), kTM);   // 1024
  EXPECT_EQ(choose_slot_layout(8, 6144, 1024, 4096), kTM);   // MiniMax-M2, 896
  EXPECT_EQ(choose_slot_layout(8, 5120, 1024, 4096), kTM);   // OLMo3-32B, 768
  EXPECT_EQ(choose_slot_layout(16, 6144, 1024, 4096), kSM);  // 448
  EXPECT_EQ(choose_slot_layout(16, 4096, 4096, 4096), kSM);  // OLMo2-7B, 512
  EXPECT_EQ(choose_slot_layout(16, 5120, 5120, 4096), kTM);  // OLMo2-13B, 640
  // The bounds: tokens, row length, world.
  EXPECT_EQ(choose_slot_layout(8, 2048, 2048, kSourceMajorMinTokens), kSM);
  EXPECT_EQ(choose_slot_layout(8, 2048, 2048, kSourceMajorMinTokens - 1), kTM);
  EXPECT_EQ(choose_slot_layout(8, 2048, 2048, 1), kTM);
  EXPECT_EQ(choose_slot_layout(8, 2048, 2056, 4096), kTM);  // 513 elements
  EXPECT_EQ(choose_slot_layout(4, 1024, 1024, 4096), kTM);  // short rows at TP 4
  EXPECT_EQ(choose_slot_layout(2, 256, 256, 4096), kTM);
  EXPECT_EQ(choose_slot_layout(1, 256, 256, 4096), kTM);
  EXPECT_EQ(choose_slot_layout(32, 4096, 4096, 4096), kTM);  // no packed rows past TP 16
  EXPECT_EQ(kSourceMajorMaxRowElements, kMaxPackedVectors * 8);
}

// ---------------------------------------------------------------- call tags and banks

// The NCCL fallback's per-call check: summed over the ranks in any order, the check floats say
// "all agree" on every rank when every rank's hash is the same, and on no rank when any byte of
// any rank's differs; the squares catch what the sums alone would not.
TEST(ConfigCheck, AgreesIffEveryRankSentTheSameHash) {
  auto summed = [](const std::vector<uint32_t>& hashes, bool reversed) {
    std::vector<float> s(kConfigCheckFloats, 0.f);
    for (std::size_t k = 0; k < hashes.size(); ++k) {
      const uint32_t h = hashes[reversed ? hashes.size() - 1 - k : k];
      for (int i = 0; i < kConfigCheckFloats; ++i) s[i] += config_check_value(h, i);
    }
    return s;
  };
  const uint32_t base = config_hash(5120, 1024, 8, 1e-6f, 0, 4096);
  for (int world : {2, 3, 8, 32}) {
    for (bool reversed : {false, true}) {
      std::vector<uint32_t> same(world, base);
      EXPECT_TRUE(config_check_agrees(base, world, summed(same, reversed).data())) << world;
      // One rank differs in one byte (each byte in turn, by one and by the most): no rank agrees.
      for (int byte = 0; byte < 4; ++byte) {
        for (uint32_t delta : {1u, 0x80u}) {
          std::vector<uint32_t> h = same;
          h[world - 1] = base ^ (delta << (8 * byte));
          const std::vector<float> s = summed(h, reversed);
          for (uint32_t own : {h[0], h[world - 1]}) {
            EXPECT_FALSE(config_check_agrees(own, world, s.data()))
                << "world " << world << " byte " << byte << " delta " << delta;
          }
        }
      }
    }
  }
  // Other widths, eps or token counts give other hashes (what the check compares).
  EXPECT_NE(base, config_hash(5120, 1024, 8, 1e-5f, 0, 4096));
  EXPECT_NE(base, config_hash(5120, 2048, 8, 1e-6f, 0, 4096));
  EXPECT_NE(base, config_hash(5120, 1024, 8, 1e-6f, 0, 4095));
  // x = 1 and 3 against an own 2 and 2: equal sums, the squares differ (1 + 9 against 2 x 4).
  const uint32_t one = 0x00000000u, three = 0x00000002u, two = 0x00000001u;
  std::vector<float> s = summed({one, three}, false);
  EXPECT_EQ(s[0], 2.f * config_check_value(two, 0));  // sums alone would agree
  EXPECT_FALSE(config_check_agrees(two, 2, s.data()));
  // The largest sums (32 ranks, every byte 255) stay exact in fp32.
  std::vector<uint32_t> top(32, 0xffffffffu);
  EXPECT_TRUE(config_check_agrees(0xffffffffu, 32, summed(top, true).data()));
}

TEST(CallTags, NeverZeroAndWrapsAt2To30) {
  for (uint32_t c = 0; c < (1u << 16); ++c) ASSERT_NE(tag_for_call(c), 0u) << c;
  for (uint32_t c = 0x3fff0000u; c <= 0x3fffffffu; ++c) ASSERT_NE(tag_for_call(c), 0u) << c;
  // Any 32-bit counter value (the counter is kept below 2^30, but the tag masks anyway).
  for (uint64_t c = 0; c <= 0xffffffffull; c += 0x10001ull) {
    ASSERT_NE(tag_for_call(static_cast<uint32_t>(c)), 0u) << c;
    ASSERT_LE(tag_for_call(static_cast<uint32_t>(c)), 1u << 30) << c;
  }
  EXPECT_EQ(tag_for_call(0), 1u);
  EXPECT_EQ(tag_for_call(0x3fffffffu), 0x40000000u);
  EXPECT_EQ(next_call(0x3fffffffu), 0u);
  EXPECT_EQ(next_call(0), 1u);
}

TEST(CallTags, BankAlternatesAndTagsDifferAcrossTheWrap) {
  for (uint32_t start : {0u, 1u, 12345u, 0x3ffffff0u, 0x3ffffffdu, 0x3ffffffeu, 0x3fffffffu}) {
    uint32_t c = start;
    for (int i = 0; i < 16; ++i) {
      const uint32_t c1 = next_call(c), c2 = next_call(c1);
      SCOPED_TRACE("call " + std::to_string(c));
      EXPECT_LT(c1, 1u << 30);
      EXPECT_NE(bank_for_call(c), bank_for_call(c1));
      EXPECT_EQ(bank_for_call(c), bank_for_call(c2));
      EXPECT_NE(tag_for_call(c), tag_for_call(c1));
      EXPECT_NE(tag_for_call(c1), tag_for_call(c2));
      EXPECT_NE(tag_for_call(c), tag_for_call(c2));
      c = c1;
    }
  }
  // Walk through the wrap explicitly.
  uint32_t c = 0x3ffffffdu;
  std::vector<uint32_t> seen;
  for (int i = 0; i < 6; ++i) {
    seen.push_back(c);
    c = next_call(c);
  }
  EXPECT_EQ(seen, (std::vector<uint32_t>{0x3ffffffdu, 0x3ffffffeu, 0x3fffffffu, 0u, 1u, 2u}));
  for (std::size_t i = 1; i < seen.size(); ++i) {
    EXPECT_NE(bank_for_call(seen[i]), bank_for_call(seen[i - 1])) << i;
  }
}

TEST(ConfigHash, TopBitSetDeterministicAndSensitive) {
  const uint32_t h = config_hash(4096, 1024, 2, 1e-6f, 0, 64);
  EXPECT_EQ(h & 0x80000000u, 0x80000000u);
  EXPECT_EQ(h, config_hash(4096, 1024, 2, 1e-6f, 0, 64));
  EXPECT_NE(h, config_hash(4096 + 2, 1024, 2, 1e-6f, 0, 64));
  EXPECT_NE(h, config_hash(5120, 1024, 2, 1e-6f, 0, 64));
  EXPECT_NE(h, config_hash(4096, 1024 + 2, 2, 1e-6f, 0, 64));
  EXPECT_NE(h, config_hash(4096, 512, 2, 1e-6f, 0, 64));
  EXPECT_NE(h, config_hash(1024, 4096, 2, 1e-6f, 0, 64));  // q and k swapped
  EXPECT_NE(h, config_hash(4096, 1024, 4, 1e-6f, 0, 64));
  EXPECT_NE(h, config_hash(4096, 1024, 1, 1e-6f, 0, 64));
  EXPECT_NE(h, config_hash(4096, 1024, 2, 1e-5f, 0, 64));
  EXPECT_NE(h, config_hash(4096, 1024, 2, 1.0000001e-6f, 0, 64));
  EXPECT_NE(h, config_hash(4096, 1024, 2, 1e-6f, 1, 64));
  EXPECT_NE(h, config_hash(4096, 1024, 2, 1e-6f, 0, 63));  // another token count
  EXPECT_NE(h, config_hash(4096, 1024, 2, 1e-6f, 0, 65));

  // Every hash over a grid of configurations has its top bit set; distinct inputs rarely collide.
  std::set<uint32_t> hashes;
  int configs = 0;
  for (int64_t q : {2048, 4096, 5120, 6144, 1000}) {
    for (int64_t k : {8, 1024, 4096, 5120}) {
      for (int world : {1, 2, 4, 8}) {
        for (float eps : {1e-5f, 1e-6f, 1e-8f}) {
          for (int order : {0, 1}) {
            const uint32_t x = config_hash(q, k, world, eps, order, 64);
            ASSERT_EQ(x >> 31, 1u);
            ASSERT_EQ(x, config_hash(q, k, world, eps, order, 64));
            hashes.insert(x);
            ++configs;
          }
        }
      }
    }
  }
  EXPECT_EQ(static_cast<int>(hashes.size()), configs);
}

TEST(ConfigHash, KTagIsNeverZeroNorAPlainTag) {
  std::vector<uint32_t> hashes;
  for (int64_t q : {2048, 4096, 5120}) {
    for (int world : {1, 2, 8}) {
      for (int order : {0, 1}) hashes.push_back(config_hash(q, 1024, world, 1e-6f, order, 64));
    }
  }
  // The claim is structural: every tag is in [1, 2^30] (top bit clear) and every hash has its
  // top bit set, so tag ^ hash has its top bit set. Check it over the ends of the tag range and
  // a stride through the middle.
  std::vector<uint32_t> tags;
  for (uint32_t t = 1; t <= (1u << 16); ++t) tags.push_back(t);
  for (uint32_t t = (1u << 30) - (1u << 16); t <= (1u << 30); ++t) tags.push_back(t);
  for (uint32_t t = 1; t <= (1u << 30); t += 4099) tags.push_back(t);
  for (uint32_t h : hashes) {
    for (uint32_t t : tags) {
      const uint32_t kt = t ^ h;
      ASSERT_NE(kt, 0u) << "tag " << t << " hash " << h;
      ASSERT_GT(kt, 1u << 30) << "tag " << t << " hash " << h;  // so never a plain tag
      ASSERT_EQ(kt ^ h, t);
    }
  }
  // And via the real call->tag map at the wrap.
  for (uint32_t h : hashes) {
    for (uint32_t c = 0x3ffffff0u; c != 0x10u; c = next_call(c)) {
      ASSERT_NE(tag_for_call(c) ^ h, 0u);
      ASSERT_NE(tag_for_call(c) ^ h, tag_for_call(c));
    }
  }
}

}  // namespace
}  // namespace swiftqk
