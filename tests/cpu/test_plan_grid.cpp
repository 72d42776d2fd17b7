// Tests for the persistent grid: how many blocks each rank gets under residency and an SM
// budget, and which rank and block each block of a launch serves.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "expect_error.hpp"
#include "swiftqk/plan.hpp"

namespace swiftqk {
namespace {

using testing::expect_error;

TEST(GridIsFull, WhenResidencyCapsTheGrid) {
  // 132 SMs x 4 blocks, 8 virtual ranks: 66 blocks each; 8 tokens a block.
  EXPECT_FALSE(grid_is_full(64, 8, 8, 4, 132, 0));   // 8 blocks wanted
  EXPECT_FALSE(grid_is_full(528, 8, 8, 4, 132, 0));  // 66 wanted, 66 fit
  EXPECT_TRUE(grid_is_full(529, 8, 8, 4, 132, 0));   // 67 wanted
  EXPECT_TRUE(grid_is_full(4096, 8, 8, 4, 132, 0));
  EXPECT_TRUE(grid_is_full(64, 8, 8, 4, 132, 2));  // an SM budget of 2: one block a rank
  EXPECT_FALSE(grid_is_full(8, 8, 8, 4, 132, 2));
}

TEST(ResidentBlocks, OccupancyTimesTheSmsInTheBudget) {
  EXPECT_EQ(resident_blocks(4, 132, 0), 528);
  EXPECT_EQ(resident_blocks(4, 132, 2), 8);
  EXPECT_EQ(resident_blocks(4, 132, 500), 528);  // a budget above the SM count
  EXPECT_EQ(resident_blocks(0, 132, 0), 0);
  // The packed layout of TP 8 OLMoE holds 2 blocks an SM: a budget of 2 SMs leaves 4 < 8 ranks,
  // so the launch keeps the unpacked one (4 an SM, 8 blocks).
  EXPECT_LT(resident_blocks(2, 132, 2), 8);
  EXPECT_GE(resident_blocks(4, 132, 2), 8);
}

// ---------------------------------------------------------------- plan_grid

TEST(PlanGrid, NeverExceedsResidency) {
  int planned = 0, refused = 0;
  for (int64_t tokens : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{64}, int64_t{1000},
                         int64_t{100000}, int64_t{1} << 40}) {
    for (int ranks : {1, 2, 4, 8}) {
      for (int tpb : {1, 2, 8}) {
        for (int occ : {1, 2, 4, 16}) {
          for (int sms : {1, 8, 132}) {
            for (int budget : {0, 1, 4, 132, 1000}) {
              SCOPED_TRACE("tokens " + std::to_string(tokens) + " ranks " + std::to_string(ranks) +
                           " tpb " + std::to_string(tpb) + " occ " + std::to_string(occ) + " sms " +
                           std::to_string(sms) + " budget " + std::to_string(budget));
              const int64_t usable = budget == 0 ? sms : std::min(budget, sms);
              const int64_t resident = static_cast<int64_t>(occ) * usable;
              if (resident < ranks) {
                expect_error([&] { plan_grid(tokens, ranks, tpb, occ, sms, budget); }, "resident");
                ++refused;
                continue;
              }
              const GridPlan g = plan_grid(tokens, ranks, tpb, occ, sms, budget);
              ++planned;
              EXPECT_EQ(g.ranks, ranks);
              EXPECT_GE(g.blocks_per_rank, 1);
              EXPECT_EQ(g.grid(), g.ranks * g.blocks_per_rank);
              EXPECT_LE(g.grid(), resident);
              // No more blocks than there are token groups (at least one).
              const int64_t wanted = std::max<int64_t>(1, (tokens + tpb - 1) / tpb);
              EXPECT_LE(g.blocks_per_rank, wanted);
              // And as many as residency allows otherwise.
              EXPECT_EQ(g.blocks_per_rank, std::min(wanted, resident / ranks));
            }
          }
        }
      }
    }
  }
  EXPECT_GT(planned, 0);
  EXPECT_GT(refused, 0);
}

TEST(PlanGrid, ZeroTokensStillOneBlockPerRank) {
  for (int ranks : {1, 2, 8}) {
    const GridPlan g = plan_grid(0, ranks, 4, 2, 132, 0);
    EXPECT_EQ(g.blocks_per_rank, 1);
    EXPECT_EQ(g.grid(), ranks);
  }
}

TEST(PlanGrid, BudgetClampsToSmCount) {
  EXPECT_EQ(plan_grid(1 << 20, 1, 1, 2, 132, 1000).grid(), 264);
  EXPECT_EQ(plan_grid(1 << 20, 1, 1, 2, 132, 0).grid(), 264);
  EXPECT_EQ(plan_grid(1 << 20, 2, 1, 2, 132, 8).grid(), 16);
  EXPECT_EQ(plan_grid(1 << 20, 2, 1, 2, 132, 8).blocks_per_rank, 8);
  // 3 ranks, 16 resident blocks: 5 each, one resident slot unused.
  EXPECT_EQ(plan_grid(1 << 20, 3, 1, 2, 132, 8).blocks_per_rank, 5);
}

TEST(PlanGrid, BudgetTooSmallForOneBlockPerRankThrows) {
  // 8 ranks need 8 resident blocks; 4 SMs x 1 block hold 4.
  expect_error([] { plan_grid(64, 8, 1, 1, 132, 4); },
               "8 ranks in one launch need at least one resident block each");
  expect_error([] { plan_grid(64, 8, 1, 1, 132, 4); }, "only 4 fit");
  expect_error([] { plan_grid(64, 4, 1, 1, 2, 0); }, "resident");
  EXPECT_NO_THROW(plan_grid(64, 8, 1, 2, 132, 4));
}

TEST(PlanGrid, BadArgumentsThrow) {
  expect_error([] { plan_grid(64, 2, 1, 0, 132, 0); }, "occupancy 0");
  expect_error([] { plan_grid(64, 0, 1, 2, 132, 0); }, "must be positive");
  expect_error([] { plan_grid(64, 2, 0, 2, 132, 0); }, "must be positive");
  expect_error([] { plan_grid(64, 2, 1, 2, 0, 0); }, "must be positive");
  expect_error([] { plan_grid(64, 2, 1, 2, 132, -1); }, "sm_budget");
}

// ---------------------------------------------------------------- block order

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

TEST(BlockOrder, InterleavedFrom2048TokensWithSeveralRanks) {
  EXPECT_EQ(choose_block_order(2, kInterleaveMinTokens), BlockOrder::kInterleaved);
  EXPECT_EQ(choose_block_order(8, 16384), BlockOrder::kInterleaved);
  EXPECT_EQ(choose_block_order(2, kInterleaveMinTokens - 1), BlockOrder::kRankMajor);
  EXPECT_EQ(choose_block_order(8, 64), BlockOrder::kRankMajor);
  // One rank per launch (TP 1, or one process per GPU): nothing to interleave.
  EXPECT_EQ(choose_block_order(1, 16384), BlockOrder::kRankMajor);
}

}  // namespace
}  // namespace swiftqk
