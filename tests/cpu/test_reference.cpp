// Tests for the host reference: conversions, the worked example, tolerance tightness, metrics.
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "expect_error.hpp"
#include "reference.hpp"
#include "swiftqk/error.hpp"

namespace swiftqk {
namespace ref {
namespace {

using testing::expect_error;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr double kEps = 1e-6;

// ---------------------------------------------------------------- worked example (docs)

const std::vector<double> kWorkedX = {1, 2, -1, 0.5, 3, -2, 1.5, 0.5};
// 1 / sqrt(21.75 / 8 + 1e-6) = 1 / sqrt(2.718751), evaluated with 40-digit arithmetic.
constexpr double kWorkedRstd = 0.60647832332688960624;

TEST(WorkedExample, ShardPartialsAndTotal) {
  // Rank 0 holds x[0..4), rank 1 holds x[4..8).
  EXPECT_EQ(sum_of_squares_sharded(kWorkedX.data(), 4, 1), 6.25);
  EXPECT_EQ(sum_of_squares_sharded(kWorkedX.data() + 4, 4, 1), 15.5);
  for (int world : {1, 2, 4, 8}) {
    EXPECT_EQ(sum_of_squares_sharded(kWorkedX.data(), 8, world), 21.75) << "world " << world;
  }
  expect_error([&] { sum_of_squares_sharded(kWorkedX.data(), 8, 3); },
               "width 8 is not divisible by world 3");
}

TEST(WorkedExample, RstdAndUnitWeightOutput) {
  EXPECT_EQ(21.75 / 8, 2.71875);
  EXPECT_NEAR(1.0 / std::sqrt(2.71875 + kEps), kWorkedRstd, 1e-12);
  const std::vector<double> y = rms_norm_fp64(kWorkedX, std::vector<double>(8, 1.0), 1, 8, kEps);
  ASSERT_EQ(y.size(), 8u);
  for (std::size_t i = 0; i < 8; ++i) EXPECT_NEAR(y[i], kWorkedX[i] * kWorkedRstd, 1e-12);
  EXPECT_NEAR(y[4], 1.81943496998066881873, 1e-12);  // 3 * rstd
  EXPECT_NEAR(y[6], 0.90971748499033440937, 1e-12);  // 1.5 * rstd
}

// ---------------------------------------------------------------- conversions

TEST(Bf16, KnownBitPatterns) {
  EXPECT_EQ(float_to_bf16_bits(1.0f), 0x3f80);
  EXPECT_EQ(float_to_bf16_bits(-2.5f), 0xc020);
  EXPECT_EQ(float_to_bf16_bits(1.0f + 0x1p-8f), 0x3f80);      // tie, 1.0 is even: down
  EXPECT_EQ(float_to_bf16_bits(1.0f + 3 * 0x1p-8f), 0x3f82);  // tie, 1 + 2^-6 is even: up
  EXPECT_EQ(bf16_bits_to_float(0x3f82), 1.0f + 0x1p-6f);
  EXPECT_EQ(float_to_bf16_bits(0x1p-133f), 0x0001);  // smallest subnormal
  EXPECT_EQ(bf16_bits_to_float(0x0001), 0x1p-133f);
  EXPECT_EQ(float_to_bf16_bits(FLT_MAX), 0x7f80);  // rounds past the max bf16: inf
  EXPECT_EQ(float_to_bf16_bits(-kInf), 0xff80);
  EXPECT_TRUE(std::isnan(bf16_bits_to_float(float_to_bf16_bits(kNaN))));
  EXPECT_TRUE(std::isnan(bf16_bits_to_float(float_to_bf16_bits(-kNaN))));
}

TEST(F16, KnownBitPatterns) {
  EXPECT_EQ(float_to_f16_bits(1.0f), 0x3c00);
  EXPECT_EQ(float_to_f16_bits(-2.5f), 0xc100);
  EXPECT_EQ(float_to_f16_bits(65504.0f), 0x7bff);  // max finite
  EXPECT_EQ(float_to_f16_bits(65519.0f), 0x7bff);  // below the 65520 midpoint
  EXPECT_EQ(float_to_f16_bits(65520.0f), 0x7c00);  // tie rounds to even 65536: inf
  EXPECT_EQ(float_to_f16_bits(-1e6f), 0xfc00);
  EXPECT_EQ(float_to_f16_bits(1.0f + 0x1p-11f), 0x3c00);      // tie: down to even
  EXPECT_EQ(float_to_f16_bits(1.0f + 3 * 0x1p-11f), 0x3c02);  // tie: up to even
  EXPECT_EQ(float_to_f16_bits(0x1p-14f), 0x0400);             // smallest normal
  EXPECT_EQ(float_to_f16_bits(0x1p-24f), 0x0001);             // smallest subnormal
  EXPECT_EQ(float_to_f16_bits(0x1p-25f), 0x0000);             // tie with 0: even
  EXPECT_EQ(float_to_f16_bits(3 * 0x1p-25f), 0x0002);
  EXPECT_EQ(float_to_f16_bits(-0.0f), 0x8000);
  EXPECT_EQ(f16_bits_to_float(0x0001), 0x1p-24f);
  EXPECT_EQ(f16_bits_to_float(0x7bff), 65504.0f);
  EXPECT_EQ(f16_bits_to_float(0xfc00), -kInf);
  EXPECT_TRUE(std::isnan(f16_bits_to_float(float_to_f16_bits(kNaN))));
}

TEST(E4m3, KnownBitPatterns) {
  EXPECT_EQ(float_to_e4m3_bits(1.0f), 0x38);
  EXPECT_EQ(float_to_e4m3_bits(-2.5f), 0xc2);
  EXPECT_EQ(float_to_e4m3_bits(448.0f), 0x7e);  // max finite
  EXPECT_EQ(float_to_e4m3_bits(464.0f), 0x7e);  // would round to 480: saturates
  EXPECT_EQ(float_to_e4m3_bits(480.0f), 0x7e);
  EXPECT_EQ(float_to_e4m3_bits(1e6f), 0x7e);
  EXPECT_EQ(float_to_e4m3_bits(-1e6f), 0xfe);
  EXPECT_EQ(float_to_e4m3_bits(kInf), 0x7e);
  EXPECT_EQ(float_to_e4m3_bits(1.0f + 0x1p-4f), 0x38);      // tie: down to even
  EXPECT_EQ(float_to_e4m3_bits(1.0f + 3 * 0x1p-4f), 0x3a);  // tie: up to even, 1.25
  EXPECT_EQ(float_to_e4m3_bits(0x1p-6f), 0x08);             // smallest normal
  EXPECT_EQ(float_to_e4m3_bits(7 * 0x1p-9f), 0x07);         // largest subnormal
  EXPECT_EQ(float_to_e4m3_bits(0x1p-9f), 0x01);             // smallest subnormal
  EXPECT_EQ(float_to_e4m3_bits(0x1p-10f), 0x00);            // tie with 0: even
  EXPECT_EQ(float_to_e4m3_bits(3 * 0x1p-10f), 0x02);
  EXPECT_EQ(e4m3_bits_to_float(0x7e), 448.0f);
  EXPECT_EQ(e4m3_bits_to_float(0xc2), -2.5f);
  EXPECT_EQ(e4m3_bits_to_float(0x01), 0x1p-9f);
  EXPECT_TRUE(std::isnan(e4m3_bits_to_float(0x7f)));
  EXPECT_TRUE(std::isnan(e4m3_bits_to_float(0xff)));
  EXPECT_TRUE(std::isnan(e4m3_bits_to_float(float_to_e4m3_bits(kNaN))));
}

// Every non-NaN code decodes and re-encodes to itself.
TEST(Conversions, ExhaustiveRoundTrip) {
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const auto c = static_cast<uint16_t>(b);
    if (!std::isnan(bf16_bits_to_float(c))) {
      ASSERT_EQ(float_to_bf16_bits(bf16_bits_to_float(c)), c);
    }
    if (!std::isnan(f16_bits_to_float(c))) {
      ASSERT_EQ(float_to_f16_bits(f16_bits_to_float(c)), c);
    }
  }
  for (uint32_t b = 0; b < 0x100; ++b) {
    const auto c = static_cast<uint8_t>(b);
    if (!std::isnan(e4m3_bits_to_float(c))) {
      ASSERT_EQ(float_to_e4m3_bits(e4m3_bits_to_float(c)), c);
    }
  }
}

// Nearest-even checked against the decoded neighbours of the chosen code, independently of how
// the encoder computes it. Inputs are random magnitudes spanning each format's whole range.
template <typename Enc, typename Dec>
void check_nearest_even(Enc enc, Dec dec, int min_exp, float max_finite, uint32_t max_code) {
  std::mt19937_64 rng(1234);
  std::uniform_real_distribution<float> mant(1.0f, 2.0f);
  std::uniform_int_distribution<int> expo(min_exp, std::ilogb(max_finite));
  for (int n = 0; n < 200000; ++n) {
    const float v = std::ldexp(mant(rng), expo(rng));
    if (v > max_finite) continue;
    const uint32_t c = enc(v);
    const double err = std::fabs(double(dec(c)) - v);
    if (c > 0) {
      ASSERT_GE(std::fabs(double(dec(c - 1)) - v), err) << v;
    }
    if (c < max_code) {
      const double up = std::fabs(double(dec(c + 1)) - v);
      ASSERT_GE(up, err) << v;
      if (up == err) {
        ASSERT_EQ(c % 2, 0u) << "tie not to even at " << v;
      }
    }
  }
}

TEST(Conversions, RoundsToNearestEven) {
  check_nearest_even(float_to_bf16_bits, bf16_bits_to_float, -135, bf16_bits_to_float(0x7f7f),
                     0x7f7f);
  check_nearest_even(float_to_f16_bits, f16_bits_to_float, -26, 65504.0f, 0x7bff);
  check_nearest_even(float_to_e4m3_bits, e4m3_bits_to_float, -11, 448.0f, 0x7e);
}

TEST(Conversions, StoreLoadRoundsLikeRoundTo) {
  std::mt19937_64 rng(7);
  std::normal_distribution<double> normal(0.0, 30.0);
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16, DType::kF8E4M3}) {
    std::vector<unsigned char> buf(64 * dtype_size(t));
    for (std::size_t i = 0; i < 64; ++i) {
      const double v = normal(rng);
      store_element(buf.data(), t, i, v);
      EXPECT_EQ(load_element(buf.data(), t, i), round_to(t, static_cast<float>(v))) << to_string(t);
    }
  }
  unsigned char fp8 = 0;
  store_element(&fp8, DType::kF8E4M3, 0, -1000.0);
  EXPECT_EQ(load_element(&fp8, DType::kF8E4M3, 0), -448.0);  // saturating store
}

// ---------------------------------------------------------------- tolerance tightness

struct Problem {
  std::vector<double> x, w;
  int64_t tokens, width;
};

// Inputs already on the input dtype's grid and weights on the output dtype's grid, like the
// kernel sees them. Rows get different scales; weights are around 1 with spread.
Problem make_problem(std::mt19937_64& rng, int64_t tokens, int64_t width, DType in) {
  const DType out = output_dtype_for(in);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::uniform_real_distribution<double> log_scale(-1.0, 1.0);
  Problem p{std::vector<double>(tokens * width), std::vector<double>(width), tokens, width};
  for (int64_t t = 0; t < tokens; ++t) {
    const double scale = std::pow(10.0, log_scale(rng));
    for (int64_t i = 0; i < width; ++i) {
      p.x[t * width + i] = round_to(in, static_cast<float>(scale * normal(rng)));
    }
  }
  for (double& wi : p.w) wi = round_to(out, static_cast<float>(1.0 + 0.5 * normal(rng)));
  return p;
}

// A buggy kernel: normalises with `divisor` instead of width, scales by `scale`, or (local_world
// > 1) uses each rank's own shard statistics, i.e. forgets the all-reduce.
std::vector<double> buggy_norm(const Problem& p, double divisor, double scale, int local_world,
                               DType out) {
  std::vector<double> y(p.x.size());
  const int64_t shard = p.width / local_world;
  const double d = local_world > 1 ? static_cast<double>(shard) : divisor;
  for (int64_t t = 0; t < p.tokens; ++t) {
    for (int r = 0; r < local_world; ++r) {
      const int64_t begin = t * p.width + r * shard;
      double sum = 0;
      for (int64_t j = begin; j < begin + shard; ++j) sum += p.x[j] * p.x[j];
      const double rstd = 1.0 / std::sqrt(sum / d + kEps);
      for (int64_t j = begin; j < begin + shard; ++j) {
        const double v = scale * p.w[j - t * p.width] * p.x[j] * rstd;
        y[j] = round_to(out, static_cast<float>(v));
      }
    }
  }
  return y;
}

// Largest |got - gold| / max(|gold|, floor), to show the tolerance is actually approached.
double max_relative_error(const std::vector<double>& got, const std::vector<double>& gold,
                          DType out) {
  double worst = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    worst = std::max(
        worst, std::fabs(got[i] - gold[i]) / std::max(std::fabs(gold[i]), absolute_floor(out)));
  }
  return worst;
}

TEST(Tolerance, CorrectEmulationPassesAndBugsFail) {
  std::mt19937_64 rng(20240601);
  for (DType in : {DType::kF32, DType::kF16, DType::kBF16, DType::kF8E4M3}) {
    const DType out = output_dtype_for(in);
    for (NormOrder order : {NormOrder::kOlmo2, NormOrder::kLlama}) {
      for (int64_t width : {64, 1000, 4096, 4100}) {
        SCOPED_TRACE(to_string(in) + " " + to_string(order) + " width " + std::to_string(width));
        const Problem p = make_problem(rng, 8, width, in);
        const auto gold = rms_norm_fp64(p.x, p.w, p.tokens, p.width, kEps);
        const auto emu = rms_norm_emulated(p.x, p.w, p.tokens, p.width, kEps, order, out);
        EXPECT_EQ(count_out_of_tolerance(emu, gold, out, order), 0);
        const double observed = max_relative_error(emu, gold, out);
        const double tol = relative_tolerance(out, order);
        // Not too loose: correct 16-bit results use a good part of the bound.
        if (out != DType::kF32) {
          EXPECT_GT(observed, 0.4 * tol);
        }
        // Not too tight/loose for bugs: each of these must be caught.
        EXPECT_GT(count_out_of_tolerance(buggy_norm(p, width / 2.0, 1.0, 1, out), gold, out, order),
                  0)
            << "eps/mean over width/2 not caught";
        EXPECT_GT(count_out_of_tolerance(buggy_norm(p, width, 1.01, 1, out), gold, out, order), 0)
            << "1% scale error not caught";
        EXPECT_GT(count_out_of_tolerance(buggy_norm(p, width, 1.0, 2, out), gold, out, order), 0)
            << "rank-local statistics (missing all-reduce) not caught";
      }
    }
  }
}

TEST(Reference, RowRangesGiveTheWholeReferenceBitForBit) {
  // The test support splits the gold reference's rows across threads: any split must give the
  // bits of one whole call, and a range must write its rows and nothing else.
  std::mt19937_64 rng(777);
  const Problem p = make_problem(rng, 37, 1000, DType::kBF16);
  const std::vector<double> whole = rms_norm_fp64(p.x, p.w, p.tokens, p.width, kEps);
  for (const int64_t chunk : {int64_t{1}, int64_t{5}, int64_t{36}, int64_t{37}}) {
    std::vector<double> y(whole.size(), kNaN);
    for (int64_t t0 = 0; t0 < p.tokens; t0 += chunk) {
      rms_norm_fp64_rows(p.x.data(), p.w.data(), p.width, kEps, t0, std::min(p.tokens, t0 + chunk),
                         y.data());
    }
    for (std::size_t i = 0; i < y.size(); ++i) {
      ASSERT_EQ(std::memcmp(&y[i], &whole[i], sizeof(double)), 0)
          << "chunk " << chunk << " at " << i;
    }
  }
  std::vector<double> y(whole.size(), kNaN);
  rms_norm_fp64_rows(p.x.data(), p.w.data(), p.width, kEps, 3, 5, y.data());
  for (int64_t t = 0; t < p.tokens; ++t) {
    const bool inside = t >= 3 && t < 5;
    EXPECT_EQ(std::isnan(y[t * p.width]), !inside) << "row " << t;
    if (inside) {
      EXPECT_EQ(y[t * p.width + 7], whole[t * p.width + 7]) << "row " << t;
    }
  }
  rms_norm_fp64_rows(p.x.data(), p.w.data(), p.width, kEps, 4, 4, y.data());  // empty range
  expect_error([&] { rms_norm_fp64_rows(p.x.data(), p.w.data(), 0, kEps, 0, 1, y.data()); },
               "rms_norm_fp64_rows: width must be >= 1 and 0 <= row_begin <= row_end");
  expect_error([&] { rms_norm_fp64_rows(p.x.data(), p.w.data(), p.width, kEps, 5, 4, y.data()); },
               "rms_norm_fp64_rows: width must be >= 1 and 0 <= row_begin <= row_end");
  expect_error([&] { rms_norm_fp64_rows(p.x.data(), p.w.data(), p.width, kEps, -1, 4, y.data()); },
               "rms_norm_fp64_rows: width must be >= 1 and 0 <= row_begin <= row_end");
}

TEST(Tolerance, ValuesAreOrdered) {
  for (NormOrder o : {NormOrder::kOlmo2, NormOrder::kLlama}) {
    EXPECT_GT(relative_tolerance(DType::kBF16, o), relative_tolerance(DType::kF16, o));
    EXPECT_GT(relative_tolerance(DType::kF16, o), relative_tolerance(DType::kF32, o));
    EXPECT_LT(relative_tolerance(DType::kBF16, o), 0.01);  // a 1% error must never pass
  }
  EXPECT_DOUBLE_EQ(relative_tolerance(DType::kBF16, NormOrder::kOlmo2), 1.25 / 256 + 1e-5);
  EXPECT_DOUBLE_EQ(relative_tolerance(DType::kBF16, NormOrder::kLlama), 2.25 / 256 + 1e-5);
  expect_error([&] { relative_tolerance(DType::kF8E4M3, NormOrder::kOlmo2); },
               "fp8 is an input type only");
  EXPECT_LT(absolute_floor(DType::kF16), 1e-3);
}

TEST(Tolerance, NaNIsOutOfTolerance) {
  EXPECT_EQ(
      count_out_of_tolerance({1.5, kNaN, -kInf}, {1.5, 0.7, 0.2}, DType::kBF16, NormOrder::kOlmo2),
      2);
}

// ---------------------------------------------------------------- metrics

TEST(Compare, KnownMetrics) {
  const ErrorMetrics m = compare({1.0, 2.0, 3.0, 4.0}, {1.0, 2.5, 2.0, 4.0});
  EXPECT_EQ(m.count, 4);
  EXPECT_EQ(m.nonfinite, 0);
  EXPECT_DOUBLE_EQ(m.max_abs, 1.0);
  EXPECT_EQ(m.worst_index, 2);
  EXPECT_DOUBLE_EQ(m.mean_abs, 0.375);
  EXPECT_DOUBLE_EQ(m.rmse, std::sqrt(1.25 / 4));
}

TEST(Compare, NonFiniteCounted) {
  const ErrorMetrics m = compare({1.0, kNaN, 3.5, kInf}, {1.0, 2.0, 3.0, 4.0});
  EXPECT_EQ(m.count, 4);
  EXPECT_EQ(m.nonfinite, 2);
  EXPECT_EQ(m.max_abs, std::numeric_limits<double>::infinity());
  EXPECT_EQ(m.worst_index, 1);
  EXPECT_DOUBLE_EQ(m.mean_abs, 0.25);                           // finite pairs only: (0 + 0.5) / 2
  EXPECT_EQ(compare({kNaN, kInf}, {kNaN, kInf}).nonfinite, 0);  // agreeing non-finites
  expect_error([&] { compare({1.0}, {1.0, 2.0}); }, "got has 1 elements, ref has 2");
}

TEST(Pool, GivesTheMetricsOfOneCompareOverTheUnion) {
  const std::vector<double> got = {1.0, 2.0, 3.0, 4.0, 5.5, -1.0},
                            ref = {1.0, 2.5, 2.0, 4.0, 5.0, 1.0};
  const ErrorMetrics whole = compare(got, ref);
  const ErrorMetrics a = compare({got.begin(), got.begin() + 2}, {ref.begin(), ref.begin() + 2});
  const ErrorMetrics b = compare({got.begin() + 2, got.end()}, {ref.begin() + 2, ref.end()});
  const ErrorMetrics m = pool({a, b});
  EXPECT_EQ(m.count, whole.count);
  EXPECT_EQ(m.max_abs, whole.max_abs);
  EXPECT_DOUBLE_EQ(m.mean_abs, whole.mean_abs);
  EXPECT_DOUBLE_EQ(m.rmse, whole.rmse);
  EXPECT_EQ(m.worst_index, -1);  // the parts index different arrays
  EXPECT_EQ(pool({a}).rmse, a.rmse);
  const ErrorMetrics none = pool({});
  EXPECT_EQ(none.count, 0);
  EXPECT_EQ(none.rmse, 0.0);
  const ErrorMetrics bad = pool({a, compare({kNaN}, {1.0})});
  EXPECT_EQ(bad.nonfinite, 1);
  EXPECT_EQ(bad.max_abs, std::numeric_limits<double>::infinity());
}

// ---------------------------------------------------------------- quantised inputs

TEST(Quantise, ScaleAndStoredValues) {
  const std::vector<float> v = {1.0f, -896.0f, 3.0f, 0.01f};
  EXPECT_EQ(input_scale(DType::kF8E4M3, v.data(), v.size()), 2.0f);  // amax 896 stores as 448
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16}) {
    EXPECT_EQ(input_scale(t, v.data(), v.size()), 1.0f) << to_string(t);
  }
  std::vector<uint8_t> raw(v.size());
  std::vector<double> stored(v.size(), kNaN);
  quantise(v.data(), DType::kF8E4M3, 2.0f, 0, 2, raw.data(), stored.data());
  quantise(v.data(), DType::kF8E4M3, 2.0f, 2, 4, raw.data(), stored.data());  // ranges compose
  EXPECT_EQ(raw[1], float_to_e4m3_bits(-448.0f));
  EXPECT_EQ(stored, (std::vector<double>{1.0, -896.0, 3.0,
                                         e4m3_bits_to_float(float_to_e4m3_bits(0.005f)) * 2.0}));
  std::vector<uint8_t> raw16(2 * v.size());
  quantise(v.data(), DType::kBF16, 1.0f, 0, v.size(), raw16.data(), stored.data());
  for (std::size_t i = 0; i < v.size(); ++i) EXPECT_EQ(stored[i], round_to(DType::kBF16, v[i]));
}

// What the benchmark reports for fp8 inputs, on the problem's distribution (normal values, rows
// scaled by 10^u, u in [-1, 1); weights in [0.25, 2)): a correct kernel's output against the gold
// of the dequantised inputs (its own error) and against the gold of the values before
// quantisation (end to end). The end-to-end error is e4m3's: 3 mantissa bits, up to 2^-4 of a
// value, against bf16's 2^-8 for the kernel's rounding.
TEST(Quantise, EndToEndErrorOfFp8IncludesTheQuantisation) {
  const int64_t tokens = 64, width = 1024;
  std::mt19937_64 rng(2025);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::uniform_real_distribution<float> decade(-1.f, 1.f), weight(0.25f, 2.f);
  std::vector<float> v(tokens * width);
  for (int64_t t = 0; t < tokens; ++t) {
    const float mag = std::pow(10.f, decade(rng));
    for (int64_t j = 0; j < width; ++j) v[t * width + j] = normal(rng) * mag;
  }
  std::vector<double> w(width);
  for (double& x : w) x = round_to(DType::kBF16, weight(rng));
  const float scale = input_scale(DType::kF8E4M3, v.data(), v.size());
  std::vector<uint8_t> raw(v.size());
  std::vector<double> stored(v.size());
  quantise(v.data(), DType::kF8E4M3, scale, 0, v.size(), raw.data(), stored.data());
  const std::vector<double> original(v.begin(), v.end());
  const auto gold = rms_norm_fp64(stored, w, tokens, width, kEps);
  const auto gold_original = rms_norm_fp64(original, w, tokens, width, kEps);
  const ErrorMetrics golds_apart = compare(gold, gold_original);
  EXPECT_GT(golds_apart.rmse, 0.0);
  for (NormOrder order : {NormOrder::kOlmo2, NormOrder::kLlama}) {
    SCOPED_TRACE(to_string(order));
    const auto kernel =
        rms_norm_emulated(stored, w, tokens, width, kEps, order, output_dtype_for(DType::kF8E4M3));
    const ErrorMetrics own = compare(kernel, gold), e2e = compare(kernel, gold_original);
    EXPECT_GT(own.rmse, 0.0);
    EXPECT_GE(e2e.max_abs, own.max_abs);
    EXPECT_GE(e2e.mean_abs, own.mean_abs);
    // Unit roundoffs 16x apart; the observed ratio is 12-16 here: well above 4.
    EXPECT_GT(e2e.rmse, 4 * own.rmse);
    // Outputs of RMS ~1.2 (the weights' RMS) with relative errors of a few 2^-5: a few 1e-2.
    EXPECT_GT(e2e.rmse, 5e-3);
    EXPECT_LT(e2e.rmse, 0.2);
    // The tolerance holds the kernel to the stored inputs; against the original values it must
    // fail, which is why the benchmark reports the end-to-end error and does not bound it.
    EXPECT_EQ(count_out_of_tolerance(kernel, gold, DType::kBF16, order), 0);
    EXPECT_GT(count_out_of_tolerance(kernel, gold_original, DType::kBF16, order), 0);
  }
}

// ---------------------------------------------------------------- names

TEST(Names, RoundTripAndAliases) {
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16, DType::kF8E4M3}) {
    EXPECT_EQ(parse_dtype(to_string(t)), t);
  }
  EXPECT_EQ(to_string(DType::kF8E4M3), "f8e4m3");
  for (const char* n : {"fp32", "float32", "float"}) EXPECT_EQ(parse_dtype(n), DType::kF32);
  for (const char* n : {"fp16", "float16", "half"}) EXPECT_EQ(parse_dtype(n), DType::kF16);
  EXPECT_EQ(parse_dtype("bfloat16"), DType::kBF16);
  for (const char* n : {"fp8", "e4m3", "fp8_e4m3"}) EXPECT_EQ(parse_dtype(n), DType::kF8E4M3);
  for (NormOrder o : {NormOrder::kOlmo2, NormOrder::kLlama}) {
    EXPECT_EQ(parse_norm_order(to_string(o)), o);
  }
}

TEST(Names, BadNameMessage) {
  expect_error([] { parse_dtype("fp64"); }, {"'fp64'", "f32", "f16", "bf16", "fp8_e4m3"});
  expect_error([] { parse_norm_order("gemma"); }, {"'gemma'", "olmo2, llama"});
}

}  // namespace
}  // namespace ref
}  // namespace swiftqk
