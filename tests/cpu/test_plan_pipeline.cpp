// Tests for the pipeline depth (stages and deferred collects) per world and token count, and
// for the tuning overrides that force it.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <string>

#include "expect_error.hpp"
#include "swiftqk/plan.hpp"

namespace swiftqk {
namespace {

using testing::expect_error;

TEST(TuningOverride, UnsetMeansDefaultAndBadValuesAreRefused) {
  const char* var = "SWIFTQK_TEST_TUNING_OVERRIDE";
  unsetenv(var);
  EXPECT_EQ(tuning_override(var, 2, 5, "a stage depth"), 0);
  setenv(var, "", 1);
  EXPECT_EQ(tuning_override(var, 2, 5, "a stage depth"), 0);
  for (const char* good : {"2", "3", "5"}) {
    setenv(var, good, 1);
    EXPECT_EQ(tuning_override(var, 2, 5, "a stage depth"), std::atoi(good));
  }
  for (const char* bad : {"1", "6", "-3", "3x", "x", " 3", "99999999999999999999"}) {
    SCOPED_TRACE(bad);
    setenv(var, bad, 1);
    expect_error([&] { tuning_override(var, 2, 5, "a stage depth"); },
                 std::string(var) + "=" + bad + " is not a stage depth from 2 to 5");
  }
  unsetenv(var);
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
  expect_error([] { shallow_pipeline_depth(0, 64); }, "world must be >= 1");
  expect_error([] { shallow_pipeline_depth(8, -1); }, "tokens >= 0");
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
  expect_error([] { few_token_pipeline_depth(0, 64); }, "world must be >= 1");
  expect_error([] { few_token_pipeline_depth(4, -1); }, "tokens >= 0");
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
  expect_error([] { take_shallow_pipeline(-1, 1, 2); }, "must be >= 0");
  expect_error([] { take_shallow_pipeline(64, -1, 2); }, "must be >= 0");
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
  expect_error([] { choose_pipeline_depth(0); }, "world must be >= 1");
  expect_error([] { choose_pipeline_depth(2, 6, 0); }, "stages must be 0 or");
  expect_error([] { choose_pipeline_depth(2, 0, 5); }, "defer must be in");
}

}  // namespace
}  // namespace swiftqk
