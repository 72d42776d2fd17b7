// The fp8 stores' quotient without a division (src/kernels/e4m3_quotient.hpp, the code the
// kernels run): the same e4m3 bits as the correctly rounded value / scale, above all next to
// e4m3's rounding ties, and the scales it leaves to a division.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kernels/e4m3_quotient.hpp"
#include "reference.hpp"

namespace swiftqk {
namespace {

using detail::e4m3_quotient;
using detail::e4m3_reciprocal;

float from_bits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, sizeof f);
  return f;
}

// Counts the values whose e4m3 bits differ from those of the correctly rounded quotient.
int mismatches(const std::vector<float>& values, float scale) {
  const float inv = e4m3_reciprocal(scale);
  int bad = 0;
  for (float v : values) {
    const uint8_t want = ref::float_to_e4m3_bits(v / scale);
    const uint8_t got = ref::float_to_e4m3_bits(e4m3_quotient(v, scale, inv));
    if (want != got) {
      if (++bad <= 3)
        ADD_FAILURE() << "scale " << scale << " value " << v << ": " << int{want}
                      << " != " << int{got};
    }
  }
  return bad;
}

// Values whose quotient lands on or next to an e4m3 rounding tie (the midpoint between two
// neighbouring codes), in both signs: the rounded products of each midpoint and the scale, and
// their neighbours up to 4 ulps away.
std::vector<float> near_ties(float scale) {
  std::vector<float> out;
  for (int code = 0; code < 0x7e; ++code) {
    const float lo = ref::e4m3_bits_to_float(static_cast<uint8_t>(code));
    const float hi = ref::e4m3_bits_to_float(static_cast<uint8_t>(code + 1));
    float v = 0.5f * (lo + hi) * scale;
    for (int i = 0; i < 4; ++i) v = std::nextafter(v, 0.f);
    for (int i = 0; i < 9; ++i, v = std::nextafter(v, FLT_MAX)) {
      out.push_back(v);
      out.push_back(-v);
    }
  }
  return out;
}

// Every 2^32 / stride-th bit pattern (NaNs, infinities and subnormals among them), the special
// values, and random normal values.
std::vector<float> spread(uint32_t stride, std::mt19937& rng) {
  std::vector<float> out;
  for (uint64_t b = 0; b < (uint64_t{1} << 32); b += stride) out.push_back(from_bits(uint32_t(b)));
  const float inf = std::numeric_limits<float>::infinity();
  for (float s : {0.f, -0.f, inf, -inf, std::nanf(""), FLT_MAX, -FLT_MAX, FLT_MIN, -FLT_MIN,
                  FLT_TRUE_MIN, -FLT_TRUE_MIN, 448.f, -448.f, 464.f, 1.f, -1.f}) {
    out.push_back(s);
  }
  std::normal_distribution<float> n(0.f, 3.f);
  for (int i = 0; i < 100000; ++i) out.push_back(n(rng));
  return out;
}

TEST(E4m3Quotient, GivesTheBitsOfTheCorrectlyRoundedQuotient) {
  std::mt19937 rng(41);
  const std::vector<float> values = spread(65521, rng);
  std::uniform_real_distribution<float> log2_scale(-60.f, 60.f);
  std::vector<float> scales = {1.f,     0.1f,     3.7f,           1.f / 448.f, 7.3e-5f,
                               1234.5f, 0x1p-64f, 0x1.fffffep63f, 0x1p64f,     0.333333f};
  for (int i = 0; i < 6; ++i) scales.push_back(std::exp2(log2_scale(rng)));
  for (float s : scales) {
    ASSERT_NE(e4m3_reciprocal(s), 0.f) << s;
    EXPECT_EQ(mismatches(values, s), 0) << "scale " << s;
    EXPECT_EQ(mismatches(near_ties(s), s), 0) << "scale " << s << " near ties";
  }
}

TEST(E4m3Quotient, KeepsTheSignOfZeroAndNaN) {
  for (float s : {1.f, 0.1f, 3.7f}) {
    const float inv = e4m3_reciprocal(s);
    EXPECT_TRUE(std::signbit(e4m3_quotient(-0.f, s, inv)));
    EXPECT_FALSE(std::signbit(e4m3_quotient(0.f, s, inv)));
    EXPECT_TRUE(std::isnan(e4m3_quotient(std::nanf(""), s, inv)));
    // An overflowing product stays infinite (saturates to 448), never NaN.
    EXPECT_EQ(ref::float_to_e4m3_bits(e4m3_quotient(FLT_MAX, 0x1p-60f, e4m3_reciprocal(0x1p-60f))),
              0x7e);
  }
}

TEST(E4m3Quotient, ScalesOutsideItsRangeDivide) {
  const float inf = std::numeric_limits<float>::infinity();
  for (float s : {0.f, -0.f, -1.f, -0.1f, inf, -inf, std::nanf(""), FLT_TRUE_MIN, FLT_MIN, 0x1p-65f,
                  0x1.000002p64f, FLT_MAX}) {
    EXPECT_EQ(e4m3_reciprocal(s), 0.f) << s;
  }
  EXPECT_EQ(e4m3_reciprocal(4.f), 0.25f);
  EXPECT_EQ(e4m3_reciprocal(0.1f), 1.f / 0.1f);
}

}  // namespace
}  // namespace swiftqk
