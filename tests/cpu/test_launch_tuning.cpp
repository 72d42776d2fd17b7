// Tests for LaunchTuning's checks and names: every value a field may take passes, every other
// one is refused with an Error that names the field and the value, before anything launches.
#include <gtest/gtest.h>

#include <string>

#include "expect_error.hpp"
#include "swiftqk/launch_tuning.hpp"
#include "swiftqk/qk_norm_params.hpp"

namespace swiftqk {
namespace {

using Order = LaunchTuning::BlockOrder;

// The default tuning with one field set.
template <typename T>
LaunchTuning with(T LaunchTuning::*field, T value) {
  LaunchTuning t;
  t.*field = value;
  return t;
}

TEST(LaunchTuning, TheDefaultLeavesEveryChoiceToThePolicyAndIsValid) {
  const LaunchTuning t;
  EXPECT_EQ(t.stages, 0);
  EXPECT_EQ(t.defer, 0);
  EXPECT_EQ(t.vectors_per_thread, 0);
  EXPECT_EQ(t.block_threads, 0);
  EXPECT_EQ(t.block_order, Order::kTuned);
  EXPECT_EQ(t.vector_bytes, 0);
  EXPECT_NO_THROW(t.validate());
  // What a caller that never heard of the tuning passes: the same default.
  EXPECT_EQ(QkNormParams{}.tuning, t);
}

TEST(LaunchTuning, StagesFromMinToMaxOrTuned) {
  for (const int good : {0, kMinStages, 3, kMaxStages}) {
    LaunchTuning t;
    t.stages = good;
    EXPECT_NO_THROW(t.validate()) << good;
  }
  for (const int bad : {1, 6, -3, -1, 1000}) {
    LaunchTuning t;
    t.stages = bad;
    EXPECT_TRUE(testing::throws_error(
        [&] { t.validate(); },
        "LaunchTuning.stages = " + std::to_string(bad) + " is outside [2, 5] (0 = tuned)"))
        << bad;
  }
}

TEST(LaunchTuning, DeferBelowTheStagesOrBelowTheDeepestRingWhileStagesAreTuned) {
  for (const int stages : {kMinStages, 3, 4, kMaxStages}) {
    for (int defer = 0; defer <= stages - 1; ++defer) {
      LaunchTuning t;
      t.stages = stages;
      t.defer = defer;
      EXPECT_NO_THROW(t.validate()) << stages << " stages, defer " << defer;
    }
    LaunchTuning t;
    t.stages = stages;
    t.defer = stages;
    EXPECT_TRUE(testing::throws_error([&] { t.validate(); },
                                      "LaunchTuning.defer = " + std::to_string(stages) +
                                          " is outside [1, " + std::to_string(stages - 1) +
                                          "] (stages - 1 with stages = " + std::to_string(stages)))
        << stages;
  }
  // With the stages tuned the deepest deferral is kMaxStages - 1 (stages follow as defer + 2,
  // at most kMaxStages).
  for (int defer = 1; defer <= kMaxStages - 1; ++defer) {
    EXPECT_NO_THROW(with(&LaunchTuning::defer, defer).validate()) << defer;
  }
  for (const int bad : {kMaxStages, -1, 99}) {
    const LaunchTuning t = with(&LaunchTuning::defer, bad);
    EXPECT_TRUE(testing::throws_error(
        [&] { t.validate(); },
        "LaunchTuning.defer = " + std::to_string(bad) + " is outside [1, 4] (stages tuned"))
        << bad;
  }
}

TEST(LaunchTuning, VectorsPerThreadOnlyWhereTheKernelTableHasAnInstantiation) {
  for (const int good : {0, 1, 2, 4, 8}) {
    EXPECT_NO_THROW(with(&LaunchTuning::vectors_per_thread, good).validate()) << good;
  }
  for (const int bad : {-1, 3, 5, 6, 7, 16}) {
    const LaunchTuning t = with(&LaunchTuning::vectors_per_thread, bad);
    EXPECT_TRUE(testing::throws_error([&] { t.validate(); },
                                      "LaunchTuning.vectors_per_thread = " + std::to_string(bad) +
                                          " has no kernel instantiation"))
        << bad;
  }
}

TEST(LaunchTuning, VectorBytesIsOneOfTheKernelsWidths) {
  for (const int good : {0, 1, 4, 8, 16}) {
    EXPECT_NO_THROW(with(&LaunchTuning::vector_bytes, good).validate()) << good;
  }
  for (const int bad : {-16, 2, 6, 12, 32}) {
    const LaunchTuning t = with(&LaunchTuning::vector_bytes, bad);
    EXPECT_TRUE(testing::throws_error(
        [&] { t.validate(); },
        "LaunchTuning.vector_bytes = " + std::to_string(bad) + " is not 16, 8, 4 or 1"))
        << bad;
  }
}

TEST(LaunchTuning, BlockThreadsFrom32To1024) {
  for (const int good : {0, 32, 33, 256, 384, 1024}) {
    EXPECT_NO_THROW(with(&LaunchTuning::block_threads, good).validate()) << good;
  }
  for (const int bad : {-32, 1, 31, 1025, 4096}) {
    const LaunchTuning t = with(&LaunchTuning::block_threads, bad);
    EXPECT_TRUE(testing::throws_error(
        [&] { t.validate(); },
        "LaunchTuning.block_threads = " + std::to_string(bad) + " is outside [32, 1024]"))
        << bad;
  }
}

TEST(LaunchTuning, BlockOrderMustBeOneOfTheThree) {
  for (const Order good : {Order::kTuned, Order::kRankMajor, Order::kInterleaved}) {
    EXPECT_NO_THROW(with(&LaunchTuning::block_order, good).validate());
  }
  for (const int bad : {-1, 3, 7}) {
    const LaunchTuning t = with(&LaunchTuning::block_order, static_cast<Order>(bad));
    EXPECT_TRUE(testing::throws_error([&] { t.validate(); },
                                      "LaunchTuning.block_order = " + std::to_string(bad) +
                                          " is not kTuned, kRankMajor or kInterleaved"))
        << bad;
  }
}

TEST(LaunchTuning, BlockOrderNamesRoundTrip) {
  for (const Order o : {Order::kTuned, Order::kRankMajor, Order::kInterleaved}) {
    EXPECT_EQ(parse_block_order(to_string(o)), o);
  }
  EXPECT_EQ(to_string(Order::kRankMajor), "rank_major");
  EXPECT_EQ(parse_block_order("Rank-Major"), Order::kRankMajor);
  EXPECT_EQ(parse_block_order("INTERLEAVED"), Order::kInterleaved);
  EXPECT_TRUE(testing::throws_error([] { parse_block_order("sideways"); },
                                    "unknown block order 'sideways'"));
  EXPECT_TRUE(testing::throws_error([] { to_string(static_cast<Order>(9)); }, "9"));
}

TEST(LaunchTuning, EqualityComparesEveryField) {
  const LaunchTuning base;
  EXPECT_NE(with(&LaunchTuning::stages, 3), base);
  EXPECT_NE(with(&LaunchTuning::defer, 1), base);
  EXPECT_NE(with(&LaunchTuning::vectors_per_thread, 4), base);
  EXPECT_NE(with(&LaunchTuning::block_threads, 128), base);
  EXPECT_NE(with(&LaunchTuning::block_order, Order::kRankMajor), base);
  EXPECT_NE(with(&LaunchTuning::vector_bytes, 8), base);
  EXPECT_EQ(base, LaunchTuning{});
  EXPECT_EQ(with(&LaunchTuning::stages, 3), with(&LaunchTuning::stages, 3));
}

// The tuning travels with the launch parameters, so the launch's own check refuses a bad one
// before anything is written, even for a call of no tokens.
TEST(LaunchTuning, ValidateParamsChecksTheTuning) {
  QkNormParams p;
  p.q_full_width = p.k_full_width = 1024;
  p.q.width = p.k.width = 512;
  p.q.in_stride = p.q.out_stride = p.k.in_stride = p.k.out_stride = 512;
  EXPECT_NO_THROW(validate_params(p, 2));
  p.tuning.stages = 9;
  EXPECT_TRUE(testing::throws_error([&] { validate_params(p, 2); }, "LaunchTuning.stages = 9"));
  p.tuning = {};
  p.tuning.vectors_per_thread = 3;
  EXPECT_TRUE(
      testing::throws_error([&] { validate_params(p, 2); }, "LaunchTuning.vectors_per_thread = 3"));
}

}  // namespace
}  // namespace swiftqk
