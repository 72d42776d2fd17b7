// The epilogue reference checked against what it claims: RoPE is a rotation of the documented
// pairs, the norm's scope and weight_plus_one mean what the header says, the fp32 emulation stays
// within rounding of the float64 gold, and fp8 quantisation saturates as CUDA's SATFINITE does.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <tuple>
#include <utility>
#include <vector>

#include "epilogue_reference.hpp"
#include "expect_error.hpp"
#include "reference.hpp"
#include "swiftqk/error.hpp"

namespace swiftqk {
namespace ref {
namespace {

struct Shape {
  int64_t tokens = 5, q_heads = 4, kv_heads = 2, head_dim = 64, rotary_dim = 64;
  NormScope scope = NormScope::kLayerwise;
  NormOrder order = NormOrder::kOlmo2;
  DType dtype = DType::kBF16;
  RopeStyle style = RopeStyle::kNeox;
};

// Magnitude in [0.05, 2) with a random sign, never zero, representable in dtype.
double random_value(std::mt19937_64& rng, DType dtype) {
  std::uniform_real_distribution<double> mag(0.05, 2.0);
  const double v = (rng() & 1) ? mag(rng) : -mag(rng);
  return round_to(dtype, static_cast<float>(v));
}

std::vector<double> random_values(std::mt19937_64& rng, int64_t n, DType dtype) {
  std::vector<double> v(static_cast<std::size_t>(n));
  for (double& x : v) x = random_value(rng, dtype);
  return v;
}

// The usual table: row p holds cos(p f_i) then sin(p f_i), f_i = 10000^(-2i / rotary_dim), as
// floats (an fp32 cache). Row 0 is cos 1, sin 0.
std::vector<double> rope_table(int64_t max_position, int64_t rotary_dim) {
  std::vector<double> t(static_cast<std::size_t>(max_position * rotary_dim));
  const int64_t half = rotary_dim / 2;
  for (int64_t p = 0; p < max_position; ++p) {
    for (int64_t i = 0; i < half; ++i) {
      const double f = std::pow(10000.0, -2.0 * static_cast<double>(i) / rotary_dim);
      t[p * rotary_dim + i] = static_cast<float>(std::cos(p * f));
      t[p * rotary_dim + half + i] = static_cast<float>(std::sin(p * f));
    }
  }
  return t;
}

EpilogueProblem random_problem(const Shape& s, uint64_t seed) {
  std::mt19937_64 rng(seed);
  EpilogueProblem p;
  p.tokens = s.tokens;
  p.q_heads = s.q_heads;
  p.kv_heads = s.kv_heads;
  p.head_dim = s.head_dim;
  p.scope = s.scope;
  p.order = s.order;
  p.dtype = s.dtype;
  p.eps = 1e-6;
  const int64_t qw = s.q_heads * s.head_dim, kw = s.kv_heads * s.head_dim;
  p.q = random_values(rng, s.tokens * qw, s.dtype);
  p.k = random_values(rng, s.tokens * kw, s.dtype);
  p.v = random_values(rng, s.tokens * kw, s.dtype);
  const bool layerwise = s.scope == NormScope::kLayerwise;
  p.q_weight = random_values(rng, layerwise ? qw : s.head_dim, s.dtype);
  p.k_weight = random_values(rng, layerwise ? kw : s.head_dim, s.dtype);
  p.max_position = 4096;
  p.rotary_dim = s.rotary_dim;
  p.style = s.style;
  p.cos_sin = rope_table(p.max_position, p.rotary_dim);
  std::uniform_int_distribution<int64_t> pos(1, p.max_position - 1);
  for (int64_t t = 0; t < s.tokens; ++t) p.positions.push_back(pos(rng));
  return p;
}

bool same_bits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

// The element indices a rotation pairs, as the header documents them.
std::vector<std::pair<int64_t, int64_t>> documented_pairs(RopeStyle style, int64_t rotary_dim) {
  std::vector<std::pair<int64_t, int64_t>> pairs;
  for (int64_t i = 0; i < rotary_dim / 2; ++i) {
    pairs.emplace_back(style == RopeStyle::kNeox ? std::pair{i, i + rotary_dim / 2}
                                                 : std::pair{2 * i, 2 * i + 1});
  }
  return pairs;
}

// A unit in the last place of the model dtype at magnitude m > 0.
double ulp(DType dtype, double m) {
  const int mant = dtype == DType::kBF16 ? 7 : 10;
  const int emin = dtype == DType::kBF16 ? -126 : -14;
  return std::ldexp(1.0, std::max(std::ilogb(m), emin) - mant);
}

// ---------------------------------------------------------------- RoPE

TEST(EpilogueReference, RopePreservesEachPairsNorm) {
  for (RopeStyle style : {RopeStyle::kNeox, RopeStyle::kGptj}) {
    Shape s;
    s.style = style;
    const EpilogueProblem p = random_problem(s, 11);
    EpilogueProblem still = p;  // position 0: cos 1, sin 0, the normalised values alone
    for (int64_t& pos : still.positions) pos = 0;
    const EpilogueExpected r = epilogue_fp64(p), n = epilogue_fp64(still);
    for (int64_t t = 0; t < p.tokens; ++t) {
      for (int64_t h = 0; h < p.q_heads; ++h) {
        const double* rh = r.q.data() + (t * p.q_heads + h) * p.head_dim;
        const double* nh = n.q.data() + (t * p.q_heads + h) * p.head_dim;
        const double* cs = p.cos_sin.data() + p.positions[t] * p.rotary_dim;
        for (int64_t i = 0; i < p.rotary_dim / 2; ++i) {
          const auto [a, b] = documented_pairs(style, p.rotary_dim)[i];
          // The table holds floats, so cos^2 + sin^2 is 1 only to about 2^-24: the pair's norm
          // is scaled by exactly |(cos, sin)|.
          const double before = std::hypot(nh[a], nh[b]), after = std::hypot(rh[a], rh[b]);
          const double gain = std::hypot(cs[i], cs[p.rotary_dim / 2 + i]);
          EXPECT_NEAR(after, before * gain, 1e-14 * before) << "token " << t << " head " << h;
          // And it did rotate: the position is not 0.
          if (a == 0) {
            EXPECT_NE(rh[a], nh[a]);
          }
        }
      }
    }
  }
}

TEST(EpilogueReference, TheTailPastRotaryDimIsBitIdentical) {
  for (NormOrder order : {NormOrder::kOlmo2, NormOrder::kLlama}) {
    Shape s;
    s.rotary_dim = 16;  // of head_dim 64
    s.order = order;
    const EpilogueProblem p = random_problem(s, 12);
    EpilogueProblem still = p;
    for (int64_t& pos : still.positions) pos = 0;
    for (auto fn : {&epilogue_fp64, &epilogue_emulated}) {
      const EpilogueExpected r = fn(p), n = fn(still);
      int64_t rotated = 0;
      for (std::size_t i = 0; i < r.k.size(); ++i) {
        const int64_t d = static_cast<int64_t>(i) % p.head_dim;
        if (d >= p.rotary_dim) {
          EXPECT_TRUE(same_bits(r.k[i], n.k[i])) << "element " << i;
        } else {
          rotated += r.k[i] != n.k[i];
        }
      }
      EXPECT_GT(rotated, 0);
    }
  }
}

// Position 0 (cos 1, sin 0) leaves the norm alone: the gold is then rms_norm_fp64 bit for bit,
// and the Llama emulation rms_norm_emulated (the same two roundings; Olmo2 applies rs last, so
// it may round differently).
TEST(EpilogueReference, PositionZeroIsTheNormAlone) {
  for (NormOrder order : {NormOrder::kOlmo2, NormOrder::kLlama}) {
    Shape s;
    s.order = order;
    EpilogueProblem p = random_problem(s, 13);
    for (int64_t& pos : p.positions) pos = 0;
    const EpilogueExpected gold = epilogue_fp64(p), emu = epilogue_emulated(p);
    const int64_t qw = p.q_heads * p.head_dim;
    const std::vector<double> norm = rms_norm_fp64(p.q, p.q_weight, p.tokens, qw, p.eps);
    for (std::size_t i = 0; i < norm.size(); ++i) {
      ASSERT_TRUE(same_bits(gold.q[i], norm[i])) << "element " << i;
    }
    if (order == NormOrder::kLlama) {
      const std::vector<double> norm_emu =
          rms_norm_emulated(p.q, p.q_weight, p.tokens, qw, p.eps, order, p.dtype);
      for (std::size_t i = 0; i < norm_emu.size(); ++i) {
        ASSERT_TRUE(same_bits(emu.q[i], norm_emu[i])) << "element " << i;
      }
    }
  }
}

// One token, one head of 8 with x = 1..8 (mean square 25.5) and weight 1, rotated by hand.
TEST(EpilogueReference, NeoxAndGptjPairTheDocumentedElements) {
  EpilogueProblem p;
  p.tokens = 1;
  p.q_heads = p.kv_heads = 1;
  p.head_dim = 8;
  p.q = {1, 2, 3, 4, 5, 6, 7, 8};
  p.k = p.v = p.q;
  p.q_weight = p.k_weight = std::vector<double>(8, 1.0);
  p.scope = NormScope::kLayerwise;
  p.eps = 1e-6;
  p.max_position = 2;
  p.positions = {1};
  const double n = 1.0 / std::sqrt(25.5 + 1e-6);
  const double x[8] = {1 * n, 2 * n, 3 * n, 4 * n, 5 * n, 6 * n, 7 * n, 8 * n};
  const double c0 = 0.8, s0 = 0.6, c1 = 0.28, s1 = 0.96, c2 = -0.6, s2 = 0.8, c3 = 0, s3 = -1;

  // rotary_dim 8: NeoX pairs (0,4) (1,5) (2,6) (3,7); GPT-J (0,1) (2,3) (4,5) (6,7).
  p.rotary_dim = 8;
  p.cos_sin = {1, 1, 1, 1, 0, 0, 0, 0, c0, c1, c2, c3, s0, s1, s2, s3};
  p.style = RopeStyle::kNeox;
  const std::vector<double> neox = {
      x[0] * c0 - x[4] * s0, x[1] * c1 - x[5] * s1, x[2] * c2 - x[6] * s2, x[3] * c3 - x[7] * s3,
      x[4] * c0 + x[0] * s0, x[5] * c1 + x[1] * s1, x[6] * c2 + x[2] * s2, x[7] * c3 + x[3] * s3};
  const EpilogueExpected a = epilogue_fp64(p);
  p.style = RopeStyle::kGptj;
  const std::vector<double> gptj = {
      x[0] * c0 - x[1] * s0, x[1] * c0 + x[0] * s0, x[2] * c1 - x[3] * s1, x[3] * c1 + x[2] * s1,
      x[4] * c2 - x[5] * s2, x[5] * c2 + x[4] * s2, x[6] * c3 - x[7] * s3, x[7] * c3 + x[6] * s3};
  const EpilogueExpected b = epilogue_fp64(p);

  // rotary_dim 4: NeoX pairs (0,2) (1,3), GPT-J (0,1) (2,3); elements 4..7 pass through.
  p.rotary_dim = 4;
  p.cos_sin = {1, 1, 0, 0, c0, c1, s0, s1};
  p.style = RopeStyle::kNeox;
  const std::vector<double> neox4 = {x[0] * c0 - x[2] * s0,
                                     x[1] * c1 - x[3] * s1,
                                     x[2] * c0 + x[0] * s0,
                                     x[3] * c1 + x[1] * s1,
                                     x[4],
                                     x[5],
                                     x[6],
                                     x[7]};
  const EpilogueExpected c = epilogue_fp64(p);
  p.style = RopeStyle::kGptj;
  const std::vector<double> gptj4 = {x[0] * c0 - x[1] * s0,
                                     x[1] * c0 + x[0] * s0,
                                     x[2] * c1 - x[3] * s1,
                                     x[3] * c1 + x[2] * s1,
                                     x[4],
                                     x[5],
                                     x[6],
                                     x[7]};
  const EpilogueExpected d = epilogue_fp64(p);

  for (int i = 0; i < 8; ++i) {
    EXPECT_NEAR(a.q[i], neox[i], 1e-15) << "NeoX, rotary_dim 8, element " << i;
    EXPECT_NEAR(a.k[i], neox[i], 1e-15) << "NeoX, rotary_dim 8, element " << i;
    EXPECT_NEAR(b.q[i], gptj[i], 1e-15) << "GPT-J, rotary_dim 8, element " << i;
    EXPECT_NEAR(c.q[i], neox4[i], 1e-15) << "NeoX, rotary_dim 4, element " << i;
    EXPECT_NEAR(d.q[i], gptj4[i], 1e-15) << "GPT-J, rotary_dim 4, element " << i;
  }
}

// ---------------------------------------------------------------- the norm's scope and weight

TEST(EpilogueReference, LayerwiseAndHeadwiseDifferWhenHeadsDifferInRms) {
  Shape s;
  s.scope = NormScope::kHeadwise;
  EpilogueProblem head = random_problem(s, 14);
  // Q head h scaled by 1 + 3h: the heads' RMS differ, so one RMS over the row is not theirs.
  for (std::size_t i = 0; i < head.q.size(); ++i) {
    head.q[i] *= 1 + 3 * ((static_cast<int64_t>(i) / head.head_dim) % head.q_heads);
  }
  EpilogueProblem layer = head;
  layer.scope = NormScope::kLayerwise;
  layer.q_weight.clear();
  for (int64_t h = 0; h < head.q_heads; ++h) {
    layer.q_weight.insert(layer.q_weight.end(), head.q_weight.begin(), head.q_weight.end());
  }
  layer.k_weight.clear();
  for (int64_t h = 0; h < head.kv_heads; ++h) {
    layer.k_weight.insert(layer.k_weight.end(), head.k_weight.begin(), head.k_weight.end());
  }
  const EpilogueExpected a = epilogue_fp64(head), b = epilogue_fp64(layer);
  // Headwise every head comes out at the same RMS scale; layerwise head 0 is scaled up (its RMS
  // is below the row's) and the last head down.
  int64_t far = 0;
  for (std::size_t i = 0; i < a.q.size(); ++i)
    far += std::fabs(a.q[i] - b.q[i]) > 0.1 * std::fabs(a.q[i]);
  EXPECT_GT(far, static_cast<int64_t>(a.q.size()) / 2);
}

TEST(EpilogueReference, LayerwiseAndHeadwiseAgreeOnRowsOfOneHead) {
  for (NormOrder order : {NormOrder::kOlmo2, NormOrder::kLlama}) {
    Shape s;
    s.q_heads = s.kv_heads = 1;
    s.order = order;
    s.scope = NormScope::kHeadwise;
    const EpilogueProblem head = random_problem(s, 15);
    EpilogueProblem layer = head;
    layer.scope = NormScope::kLayerwise;
    for (auto fn : {&epilogue_fp64, &epilogue_emulated}) {
      const EpilogueExpected a = fn(head), b = fn(layer);
      for (std::size_t i = 0; i < a.q.size(); ++i) ASSERT_TRUE(same_bits(a.q[i], b.q[i])) << i;
      for (std::size_t i = 0; i < a.k.size(); ++i) ASSERT_TRUE(same_bits(a.k[i], b.k[i])) << i;
    }
  }
}

// weight_plus_one with w is the plain norm with weight 1 + w. The w are multiples of 2^-8 below
// 1, so 1 + w is exact in fp32 too and the emulation must agree bit for bit as well.
TEST(EpilogueReference, WeightPlusOneIsTheNormWithOnePlusW) {
  for (NormOrder order : {NormOrder::kOlmo2, NormOrder::kLlama}) {
    Shape s;
    s.scope = NormScope::kHeadwise;
    s.order = order;
    EpilogueProblem plus = random_problem(s, 16);
    std::mt19937_64 rng(17);
    std::uniform_int_distribution<int> step(-120, 120);
    for (auto* w : {&plus.q_weight, &plus.k_weight}) {
      for (double& x : *w) {
        int k = 0;
        while (k == 0) k = step(rng);  // never a zero weight
        x = k / 256.0;
      }
    }
    plus.weight_plus_one = true;
    EpilogueProblem plain = plus;
    plain.weight_plus_one = false;
    for (auto* w : {&plain.q_weight, &plain.k_weight}) {
      for (double& x : *w) x = 1.0 + x;
    }
    for (auto fn : {&epilogue_fp64, &epilogue_emulated}) {
      const EpilogueExpected a = fn(plus), b = fn(plain);
      for (std::size_t i = 0; i < a.q.size(); ++i) ASSERT_TRUE(same_bits(a.q[i], b.q[i])) << i;
      for (std::size_t i = 0; i < a.k.size(); ++i) ASSERT_TRUE(same_bits(a.k[i], b.k[i])) << i;
    }
    // And it is not the norm with w itself.
    EpilogueProblem w_only = plus;
    w_only.weight_plus_one = false;
    EXPECT_NE(epilogue_fp64(w_only).q[0], epilogue_fp64(plus).q[0]);
  }
}

TEST(EpilogueReference, LayerwiseWithWeightPlusOneIsRefused) {
  EpilogueProblem p = random_problem(Shape{}, 18);
  p.weight_plus_one = true;
  testing::expect_error([&] { epilogue_fp64(p); }, "weight_plus_one is headwise only");
  testing::expect_error([&] { epilogue_emulated(p); }, "weight_plus_one is headwise only");
}

// ---------------------------------------------------------------- emulation against the gold

// The emulation rounds to the model dtype once in the Olmo2 order (half an ulp, plus fp32 noise:
// within 1 ulp) and three times in the Llama order (x * rs, times w, after the rotation: within
// 2 ulps), where the gold never rounds. For a rotated element the ulp is taken at its pair's
// magnitude |(a, b)|, which the rotation keeps: Llama's two earlier roundings move a and b by up
// to an ulp of their own, and a rotated element that nearly cancels keeps that absolute error.
TEST(EpilogueReference, EmulatedIsWithinTwoUlpsOfTheGold) {
  for (DType dtype : {DType::kBF16, DType::kF16}) {
    for (NormOrder order : {NormOrder::kOlmo2, NormOrder::kLlama}) {
      for (NormScope scope : {NormScope::kLayerwise, NormScope::kHeadwise}) {
        for (RopeStyle style : {RopeStyle::kNeox, RopeStyle::kGptj}) {
          Shape s;
          s.dtype = dtype;
          s.order = order;
          s.scope = scope;
          s.style = style;
          s.tokens = 32;
          s.rotary_dim = 48;
          const EpilogueProblem p = random_problem(s, 19 + static_cast<int>(dtype));
          const EpilogueExpected gold = epilogue_fp64(p), emu = epilogue_emulated(p);
          double worst = 0;
          for (const auto& [g, e, heads] :
               {std::tuple{&gold.q, &emu.q, p.q_heads}, std::tuple{&gold.k, &emu.k, p.kv_heads}}) {
            for (int64_t row = 0; row < p.tokens * heads; ++row) {
              const double* gh = g->data() + row * p.head_dim;
              const double* eh = e->data() + row * p.head_dim;
              std::vector<double> mag(p.head_dim);
              for (int64_t d = 0; d < p.head_dim; ++d) mag[d] = std::fabs(gh[d]);
              for (const auto& [a, b] : documented_pairs(style, p.rotary_dim)) {
                mag[a] = mag[b] = std::hypot(gh[a], gh[b]);
              }
              for (int64_t d = 0; d < p.head_dim; ++d) {
                worst = std::max(worst, std::fabs(eh[d] - gh[d]) / ulp(dtype, mag[d]));
              }
            }
          }
          EXPECT_LE(worst, order == NormOrder::kOlmo2 ? 1.0 : 2.0)
              << to_string(dtype) << " " << to_string(order) << " scope " << static_cast<int>(scope)
              << " style " << static_cast<int>(style);
          EXPECT_GT(worst, 0.0);  // the emulation does round
        }
      }
    }
  }
}

TEST(EpilogueReference, ABadPositionGivesNaNRowsAndLeavesTheOthers) {
  for (auto fn : {&epilogue_fp64, &epilogue_emulated}) {
    const EpilogueProblem p = random_problem(Shape{}, 20);
    EpilogueProblem bad = p;
    bad.positions[1] = p.max_position;
    bad.positions[3] = -1;
    const EpilogueExpected a = fn(p), b = fn(bad);
    const int64_t qw = p.q_heads * p.head_dim, kw = p.kv_heads * p.head_dim;
    for (int64_t t = 0; t < p.tokens; ++t) {
      const bool broken = t == 1 || t == 3;
      for (int64_t i = 0; i < qw; ++i) {
        const double got = b.q[t * qw + i];
        if (broken) {
          ASSERT_TRUE(std::isnan(got)) << "token " << t;
        } else {
          ASSERT_TRUE(same_bits(got, a.q[t * qw + i])) << "token " << t;
        }
      }
      for (int64_t i = 0; i < kw; ++i) {
        ASSERT_EQ(std::isnan(b.k[t * kw + i]), broken) << "token " << t;
      }
    }
  }
}

// ---------------------------------------------------------------- fp8 and shards

TEST(EpilogueReference, QuantizeE4m3IsCudasSatfiniteRounding) {
  const double scale = 0.37;
  std::mt19937_64 rng(21);
  std::uniform_real_distribution<double> exponent(-12.0, 11.0);
  std::vector<double> x;
  for (int i = 0; i < 4000; ++i) x.push_back(((i & 1) ? -1 : 1) * std::exp2(exponent(rng)));
  const std::vector<double> q = quantize_e4m3(x, scale);
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double gold = x[i] / scale;
    const uint8_t bits = float_to_e4m3_bits(static_cast<float>(gold));
    ASSERT_EQ(q[i], e4m3_bits_to_float(bits)) << x[i];
    ASSERT_LE(std::fabs(q[i]), 448.0);
    // Round to nearest: at most half the tolerance's ulp, unless saturated.
    const double err = std::fabs(q[i] - gold);
    if (std::fabs(gold) <= 448.0) {
      ASSERT_LE(err, 0.5 * e4m3_tolerance(gold)) << gold;
    } else {
      ASSERT_EQ(std::fabs(q[i]), 448.0) << gold;
    }
    ASSERT_LE(err, e4m3_tolerance(gold)) << gold;
  }
  // Known values: 0.3 rounds to 1.25 x 2^-2; 464 is past the top and saturates; so does inf.
  EXPECT_EQ(quantize_e4m3({0.3, 464.0, -1e30, 1.0, 448.0}, 1.0),
            (std::vector<double>{0.3125, 448.0, -448.0, 1.0, 448.0}));
  EXPECT_EQ(quantize_e4m3({std::numeric_limits<double>::infinity()}, 1.0)[0], 448.0);
  EXPECT_EQ(quantize_e4m3({896.0, 1.0}, 2.0), (std::vector<double>{448.0, 0.5}));
  EXPECT_TRUE(std::isnan(quantize_e4m3({std::nan("")}, 1.0)[0]));
  testing::expect_error([] { quantize_e4m3({1.0}, 0.0); }, "scale must be finite and > 0");
}

TEST(EpilogueReference, E4m3ToleranceIsOneUlp) {
  EXPECT_EQ(e4m3_tolerance(1.0), 0.125);
  EXPECT_EQ(e4m3_tolerance(-1.9), 0.125);
  EXPECT_EQ(e4m3_tolerance(300.0), 32.0);
  EXPECT_EQ(e4m3_tolerance(448.0), 32.0);
  EXPECT_EQ(e4m3_tolerance(1000.0), 32.0 + 552.0);
  EXPECT_EQ(e4m3_tolerance(0x1p-6), 0x1p-9);
  EXPECT_EQ(e4m3_tolerance(1e-5), 0x1p-9);  // subnormal spacing
}

TEST(EpilogueReference, ColumnShardsTileTheRow) {
  std::mt19937_64 rng(22);
  const int64_t tokens = 3, width = 24;
  const std::vector<double> full = random_values(rng, tokens * width, DType::kBF16);
  for (int world : {1, 2, 4, 8}) {
    std::vector<double> back(full.size());
    const int64_t w = width / world;
    for (int r = 0; r < world; ++r) {
      const std::vector<double> shard = column_shard(full, tokens, width, world, r);
      ASSERT_EQ(shard.size(), static_cast<std::size_t>(tokens * w));
      for (int64_t t = 0; t < tokens; ++t) {
        for (int64_t i = 0; i < w; ++i) back[t * width + r * w + i] = shard[t * w + i];
      }
    }
    EXPECT_EQ(back, full) << "world " << world;
  }
  testing::expect_error([&] { column_shard(full, tokens, width, 5, 0); },
                        "width 24 is not divisible by world 5");
  testing::expect_error([&] { column_shard(full, tokens, width, 2, 2); }, "rank 2 of 2");
  testing::expect_error([&] { column_shard(full, tokens + 1, width, 2, 0); },
                        "has 72 elements, expected 96");
}

}  // namespace
}  // namespace ref
}  // namespace swiftqk
