// The deterministic mode on the host: the canonical sum's split over ranks, its accuracy against
// float64, the kernel shape it implies, and the checks that reject what it cannot do.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "expect_error.hpp"
#include "launch_plan.hpp"
#include "reference.hpp"
#include "swiftqk/error.hpp"
#include "swiftqk/qk_norm_params.hpp"

namespace swiftqk {
namespace {

uint32_t bits(float v) {
  uint32_t b;
  std::memcpy(&b, &v, sizeof b);
  return b;
}

// Random values exactly representable in `t`, spread over several binades (never zeros).
std::vector<float> random_row(int64_t width, DType t, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> n(0.f, 1.f);
  std::uniform_real_distribution<float> mag(-3.f, 3.f);
  std::vector<float> row(static_cast<std::size_t>(width));
  for (auto& v : row) {
    float x = n(rng) * std::exp2(mag(rng));
    if (x == 0.f) x = 0.5f;
    v = t == DType::kF8E4M3 ? ref::round_to(t, std::fmin(std::fmax(x, -448.f), 448.f))
                            : ref::round_to(t, x);
  }
  return row;
}

struct Shape {
  int64_t width;
  DType t;
};

TEST(DeterministicSum, EveryTpDegreeGivesTheSameBits) {
  // Model widths (docs/design.md) and short ones, every input dtype's vector width.
  for (const Shape s :
       {Shape{2048, DType::kBF16}, Shape{5120, DType::kBF16}, Shape{6144, DType::kF16},
        Shape{1024, DType::kF32}, Shape{4096, DType::kF8E4M3}, Shape{256, DType::kBF16}}) {
    const int vec = static_cast<int>(16 / dtype_size(s.t));
    for (uint64_t seed = 1; seed <= 20; ++seed) {
      const std::vector<float> row = random_row(s.width, s.t, seed);
      const float scale = s.t == DType::kF8E4M3 ? 0.0173f : 1.f;
      const float whole = ref::canonical_sum_of_squares(row.data(), s.width, vec, scale);
      for (int world : {1, 2, 4, 8, 16}) {
        const float split =
            ref::canonical_sum_of_squares_ranks(row.data(), s.width, vec, scale, world);
        ASSERT_EQ(bits(split), bits(whole))
            << "width " << s.width << " " << to_string(s.t) << " seed " << seed << " TP " << world;
      }
    }
  }
}

TEST(DeterministicSum, IsAsAccurateAsAnFp32TreeOfTheRow) {
  // A tree of depth d over exact squares errs by at most about d * 2^-24 relative (every
  // addend is positive); 64 rounds bound it with room for the in-lane chains.
  for (const int64_t width : {int64_t{256}, int64_t{2048}, int64_t{16384}}) {
    const std::vector<float> row = random_row(width, DType::kBF16, 7 + width);
    double exact = 0;
    for (float v : row) exact += static_cast<double>(v) * v;
    const double got = ref::canonical_sum_of_squares(row.data(), width, 8, 1.f);
    EXPECT_LE(std::fabs(got - exact) / exact, 64 * std::ldexp(1.0, -24)) << "width " << width;
  }
}

TEST(DeterministicSum, DiffersFromTheShardedRankOrderSum) {
  // The canonical order is not the default one (which depends on the TP degree): a test that
  // compared two TP degrees with the default order would fail somewhere in these rows.
  int differing = 0;
  for (uint64_t seed = 1; seed <= 50; ++seed) {
    const std::vector<float> row = random_row(5120, DType::kBF16, seed);
    std::vector<double> d(row.begin(), row.end());
    const float tp1 = static_cast<float>(ref::sum_of_squares_sharded(d.data(), 5120, 1));
    const float tp8 = static_cast<float>(ref::sum_of_squares_sharded(d.data(), 5120, 8));
    differing += bits(tp1) != bits(tp8);
  }
  EXPECT_GT(differing, 0);
}

TEST(DeterministicSum, RejectsWidthsWithoutSixteenSegmentsAndOtherWorlds) {
  std::vector<float> row(1000, 1.f);
  EXPECT_THROW(ref::canonical_sum_of_squares(row.data(), 1000, 8, 1.f), Error);
  std::vector<float> ok(2048, 1.f);
  EXPECT_THROW(ref::canonical_sum_of_squares_ranks(ok.data(), 2048, 8, 1.f, 3), Error);
  EXPECT_THROW(ref::canonical_sum_of_squares_ranks(ok.data(), 2048, 8, 1.f, 32), Error);
}

TEST(DeterministicShape, FewestSlotsThenFourVectorsAThread) {
  struct Want {
    int64_t q, k;
    int vec, world;
    int group_threads, lanes, q_slots, vpt;
  };
  for (const Want w : {
           // OLMoE TP 1: 16 vectors a segment; 8 threads a segment hold 4 lanes each (the
           // default layout's 128 threads and 4 vectors), not 4 threads with 8 vectors.
           Want{2048, 2048, 8, 1, 128, 4, 2, 4},
           Want{256, 256, 8, 8, 16, 4, 2, 4},  // OLMoE TP 8: two segments of 8 threads
           // OLMo2-13B TP 1: 40 vectors a segment: 512 x 4 slots, as many as 256 x 8.
           Want{5120, 5120, 8, 1, 512, 1, 2, 4},
           Want{6144, 1024, 8, 1, 256, 2, 3, 4},   // MiniMax-M2 TP 1: 48 and 8 vectors
           Want{4096, 4096, 8, 1, 256, 2, 2, 4},   // OLMo2-7B TP 1: 32 vectors a segment
           Want{128, 128, 8, 16, 16, 2, 1, 2},     // TP 16: 16 lanes, one per rank
           Want{12288, 2048, 8, 1, 512, 1, 3, 4},  // 96 and 16 vectors a segment
       }) {
    const DeterministicShape d = deterministic_kernel_shape(w.q, w.k, w.vec, w.world, 256);
    const std::string at =
        std::to_string(w.q) + ":" + std::to_string(w.k) + " TP " + std::to_string(w.world);
    EXPECT_EQ(d.shape.group_threads, w.group_threads) << at;
    EXPECT_EQ(d.shape.det_lanes, w.lanes) << at;
    EXPECT_EQ(d.q_slots, w.q_slots) << at;
    EXPECT_EQ(d.shape.vectors_per_thread, w.vpt) << at;
    EXPECT_GE(d.shape.tokens_per_block, 1) << at;
    EXPECT_LE(d.shape.block_threads(), 1024) << at;
  }
  // A row too wide to stage is streamed, one warp a segment.
  const DeterministicShape wide = deterministic_kernel_shape(32768, 32768, 8, 1, 256);
  EXPECT_EQ(wide.shape.vectors_per_thread, 0);
  EXPECT_EQ(wide.shape.det_lanes, 1);
  EXPECT_EQ(wide.shape.group_threads, 512);
}

// Every layout the policy may take holds the canonical structure: P = 32 / lanes threads a
// segment, Q's and K's slots within the thread's, a group wide enough for the exchange, and
// no more lanes than slots.
TEST(DeterministicShape, EveryLayoutHoldsItsSegmentsLanesAndSlots) {
  for (int world : {1, 2, 4, 8, 16}) {
    for (int64_t q : {2048, 5120, 6144, 128 * 16, 128 * 96}) {
      for (int64_t k : {1024, 2048, 5120}) {
        for (int vec : {4, 8, 16}) {
          for (int forced : {0, 2, 4, 8}) {
            const int64_t qw = q / world, kw = k / world;
            if (qw % (16 / world * vec) != 0 || kw % (16 / world * vec) != 0) continue;
            DeterministicShape d;
            try {
              d = deterministic_kernel_shape(qw, kw, vec, world, 384, forced);
            } catch (const Error& e) {
              EXPECT_NE(forced, 0) << "the policy itself must find a layout";
              EXPECT_NE(std::string(e.what()).find("vectors per thread"), std::string::npos);
              continue;
            }
            const std::string at = std::to_string(qw) + ":" + std::to_string(kw) + " vec " +
                                   std::to_string(vec) + " TP " + std::to_string(world) +
                                   " forced " + std::to_string(forced);
            const KernelShape& s = d.shape;
            ASSERT_TRUE(s.det_lanes == 1 || s.det_lanes == 2 || s.det_lanes == 4 ||
                        s.det_lanes == 8)
                << at;
            const int p = 32 / s.det_lanes, segs = 16 / world;
            EXPECT_EQ(s.group_threads, p * segs) << at;
            EXPECT_GE(s.group_threads, std::min(32, std::max(8, world))) << at;
            if (forced != 0) {
              EXPECT_EQ(s.vectors_per_thread, forced) << at;
            }
            if (s.vectors_per_thread == 0) {
              EXPECT_EQ(s.det_lanes, 1) << at;
              continue;
            }
            EXPECT_LE(s.det_lanes, s.vectors_per_thread) << at;
            const int64_t seg_q = qw / vec / segs, seg_k = kw / vec / segs;
            EXPECT_EQ(d.q_slots, (seg_q + p - 1) / p) << at;
            EXPECT_LE(d.q_slots + (seg_k + p - 1) / p, s.vectors_per_thread) << at;
          }
        }
      }
    }
  }
}

TEST(DeterministicShape, RejectsTpDegreesAndWidthsNamingThem) {
  testing::expect_error([] { deterministic_kernel_shape(2048, 2048, 8, 3, 256); }, {"TP degree 3"});
  testing::expect_error([] { deterministic_kernel_shape(2048, 2048, 8, 32, 256); },
                        {"TP degree 32"});
  testing::expect_error([] { deterministic_kernel_shape(1000, 2048, 8, 1, 256); }, {"1000"});
  testing::expect_error([] { deterministic_kernel_shape(2048, 2048, 1, 1, 256); }, {"vectors"});
  testing::expect_error([] { deterministic_kernel_shape(2048, 2048, 8, 1, 256, 1); },
                        {"vectors per thread", "not 1"});
  // 40 vectors a segment fit no layout of 2 vectors a thread.
  testing::expect_error([] { deterministic_kernel_shape(5120, 5120, 8, 1, 256, 2); },
                        {"no layout", "2 vectors per thread"});
}

QkNormParams det_params(int64_t q_full, int64_t k_full, int world, std::vector<uint16_t>& buf) {
  QkNormParams p;
  p.tokens = 4;
  p.q_full_width = q_full;
  p.k_full_width = k_full;
  p.deterministic = true;
  const int64_t qw = q_full / world, kw = k_full / world;
  buf.assign(static_cast<std::size_t>(4 * (qw + kw) * 2 + qw + kw + 64), 1);
  uint16_t* base =
      reinterpret_cast<uint16_t*>((reinterpret_cast<uintptr_t>(buf.data()) + 15) / 16 * 16);
  p.q = ShardView{base, base + 4 * (qw + kw), base + 8 * (qw + kw), qw, qw, qw, 1.f};
  p.k = ShardView{
      base + 4 * qw, base + 4 * (qw + kw) + 4 * qw, base + 8 * (qw + kw) + qw, kw, kw, kw, 1.f};
  return p;
}

TEST(DeterministicParams, ValidationNamesTheModeAndWhatItNeeds) {
  std::vector<uint16_t> buf;
  EXPECT_NO_THROW(validate_params(det_params(2048, 2048, 8, buf), 8));
  QkNormParams p = det_params(2048, 2048, 8, buf);
  p.method = Method::kMiniMaxFused;
  testing::expect_error([&] { validate_params(p, 8); },
                        {"deterministic mode needs Method::kSwiftQK"});
  std::vector<uint16_t> b2;
  testing::expect_error([&] { validate_params(det_params(1600, 1600, 2, b2), 2); }, {"800"});
}

}  // namespace
}  // namespace swiftqk
