// Tests for the launch policy (launch_plan.hpp): kernel shapes, pipeline depths, persistent
// grids, block order, and make_launch_plan's choices for the five model shapes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "expect_error.hpp"
#include "launch_plan.hpp"
#include "swiftqk/error.hpp"

namespace swiftqk {
namespace {

// ---------------------------------------------------------------- choose_kernel_shape

struct Widths {
  int64_t q, k;
};

// Full (all-rank) Q/K widths of real models plus odd ones.
const std::vector<Widths> kFullWidths = {
    {2048, 2048}, {4096, 4096}, {5120, 5120}, {5120, 1024},
    {6144, 1024}, {1000, 200},  {4100, 12},   {130000, 8},
};
const std::vector<int> kTp = {1, 2, 4, 8};
// bf16 (16 B / 2), f32 (16 B / 4), fp8 (16 B / 1) and the scalar path.
const std::vector<int> kVec = {8, 4, 16, 1};

// Checks every invariant the kernel relies on; returns a description of the first violation.
::testing::AssertionResult ShapeIsValid(const KernelShape& s, int64_t qw, int64_t kw, int vec,
                                        int world = 1) {
  const int64_t n = qw / vec + kw / vec;
  auto fail = [&]() {
    return ::testing::AssertionFailure()
           << "q " << qw << " k " << kw << " vec " << vec << " (n = " << n << " vectors): vpt "
           << s.vectors_per_thread << " group " << s.group_threads << " tokens/block "
           << s.tokens_per_block << ": ";
  };
  if (s.vec_elems != vec) return fail() << "vec_elems " << s.vec_elems;
  const bool streaming = vec == 1 || n > kMaxStagedVectors;
  const int G = s.group_threads;
  if (G < 32) {
    // Narrower than a warp: staged rows only, a power of two, one lane per rank's slot.
    if (streaming) return fail() << "a streaming group narrower than a warp";
    if (G < kMinGroupThreads || (G & (G - 1)) != 0) return fail() << "sub-warp group size";
    if (G < world) return fail() << "fewer lanes than ranks";
  } else if (G % 32 != 0) {
    return fail() << "group not whole warps";
  }
  if (G > 1024) return fail() << "group > 1024";
  if (s.tokens_per_block < 1) return fail() << "tokens_per_block < 1";
  if (s.block_threads() > 1024) return fail() << "block_threads > 1024";
  if (s.block_threads() != s.group_threads * s.tokens_per_block) return fail() << "block_threads";
  // Groups of whole warps each have a hardware barrier (and a slot of the kernel's 32-entry
  // per-group arrays); narrower groups use neither.
  if (G > 32 && s.tokens_per_block > kMaxGroupsPerBlock)
    return fail() << "more groups than barriers";
  if (streaming != (s.vectors_per_thread == 0)) return fail() << "streaming choice wrong";
  if (!streaming) {
    const int vpt = s.vectors_per_thread;
    if (vpt != 1 && vpt != 2 && vpt != 4 && vpt != 8) return fail() << "vectors_per_thread";
    if (static_cast<int64_t>(G) * vpt < n) return fail() << "row does not fit";
    // The deepest ring of the block's rows must fit the 227 KB of shared memory a block may use.
    if (kMaxStages * 16 * n * s.tokens_per_block > kMaxStagedRingBytes && s.tokens_per_block > 1)
      return fail() << "staged rows too large";
    // No whole warp of the group holds nothing; a sub-warp group is no wider than it must be.
    if (G > 32 && static_cast<int64_t>(G - 32) * vpt >= n) return fail() << "idle warp";
    if (G < 32 && G > std::max(kMinGroupThreads, world) && static_cast<int64_t>(G / 2) * vpt >= n)
      return fail() << "sub-warp group twice too wide";
  }
  return ::testing::AssertionSuccess();
}

TEST(ChooseKernelShape, AllModelShapesAndTpDegrees) {
  int checked = 0, rejected = 0;
  for (const Widths& full : kFullWidths) {
    for (int tp : kTp) {
      if (full.q % tp != 0 || full.k % tp != 0) continue;  // validate_params rejects these
      const int64_t qw = full.q / tp, kw = full.k / tp;
      for (int vec : kVec) {
        SCOPED_TRACE("full " + std::to_string(full.q) + "/" + std::to_string(full.k) + " TP " +
                     std::to_string(tp) + " vec " + std::to_string(vec));
        if (qw % vec != 0 || kw % vec != 0) {
          EXPECT_TRUE(testing::throws_error([&] { choose_kernel_shape(qw, kw, vec); },
                                            "multiples of the vector size"));
          ++rejected;
          continue;
        }
        EXPECT_TRUE(ShapeIsValid(choose_kernel_shape(qw, kw, vec), qw, kw, vec));
        ++checked;
      }
    }
  }
  // The scalar path takes every shape, so each (shape, TP) that divides is checked at least once.
  EXPECT_GT(checked, 80);
  EXPECT_GT(rejected, 0);
}

TEST(ChooseKernelShape, KnownShapes) {
  // bf16, 4096/1024 at TP 2: 2048 + 512 elements = 320 vectors, 4 a thread, 80 -> 96 threads.
  KernelShape s = choose_kernel_shape(2048, 512, 8);
  EXPECT_EQ(s.vectors_per_thread, 4);
  EXPECT_EQ(s.group_threads, 96);
  EXPECT_EQ(s.tokens_per_block, 2);
  // Narrow rows at TP 8: 256 + 128 bf16 elements = 48 vectors, one warp, 2 vectors a thread.
  s = choose_kernel_shape(256, 128, 8);
  EXPECT_EQ(s.group_threads, 32);
  EXPECT_EQ(s.vectors_per_thread, 2);
  EXPECT_EQ(s.tokens_per_block, 8);
  // 130000 + 8 scalar elements stream, 1024 threads a row.
  s = choose_kernel_shape(130000, 8, 1);
  EXPECT_EQ(s.vectors_per_thread, 0);
  EXPECT_EQ(s.group_threads, 1024);
  EXPECT_EQ(s.block_threads(), 1024);
}

TEST(ChooseKernelShape, BlockThreadsSetsGroupsPerBlock) {
  // OLMoE alone (TP 1): 2048 + 2048 bf16 = 512 vectors, 128-thread groups.
  EXPECT_EQ(choose_kernel_shape(2048, 2048, 8, kDefaultBlockThreads).tokens_per_block, 2);
  EXPECT_EQ(choose_kernel_shape(2048, 2048, 8, kDefaultBlockThreadsAlone).tokens_per_block, 3);
  // OLMo3-32B alone: 5120 + 1024 = 768 vectors, 192-thread groups: one per 256, two per 384.
  EXPECT_EQ(choose_kernel_shape(5120, 1024, 8, 256).tokens_per_block, 1);
  EXPECT_EQ(choose_kernel_shape(5120, 1024, 8, 384).tokens_per_block, 2);
  // A group wider than the target still gets a block; groups of several warps stop at the
  // barrier count, one-warp groups (which need no barrier) fill the block.
  EXPECT_EQ(choose_kernel_shape(5120, 5120, 8, 32).tokens_per_block, 1);
  EXPECT_EQ(choose_kernel_shape(528, 528, 8, 1024).group_threads, 64);  // 132 vectors
  EXPECT_EQ(choose_kernel_shape(528, 528, 8, 1024).tokens_per_block, kMaxGroupsPerBlock);
  // 256 vectors: the deepest ring of 5 x 4 KB rows holds 10 groups in kMaxStagedRingBytes.
  EXPECT_EQ(choose_kernel_shape(1024, 1024, 8, 1024).tokens_per_block, 10);
  EXPECT_EQ(choose_kernel_shape(256, 128, 8, 1024).tokens_per_block, 32);
  for (int bad : {0, 31, 1025}) {
    EXPECT_TRUE(testing::throws_error([&] { choose_kernel_shape(2048, 2048, 8, bad); },
                                      "block_threads must be in [32, 1024]"));
  }
}

TEST(PipelineDepth, DefersLog2WorldWithOneRowAhead) {
  struct Want {
    int world, stages, defer;
  };
  // Alone nothing is deferred; with peers D = log2(world) capped at kMaxStages - 2, stages D + 2.
  for (const Want w : {Want{1, 2, 0}, Want{2, 3, 1}, Want{3, 3, 1}, Want{4, 4, 2}, Want{6, 4, 2},
                       Want{8, 5, 3}, Want{16, 5, 3}, Want{32, 5, 3}}) {
    const PipelineDepth d = choose_pipeline_depth(w.world);
    EXPECT_EQ(d.stages, w.stages) << "world " << w.world;
    EXPECT_EQ(d.defer, w.defer) << "world " << w.world;
    // The staged rows always hold the reduced one and the deferred ones.
    EXPECT_GE(d.stages - 1 - d.defer, 0) << "world " << w.world;
    EXPECT_GE(d.stages, kMinStages);
    EXPECT_LE(d.stages, kMaxStages);
  }
}

TEST(PipelineDepth, ShallowCandidateOnlyForManyRanksAndFewTokens) {
  for (const int world : {8, 16}) {
    for (const int64_t tokens : {int64_t{0}, int64_t{1}, int64_t{64}, kShallowMaxTokens}) {
      const PipelineDepth d = shallow_pipeline_depth(world, tokens);
      EXPECT_EQ(d.stages, 3) << "world " << world << ", " << tokens << " tokens";
      EXPECT_EQ(d.defer, 2) << "world " << world << ", " << tokens << " tokens";
    }
    EXPECT_EQ(shallow_pipeline_depth(world, kShallowMaxTokens + 1).stages, 0);
  }
  for (const int world : {1, 2, 4, 6, 7}) {
    EXPECT_EQ(shallow_pipeline_depth(world, 64).stages, 0) << "world " << world;
    EXPECT_EQ(shallow_pipeline_depth(world, 64).defer, 0) << "world " << world;
  }
  EXPECT_TRUE(testing::throws_error([] { shallow_pipeline_depth(0, 64); }, "world must be >= 1"));
  EXPECT_TRUE(testing::throws_error([] { shallow_pipeline_depth(8, -1); }, "tokens >= 0"));
}

TEST(PipelineDepth, FewTokensAtTp4To8TakeThreeStagesAndOneDeferred) {
  for (const int world : {4, 5, 6, 8}) {
    for (const int64_t tokens :
         {int64_t{0}, int64_t{1}, int64_t{64}, int64_t{1536}, kFewTokensMax}) {
      const PipelineDepth d = few_token_pipeline_depth(world, tokens);
      EXPECT_EQ(d.stages, 3) << "world " << world << ", " << tokens << " tokens";
      EXPECT_EQ(d.defer, 1) << "world " << world << ", " << tokens << " tokens";
      // Like every pipeline with peers it keeps one row loading ahead.
      EXPECT_EQ(d.stages - 1 - d.defer, 1) << "world " << world;
    }
    // Past the threshold the world's own depth (and, at TP 8, the shallow choice) applies.
    EXPECT_EQ(few_token_pipeline_depth(world, kFewTokensMax + 1).stages, 0) << "world " << world;
    EXPECT_EQ(few_token_pipeline_depth(world, 16384).defer, 0) << "world " << world;
  }
  // TP 2 and 3 run 3 stages with D = 1 anyway; alone nothing is deferred; from TP 9 on (TP 16
  // measured: 3 stages and D = 1 up to 13.6 us slower at 1536-3072 tokens) the rule does not apply.
  for (const int world : {1, 2, 3, kFewTokensMaxWorld + 1, 16}) {
    EXPECT_EQ(few_token_pipeline_depth(world, 64).stages, 0) << "world " << world;
    EXPECT_EQ(few_token_pipeline_depth(world, 64).defer, 0) << "world " << world;
  }
  EXPECT_EQ(choose_pipeline_depth(2).stages, 3);
  EXPECT_EQ(choose_pipeline_depth(2).defer, 1);
  EXPECT_TRUE(testing::throws_error([] { few_token_pipeline_depth(0, 64); }, "world must be >= 1"));
  EXPECT_TRUE(testing::throws_error([] { few_token_pipeline_depth(4, -1); }, "tokens >= 0"));
}

TEST(PipelineDepth, ShallowTakenForAnyGainAtFewTokensAndForDoubleGainUpToTheCap) {
  // Up to kShallowAnyGainTokens any gain in resident groups takes it; none or a loss never does.
  for (const int64_t tokens : {int64_t{0}, int64_t{1}, int64_t{64}, kShallowAnyGainTokens}) {
    EXPECT_TRUE(take_shallow_pipeline(tokens, 396, 528)) << tokens;   // 3 -> 4 blocks an SM
    EXPECT_TRUE(take_shallow_pipeline(tokens, 264, 528)) << tokens;   // 2 -> 4
    EXPECT_FALSE(take_shallow_pipeline(tokens, 528, 528)) << tokens;  // registers cap both
    EXPECT_FALSE(take_shallow_pipeline(tokens, 528, 396)) << tokens;
  }
  // Past it, up to kShallowMaxTokens, only at least twice the groups does.
  for (const int64_t tokens : {kShallowAnyGainTokens + 1, int64_t{4096}, kShallowMaxTokens}) {
    EXPECT_FALSE(take_shallow_pipeline(tokens, 396, 528)) << tokens;
    EXPECT_FALSE(take_shallow_pipeline(tokens, 265, 528)) << tokens;
    EXPECT_TRUE(take_shallow_pipeline(tokens, 264, 528)) << tokens;
    EXPECT_TRUE(take_shallow_pipeline(tokens, 132, 528)) << tokens;
  }
  // Past the cap, never.
  for (const int64_t tokens : {kShallowMaxTokens + 1, int64_t{8192}, int64_t{16384}}) {
    EXPECT_FALSE(take_shallow_pipeline(tokens, 264, 528)) << tokens;
    EXPECT_FALSE(take_shallow_pipeline(tokens, 132, 528)) << tokens;
  }
  EXPECT_TRUE(testing::throws_error([] { take_shallow_pipeline(-1, 1, 2); }, "must be >= 0"));
  EXPECT_TRUE(testing::throws_error([] { take_shallow_pipeline(64, -1, 2); }, "must be >= 0"));
}

TEST(PipelineDepth, OverridesAreCutToFit) {
  EXPECT_EQ(choose_pipeline_depth(1, 4, 0).stages, 4);
  EXPECT_EQ(choose_pipeline_depth(1, 4, 3).defer, 0);      // alone nothing waits
  const PipelineDepth a = choose_pipeline_depth(8, 2, 0);  // forced shallow: D cut to 1
  EXPECT_EQ(a.stages, 2);
  EXPECT_EQ(a.defer, 1);
  const PipelineDepth b = choose_pipeline_depth(8, 0, 1);  // forced D 1: stages follow
  EXPECT_EQ(b.stages, 3);
  EXPECT_EQ(b.defer, 1);
  const PipelineDepth c = choose_pipeline_depth(2, 3, 4);  // D 4 in 3 stages: cut to 2
  EXPECT_EQ(c.stages, 3);
  EXPECT_EQ(c.defer, 2);
  EXPECT_TRUE(testing::throws_error([] { choose_pipeline_depth(0); }, "world must be >= 1"));
  EXPECT_TRUE(testing::throws_error([] { choose_pipeline_depth(2, 6, 0); }, "stages must be 0 or"));
  EXPECT_TRUE(testing::throws_error([] { choose_pipeline_depth(2, 0, 5); }, "defer must be in"));
}

TEST(ChooseKernelShape, BoundariesOfEachRegime) {
  // n = vectors per row; the q/k split does not matter, only the total.
  for (int64_t n : {1,   2,   31,  32,  33,   63,   64,   65,   127,  128,   129,
                    130, 255, 256, 257, 1000, 2047, 2048, 2049, 4096, 100000}) {
    for (int64_t q : {int64_t{0}, n / 2, n - 1}) {
      if (q < 0 || n - q <= 0) continue;
      for (int vec : kVec) {
        SCOPED_TRACE("n " + std::to_string(n) + " q " + std::to_string(q) + " vec " +
                     std::to_string(vec));
        const KernelShape s = choose_kernel_shape(q * vec, (n - q) * vec, vec);
        EXPECT_TRUE(ShapeIsValid(s, q * vec, (n - q) * vec, vec));
      }
    }
  }
  EXPECT_EQ(choose_kernel_shape(2048 * 8, 0, 8).vectors_per_thread, 4);
  EXPECT_EQ(choose_kernel_shape(2048 * 8, 0, 8).group_threads, 512);
  EXPECT_EQ(choose_kernel_shape(2048 * 8, 8, 8).vectors_per_thread, 0);
  // The scalar path always streams, about 8 elements a thread, in whole warps.
  EXPECT_EQ(choose_kernel_shape(32, 0, 1).vectors_per_thread, 0);
  EXPECT_EQ(choose_kernel_shape(256, 0, 1).group_threads, 32);
  EXPECT_EQ(choose_kernel_shape(257, 0, 1).group_threads, 64);
  EXPECT_EQ(choose_kernel_shape(1 << 20, 0, 1).group_threads, 1024);
  // Staged rows: 1, 2 or 4 vectors a thread by row length.
  EXPECT_EQ(choose_kernel_shape(32 * 8, 0, 8).vectors_per_thread, 1);
  EXPECT_EQ(choose_kernel_shape(33 * 8, 0, 8).vectors_per_thread, 2);
  EXPECT_EQ(choose_kernel_shape(65 * 8, 0, 8).vectors_per_thread, 4);
  EXPECT_EQ(choose_kernel_shape(128 * 8, 0, 8).group_threads, 32);
  EXPECT_EQ(choose_kernel_shape(129 * 8, 0, 8).group_threads, 64);
}

// A forced vector count (LaunchTuning::vectors_per_thread) sets the vectors per thread of staged
// rows: the row then takes the fewest lanes, down to 8 (and never fewer than the ranks, which
// each need a lane of the exchange).
TEST(ChooseKernelShape, ForcedVectorsPerThreadPacksShortRowsIntoPartWarps) {
  // OLMoE at TP 8, bf16: 256 + 256 elements = 64 vectors.
  KernelShape s = choose_kernel_shape(256, 256, 8, 256, 8, 4);
  EXPECT_EQ(s.vectors_per_thread, 4);
  EXPECT_EQ(s.group_threads, 16);
  EXPECT_EQ(s.tokens_per_block, 16);
  s = choose_kernel_shape(256, 256, 8, 256, 8, 8);
  EXPECT_EQ(s.group_threads, 8);
  EXPECT_EQ(s.tokens_per_block, 32);
  EXPECT_EQ(choose_kernel_shape(256, 256, 8, 256, 16, 8).group_threads, 16);  // a lane per rank
  EXPECT_EQ(choose_kernel_shape(256, 256, 8, 256, 32, 8).group_threads, 32);
  EXPECT_EQ(choose_kernel_shape(256, 256, 8, 256, 1, 8).group_threads, 8);
  // 96 vectors (OLMo3-32B at TP 8) at 8 a thread: 12 lanes, rounded up to 16.
  EXPECT_EQ(choose_kernel_shape(640, 128, 8, 256, 8, 8).group_threads, 16);
  // Longer rows stay whole warps: 512 vectors at 8 a thread.
  s = choose_kernel_shape(2048, 2048, 8, 256, 2, 8);
  EXPECT_EQ(s.group_threads, 64);
  EXPECT_EQ(s.tokens_per_block, 4);
  // Streaming rows ignore the override.
  EXPECT_EQ(choose_kernel_shape(2048 * 8, 8, 8, 256, 2, 8).vectors_per_thread, 0);
  EXPECT_EQ(choose_kernel_shape(256, 256, 1, 256, 2, 8).vectors_per_thread, 0);
  // The ring of staged rows bounds the groups of a large block: 5 stages x 1 KB rows.
  EXPECT_EQ(choose_kernel_shape(256, 256, 8, 1024, 8, 8).tokens_per_block,
            kMaxStagedRingBytes / (kMaxStages * 16 * 64));
  // Without the override the layout does not depend on the group size.
  for (int world : {1, 2, 4, 8, 16}) {
    const KernelShape d = choose_kernel_shape(256, 256, 8, 256, world);
    EXPECT_EQ(d.group_threads, 32);
    EXPECT_EQ(d.vectors_per_thread, 2);
  }
  // Every forced value on every regime's boundary gives a valid layout.
  for (int64_t n : {1, 7, 8, 9, 16, 17, 64, 65, 128, 255, 256, 257, 1000, 2048}) {
    for (int world : {1, 2, 8, 16, 32}) {
      for (int vpt : {1, 2, 4, 8}) {
        SCOPED_TRACE("n " + std::to_string(n) + " world " + std::to_string(world) + " vpt " +
                     std::to_string(vpt));
        if ((n + vpt - 1) / vpt > 1024) {
          EXPECT_TRUE(testing::throws_error(
              [&] { choose_kernel_shape(n * 8, 0, 8, 256, world, vpt); }, "more than 1024"));
          continue;
        }
        const KernelShape f = choose_kernel_shape(n * 8, 0, 8, 256, world, vpt);
        EXPECT_EQ(f.vectors_per_thread, vpt);
        EXPECT_TRUE(ShapeIsValid(f, n * 8, 0, 8, world));
      }
    }
  }
}

// With peers, rows of up to kMaxPackedVectors vectors have a packed alternative: 4 vectors a
// thread in groups of 16 or 8 lanes, at least one lane per rank (the launch takes it when the GPU
// is full).
TEST(ChooseKernelShape, PackedShapeForShortRowsWithPeers) {
  // OLMoE at TP 8, bf16: 64 vectors -> 16 lanes, 16 groups in 256 threads.
  KernelShape s = packed_kernel_shape(256, 256, 8, 256, 8);
  EXPECT_EQ(s.vectors_per_thread, 4);
  EXPECT_EQ(s.group_threads, 16);
  EXPECT_EQ(s.tokens_per_block, 16);
  EXPECT_TRUE(ShapeIsValid(s, 256, 256, 8, 8));
  // 8 vectors at TP 2: 2 lanes would do, the floor is 8.
  EXPECT_EQ(packed_kernel_shape(32, 32, 8, 256, 2).group_threads, kMinGroupThreads);
  // 16 ranks need 16 lanes.
  EXPECT_EQ(packed_kernel_shape(32, 32, 8, 256, 16).group_threads, 16);
  // Not applicable: alone, more ranks than a 16-lane group serves, longer rows, scalar path,
  // streamed rows.
  EXPECT_EQ(packed_kernel_shape(256, 256, 8, 256, 1).vectors_per_thread, 0);
  EXPECT_EQ(packed_kernel_shape(256, 256, 8, 256, 32).vectors_per_thread, 0);
  EXPECT_EQ(packed_kernel_shape(264, 256, 8, 256, 8).vectors_per_thread, 0);  // 65 vectors
  EXPECT_EQ(packed_kernel_shape(256, 256, 1, 256, 8).vectors_per_thread, 0);
  // Every row length up to the limit, every dtype's vector and every group size: valid.
  for (int world : {2, 4, 8, 16}) {
    for (int vec : {4, 8, 16}) {
      for (int64_t n = 1; n <= kMaxPackedVectors; ++n) {
        const KernelShape p = packed_kernel_shape(n * vec, 0, vec, kDefaultBlockThreads, world);
        SCOPED_TRACE("n " + std::to_string(n) + " world " + std::to_string(world));
        EXPECT_EQ(p.vectors_per_thread, 4);
        EXPECT_LE(p.group_threads, 16);
        EXPECT_TRUE(ShapeIsValid(p, n * vec, 0, vec, world));
      }
    }
  }
}

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

TEST(ChooseKernelShape, BadArgumentsThrow) {
  EXPECT_TRUE(testing::throws_error([] { choose_kernel_shape(2048, 100, 8); }, "multiples"));
  EXPECT_TRUE(testing::throws_error([] { choose_kernel_shape(2044, 1024, 8); }, "multiples"));
  EXPECT_TRUE(testing::throws_error([] { choose_kernel_shape(2048, 1024, 0); }, "vector size"));
  EXPECT_TRUE(testing::throws_error([] { choose_kernel_shape(2048, 1024, -8); }, "vector size"));
  EXPECT_TRUE(testing::throws_error([] { choose_kernel_shape(0, 0, 8); }, "empty rows"));
  EXPECT_THROW(choose_kernel_shape(12, 4, 8), Error);
  EXPECT_TRUE(testing::throws_error([] { choose_kernel_shape(2048, 1024, 8, 256, 0); }, "world"));
  for (int bad : {-1, 3, 5, 16}) {
    EXPECT_TRUE(testing::throws_error([&] { choose_kernel_shape(2048, 1024, 8, 256, 2, bad); },
                                      "forced vectors per thread"));
  }
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
                EXPECT_TRUE(testing::throws_error(
                    [&] { plan_grid(tokens, ranks, tpb, occ, sms, budget); }, "resident"));
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
  EXPECT_TRUE(testing::throws_error([] { plan_grid(64, 8, 1, 1, 132, 4); },
                                    "8 ranks in one launch need at least one resident block each"));
  EXPECT_TRUE(testing::throws_error([] { plan_grid(64, 8, 1, 1, 132, 4); }, "only 4 fit"));
  EXPECT_TRUE(testing::throws_error([] { plan_grid(64, 4, 1, 1, 2, 0); }, "resident"));
  EXPECT_NO_THROW(plan_grid(64, 8, 1, 2, 132, 4));
}

TEST(PlanGrid, BadArgumentsThrow) {
  EXPECT_TRUE(testing::throws_error([] { plan_grid(64, 2, 1, 0, 132, 0); }, "occupancy 0"));
  EXPECT_TRUE(testing::throws_error([] { plan_grid(64, 0, 1, 2, 132, 0); }, "must be positive"));
  EXPECT_TRUE(testing::throws_error([] { plan_grid(64, 2, 0, 2, 132, 0); }, "must be positive"));
  EXPECT_TRUE(testing::throws_error([] { plan_grid(64, 2, 1, 2, 0, 0); }, "must be positive"));
  EXPECT_TRUE(testing::throws_error([] { plan_grid(64, 2, 1, 2, 132, -1); }, "sm_budget"));
}

TEST(BlockOrder, InterleavedFrom2048TokensWithSeveralRanks) {
  EXPECT_EQ(choose_block_order(2, kInterleaveMinTokens), BlockOrder::kInterleaved);
  EXPECT_EQ(choose_block_order(8, 16384), BlockOrder::kInterleaved);
  EXPECT_EQ(choose_block_order(2, kInterleaveMinTokens - 1), BlockOrder::kRankMajor);
  EXPECT_EQ(choose_block_order(8, 64), BlockOrder::kRankMajor);
  // One rank per launch (TP 1, or one process per GPU): nothing to interleave.
  EXPECT_EQ(choose_block_order(1, 16384), BlockOrder::kRankMajor);
}

// ---------------------------------------------------------------- make_launch_plan

// The residency of an H200-like GPU, for the policy to weigh: 132 SMs, 64 K registers, 2048
// threads, 32 blocks and 228 KB of shared memory an SM (1 KB of it reserved a block). The
// kernels' registers per thread are their caps: 48 alone, 64 with peers. A model, not the
// compiled kernels: the pins below show how the policy answers it, so that a change of the
// policy shows up here.
struct GpuModel {
  int64_t row_vectors;  // 16-byte vectors of one rank's Q and K row
  std::size_t weight_bytes;
  bool alone;
  mutable std::vector<KernelCandidate> asked;
  KernelFootprint operator()(const KernelCandidate& c) const {
    asked.push_back(c);
    KernelFootprint f;
    if (c.shape.vectors_per_thread > 0) {  // the kernel's staged_smem_bytes
      f.smem_bytes =
          static_cast<std::size_t>(c.depth.stages) * c.shape.tokens_per_block * row_vectors * 16 +
          weight_bytes;
    }
    const int threads = c.shape.block_threads();
    const int regs = alone ? 48 : 64;
    int blocks = std::min({2048 / threads, 65536 / (regs * threads), 32});
    if (f.smem_bytes > 0) {
      blocks = std::min<int>(blocks, static_cast<int>(228 * 1024 / (f.smem_bytes + 1024)));
    }
    f.blocks_per_sm = blocks;
    return f;
  }
};

constexpr int kH200Sms = 132;

struct ModelShape {
  const char* name;
  int64_t q, k;
};
// The benchmark's five models (bench/bench_common.hpp, docs/design.md).
const ModelShape kModels[] = {{"olmoe", 2048, 2048},
                              {"olmo2-7b", 4096, 4096},
                              {"olmo2-13b", 5120, 5120},
                              {"olmo3-32b", 5120, 1024},
                              {"minimax-m2", 6144, 1024}};

// bf16 rows of every rank 16-byte aligned, TP `world` as virtual ranks in one launch.
LaunchRequest bf16_request(const ModelShape& m, int world, int64_t tokens,
                           const LaunchTuning& tuning = {}) {
  LaunchRequest r;
  r.world = world;
  r.ranks = world;
  r.ranks_on_device = world;
  r.tokens = tokens;
  r.q_full_width = m.q;
  r.k_full_width = m.k;
  r.vec_elems = 8;
  r.token_capacity = 16384;
  r.sm_count = kH200Sms;
  r.tuning = tuning;
  return r;
}

GpuModel model_for(const LaunchRequest& r) {
  const int64_t qw = r.q_full_width / r.world, kw = r.k_full_width / r.world;
  return GpuModel{
      qw / r.vec_elems + kw / r.vec_elems, static_cast<std::size_t>(qw + kw) * 2, r.world == 1, {}};
}

LaunchPlan plan_of(const LaunchRequest& r) {
  const GpuModel gpu = model_for(r);
  return make_launch_plan(r, std::cref(gpu));
}

// What the tuned policy chooses for one call.
struct Pin {
  const char* model;
  int tp;
  int64_t tokens;
  int vpt, group_threads, tokens_per_block;
  int stages, defer;
  SlotLayout slots;
  BlockOrder blocks;
  int blocks_per_rank;
};

std::string describe(const LaunchPlan& p) {
  const ChunkPlan c = p.chunk(0);
  return "vpt " + std::to_string(p.shape.vectors_per_thread) + ", group " +
         std::to_string(p.shape.group_threads) + " x " + std::to_string(p.shape.tokens_per_block) +
         ", " + std::to_string(p.depth.stages) + " stages D " + std::to_string(p.depth.defer) +
         ", slots " + std::to_string(static_cast<int>(c.orders.slots)) + ", blocks " +
         std::to_string(static_cast<int>(c.orders.blocks)) + ", " +
         std::to_string(c.grid.blocks_per_rank) + " blocks a rank";
}

constexpr SlotLayout kTM = SlotLayout::kTokenMajor;
constexpr SlotLayout kSM = SlotLayout::kSourceMajor;
constexpr BlockOrder kRM = BlockOrder::kRankMajor;
constexpr BlockOrder kIL = BlockOrder::kInterleaved;

// At 64 tokens (decode) and 4096 (prefill) for every model and TP 1-8 as virtual ranks, and
// OLMoE at the token counts where its layout changes: at TP 8 the packed rows (from a full grid)
// with source-major slots from 256 tokens, the few-token ring up to 2048, the shallow one at
// 4096 (twice the groups), the world's ring at 16384; at TP 4 the few-token ring's last count.
// clang-format off
const Pin kPins[] = {
    // model, TP, tokens; vectors a thread, group threads, groups a block; stages, D; orders;
    // blocks a rank
    {"olmoe",      1,    64, 4, 128,  3, 2, 0, kTM, kRM,  22},
    {"olmoe",      1,  4096, 4, 128,  3, 2, 0, kTM, kRM, 396},
    {"olmoe",      2,    64, 4,  64,  4, 3, 1, kTM, kRM,  16},
    {"olmoe",      2,  4096, 4,  64,  4, 3, 1, kTM, kIL, 264},
    {"olmoe",      4,    64, 4,  32,  8, 3, 1, kTM, kRM,   8},
    {"olmoe",      4,  2048, 4,  32,  8, 3, 1, kTM, kIL, 132},
    {"olmoe",      4,  4096, 4,  32,  8, 4, 2, kTM, kIL,  99},
    {"olmoe",      8,     1, 2,  32,  8, 3, 1, kTM, kRM,   1},
    {"olmoe",      8,    64, 2,  32,  8, 3, 1, kTM, kRM,   8},
    {"olmoe",      8,  1024, 4,  16, 16, 3, 1, kSM, kRM,  64},
    {"olmoe",      8,  2048, 4,  16, 16, 3, 1, kSM, kIL,  66},
    {"olmoe",      8,  4096, 4,  16, 16, 3, 2, kSM, kIL,  66},
    {"olmoe",      8, 16384, 4,  16, 16, 5, 3, kSM, kIL,  33},
    {"olmo2-7b",   1,    64, 4, 256,  1, 2, 0, kTM, kRM,  64},
    {"olmo2-7b",   1,  4096, 4, 256,  1, 2, 0, kTM, kRM, 528},
    {"olmo2-7b",   2,    64, 4, 128,  2, 3, 1, kTM, kRM,  32},
    {"olmo2-7b",   2,  4096, 4, 128,  2, 3, 1, kTM, kIL, 264},
    {"olmo2-7b",   4,    64, 4,  64,  4, 3, 1, kTM, kRM,  16},
    {"olmo2-7b",   4,  4096, 4,  64,  4, 4, 2, kTM, kIL,  99},
    {"olmo2-7b",   8,    64, 4,  32,  8, 3, 1, kTM, kRM,   8},
    {"olmo2-7b",   8,  4096, 4,  32,  8, 3, 2, kTM, kIL,  66},
    {"olmo2-13b",  1,    64, 4, 320,  1, 2, 0, kTM, kRM,  64},
    {"olmo2-13b",  1,  4096, 4, 320,  1, 2, 0, kTM, kRM, 396},
    {"olmo2-13b",  2,    64, 4, 160,  1, 3, 1, kTM, kRM,  64},
    {"olmo2-13b",  2,  4096, 4, 160,  1, 3, 1, kTM, kIL, 330},
    {"olmo2-13b",  4,    64, 4,  96,  2, 3, 1, kTM, kRM,  32},
    {"olmo2-13b",  4,  4096, 4,  96,  2, 4, 2, kTM, kIL, 132},
    {"olmo2-13b",  8,    64, 4,  64,  4, 3, 1, kTM, kRM,  16},
    {"olmo2-13b",  8,  4096, 4,  64,  4, 5, 3, kTM, kIL,  66},
    {"olmo3-32b",  1,    64, 4, 192,  2, 2, 0, kTM, kRM,  32},
    {"olmo3-32b",  1,  4096, 4, 192,  2, 2, 0, kTM, kRM, 396},
    {"olmo3-32b",  2,    64, 4,  96,  2, 3, 1, kTM, kRM,  32},
    {"olmo3-32b",  2,  4096, 4,  96,  2, 3, 1, kTM, kIL, 330},
    {"olmo3-32b",  4,    64, 4,  64,  4, 3, 1, kTM, kRM,  16},
    {"olmo3-32b",  4,  4096, 4,  64,  4, 4, 2, kTM, kIL, 132},
    {"olmo3-32b",  8,    64, 4,  32,  8, 3, 1, kTM, kRM,   8},
    {"olmo3-32b",  8,  4096, 4,  32,  8, 5, 3, kTM, kIL,  49},
    {"minimax-m2", 1,    64, 4, 224,  1, 2, 0, kTM, kRM,  64},
    {"minimax-m2", 1,  4096, 4, 224,  1, 2, 0, kTM, kRM, 660},
    {"minimax-m2", 2,    64, 4, 128,  2, 3, 1, kTM, kRM,  32},
    {"minimax-m2", 2,  4096, 4, 128,  2, 3, 1, kTM, kIL, 264},
    {"minimax-m2", 4,    64, 4,  64,  4, 3, 1, kTM, kRM,  16},
    {"minimax-m2", 4,  4096, 4,  64,  4, 4, 2, kTM, kIL,  99},
    {"minimax-m2", 8,    64, 4,  32,  8, 3, 1, kTM, kRM,   8},
    {"minimax-m2", 8,  4096, 4,  32,  8, 5, 3, kTM, kIL,  49},
};
// clang-format on

TEST(MakeLaunchPlan, TunedChoicesForTheFiveModels) {
  for (const Pin& w : kPins) {
    const ModelShape& m =
        *std::find_if(std::begin(kModels), std::end(kModels),
                      [&](const ModelShape& s) { return std::string(s.name) == w.model; });
    const LaunchPlan p = plan_of(bf16_request(m, w.tp, w.tokens));
    SCOPED_TRACE(std::string(w.model) + " TP " + std::to_string(w.tp) + ", " +
                 std::to_string(w.tokens) + " tokens: " + describe(p));
    EXPECT_EQ(p.shape.vectors_per_thread, w.vpt);
    EXPECT_EQ(p.shape.group_threads, w.group_threads);
    EXPECT_EQ(p.shape.tokens_per_block, w.tokens_per_block);
    EXPECT_EQ(p.depth.stages, w.stages);
    EXPECT_EQ(p.depth.defer, w.defer);
    ASSERT_EQ(p.chunks, 1);
    EXPECT_EQ(p.chunk(0).orders.slots, w.slots);
    EXPECT_EQ(p.chunk(0).orders.blocks, w.blocks);
    EXPECT_EQ(p.chunk(0).grid.blocks_per_rank, w.blocks_per_rank);
    EXPECT_EQ(p.chunk(0).grid.ranks, w.tp);
    EXPECT_EQ(p.chunk(0).tokens, w.tokens);
  }
}

TEST(MakeLaunchPlan, TheFootprintIsAskedForEachOrderTheChunksTake) {
  // OLMoE at TP 8, 16500 tokens in chunks of 16384: the first chunk is source-major and
  // interleaved, the last (116 tokens) token-major and rank-major. The residency counts both.
  LaunchRequest r = bf16_request(kModels[0], 8, 16500);
  const GpuModel gpu = model_for(r);
  const LaunchPlan p = make_launch_plan(r, std::cref(gpu));
  ASSERT_EQ(p.chunks, 2);
  const ChunkPlan a = p.chunk(0), b = p.chunk(1);
  EXPECT_EQ(a.first_token, 0);
  EXPECT_EQ(a.tokens, 16384);
  EXPECT_EQ(a.orders, (ChunkOrders{kSM, kIL}));
  EXPECT_EQ(b.first_token, 16384);
  EXPECT_EQ(b.tokens, 116);
  EXPECT_EQ(b.orders, (ChunkOrders{kTM, kRM}));
  EXPECT_EQ(b.grid.blocks_per_rank,
            (116 + p.shape.tokens_per_block - 1) / p.shape.tokens_per_block);
  bool asked_first = false, asked_last = false;
  for (const KernelCandidate& c : gpu.asked) {
    asked_first = asked_first || c.orders == a.orders;
    asked_last = asked_last || c.orders == b.orders;
  }
  EXPECT_TRUE(asked_first);
  EXPECT_TRUE(asked_last);
  // Three chunks of one length but the last: chunk(i) steps by the chunk length.
  r.token_capacity = 100;
  r.tokens = 250;
  const LaunchPlan q = plan_of(r);
  ASSERT_EQ(q.chunks, 3);
  EXPECT_EQ(q.chunk(1).first_token, 100);
  EXPECT_EQ(q.chunk(1).tokens, 100);
  EXPECT_EQ(q.chunk(2).first_token, 200);
  EXPECT_EQ(q.chunk(2).tokens, 50);
  EXPECT_TRUE(testing::throws_error([&] { q.chunk(3); }, "chunk 3 of 3"));
  EXPECT_TRUE(testing::throws_error([&] { q.chunk(-1); }, "chunk -1 of 3"));
}

TEST(MakeLaunchPlan, ResidencyIsTheSmallerOfTheTwoKernels) {
  LaunchRequest r = bf16_request(kModels[0], 8, 16500);
  const GpuModel gpu = model_for(r);
  // The last chunk's kernel fits one block an SM fewer: the grid must fit that one too.
  auto fewer_for_the_last = [&](const KernelCandidate& c) {
    KernelFootprint f = gpu(c);
    if (c.orders.slots == kTM) f.blocks_per_sm -= 1;
    return f;
  };
  const LaunchPlan p = make_launch_plan(r, fewer_for_the_last);
  const LaunchPlan same = plan_of(r);
  EXPECT_EQ(p.shape.group_threads, same.shape.group_threads);
  EXPECT_EQ(p.blocks_per_sm, same.blocks_per_sm - 1);
}

TEST(MakeLaunchPlan, TunedStagesOrDeferTurnTheTokenCountExceptionsOff) {
  const ModelShape& olmoe = kModels[0];
  // TP 4 at 1024 tokens takes the few-token ring (3 stages, D = 1) on its own ...
  EXPECT_EQ(plan_of(bf16_request(olmoe, 4, 1024)).depth.stages, 3);
  EXPECT_EQ(plan_of(bf16_request(olmoe, 4, 1024)).depth.defer, 1);
  // ... and the world's ring once the depth is tuned: stages 5 with D log2(4) = 2, or D 3 with
  // its stages following as D + 2.
  LaunchTuning t;
  t.stages = 5;
  PipelineDepth d = plan_of(bf16_request(olmoe, 4, 1024, t)).depth;
  EXPECT_EQ(d.stages, 5);
  EXPECT_EQ(d.defer, 2);
  t = {};
  t.defer = 3;
  d = plan_of(bf16_request(olmoe, 4, 1024, t)).depth;
  EXPECT_EQ(d.stages, 5);
  EXPECT_EQ(d.defer, 3);
  // At TP 8 the shallow ring is no candidate either: 4 stages with D = log2(8) = 3.
  t = {};
  t.stages = 4;
  d = plan_of(bf16_request(olmoe, 8, 4096, t)).depth;
  EXPECT_EQ(d.stages, 4);
  EXPECT_EQ(d.defer, 3);
  // Alone nothing is deferred, whatever the tuning says.
  t = {};
  t.stages = 4;
  t.defer = 2;
  d = plan_of(bf16_request(olmoe, 1, 4096, t)).depth;
  EXPECT_EQ(d.stages, 4);
  EXPECT_EQ(d.defer, 0);
}

TEST(MakeLaunchPlan, TunedVectorsPerThreadAndBlockThreadsShapeTheLayout) {
  const ModelShape& olmoe = kModels[0];
  // OLMoE at TP 8 and 4096 tokens packs its 64-vector rows 4 a thread into 16 lanes; with 8
  // vectors a thread forced, the row takes 8 lanes and nothing else packs it.
  LaunchTuning t;
  t.vectors_per_thread = 8;
  LaunchPlan p = plan_of(bf16_request(olmoe, 8, 4096, t));
  EXPECT_EQ(p.shape.vectors_per_thread, 8);
  EXPECT_EQ(p.shape.group_threads, 8);
  EXPECT_EQ(p.shape.tokens_per_block, 32);
  // Block threads set the groups a block holds: OLMo3-32B alone, 192-thread groups, one in
  // 256 threads, two in the tuned 384.
  const ModelShape& olmo3 = kModels[3];
  EXPECT_EQ(plan_of(bf16_request(olmo3, 1, 4096)).shape.tokens_per_block, 2);
  t = {};
  t.block_threads = 256;
  p = plan_of(bf16_request(olmo3, 1, 4096, t));
  EXPECT_EQ(p.shape.group_threads, 192);
  EXPECT_EQ(p.shape.tokens_per_block, 1);
}

TEST(MakeLaunchPlan, TunedBlockOrderAppliesToLaunchesOfSeveralRanksOnly) {
  const ModelShape& m = kModels[1];
  EXPECT_EQ(plan_of(bf16_request(m, 2, 64)).chunk(0).orders.blocks, kRM);
  EXPECT_EQ(plan_of(bf16_request(m, 2, 4096)).chunk(0).orders.blocks, kIL);
  LaunchTuning t;
  t.block_order = LaunchTuning::BlockOrder::kInterleaved;
  EXPECT_EQ(plan_of(bf16_request(m, 2, 64, t)).chunk(0).orders.blocks, kIL);
  t.block_order = LaunchTuning::BlockOrder::kRankMajor;
  EXPECT_EQ(plan_of(bf16_request(m, 2, 4096, t)).chunk(0).orders.blocks, kRM);
  // One rank per launch (TP 1, or one process per GPU) has one order.
  t.block_order = LaunchTuning::BlockOrder::kInterleaved;
  EXPECT_EQ(plan_of(bf16_request(m, 1, 4096, t)).chunk(0).orders.blocks, kRM);
  LaunchRequest one = bf16_request(m, 2, 4096, t);
  one.ranks = 1;
  one.ranks_on_device = 1;
  EXPECT_EQ(plan_of(one).chunk(0).orders.blocks, kRM);
}

TEST(MakeLaunchPlan, RanksLaunchedApartTakeTheirShareOfTheBudget) {
  EXPECT_EQ(launch_sm_budget(0, 132, 8, 8), 0);    // all ranks in one launch: all SMs
  EXPECT_EQ(launch_sm_budget(40, 132, 8, 8), 40);  // the communicator's budget
  EXPECT_EQ(launch_sm_budget(0, 132, 1, 8), 16);   // one of 8 ranks on its own stream
  EXPECT_EQ(launch_sm_budget(40, 132, 2, 8), 10);
  EXPECT_EQ(launch_sm_budget(500, 132, 1, 2), 66);  // a budget above the SM count
  EXPECT_EQ(launch_sm_budget(4, 132, 1, 8), 1);     // at least one SM
  // The plan's grid stays within the share: one of TP 8's ranks launched alone.
  LaunchRequest r = bf16_request(kModels[1], 8, 16384);
  r.ranks = 1;
  const LaunchPlan p = plan_of(r);
  EXPECT_EQ(p.sm_budget, 16);
  EXPECT_LE(p.chunk(0).grid.grid(), 16 * p.blocks_per_sm);
}

TEST(MakeLaunchPlan, BadRequestsAndTuningsThrow) {
  const ModelShape& m = kModels[1];
  LaunchRequest r = bf16_request(m, 2, 64);
  r.tokens = 0;
  EXPECT_TRUE(testing::throws_error([&] { plan_of(r); }, "tokens must be >= 1"));
  r = bf16_request(m, 2, 64);
  r.ranks = 3;
  EXPECT_TRUE(testing::throws_error([&] { plan_of(r); }, "ranks must be in [1, world]"));
  r = bf16_request({"odd", 4098, 4096}, 4, 64);
  EXPECT_TRUE(testing::throws_error([&] { plan_of(r); }, "split over the world"));
  r = bf16_request(m, 2, 64);
  r.sm_count = 0;
  EXPECT_TRUE(testing::throws_error([&] { plan_of(r); }, "sm_count"));
  LaunchTuning t;
  t.stages = 3;
  t.defer = 3;
  EXPECT_TRUE(
      testing::throws_error([&] { plan_of(bf16_request(m, 2, 64, t)); }, "LaunchTuning.defer = 3"));
  // A kernel that cannot be resident at all.
  auto none = [](const KernelCandidate&) { return KernelFootprint{0, 0}; };
  EXPECT_TRUE(testing::throws_error([&] { make_launch_plan(bf16_request(m, 2, 64), none); },
                                    "occupancy 0"));
}
}  // namespace
}  // namespace swiftqk
