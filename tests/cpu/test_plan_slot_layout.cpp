// Tests for the workspace layout: the exchange slots in both orders, the probe and fault words
// and the Lamport buffers after them, and which order a call picks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <set>
#include <string>

#include "swiftqk/plan.hpp"

namespace swiftqk {
namespace {

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

}  // namespace
}  // namespace swiftqk
