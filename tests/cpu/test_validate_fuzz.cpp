// Property-based fuzz test of validate_params and vector_bytes_for against an independent,
// brute-force oracle. Random QkNormParams are laid out over a host arena (validate_fuzz/cases);
// the oracle (validate_fuzz/oracle) never reads through the pointers: it works on the arena
// offsets the generator recorded, marks every byte each tensor touches in a byte map, and decides
// overlap by exact byte intersection. The test then requires validate_params to throw
// swiftqk::Error if and only if the oracle says the call is invalid, and vector_bytes_for to agree
// with a model of the 16-byte vector rules.
#include <gtest/gtest.h>

#include <cctype>
#include <cstdint>
#include <exception>
#include <iostream>
#include <map>
#include <string>

#include "swiftqk/error.hpp"
#include "swiftqk/qk_norm_params.hpp"
#include "validate_fuzz/arena.hpp"
#include "validate_fuzz/cases.hpp"
#include "validate_fuzz/oracle.hpp"

namespace swiftqk {
namespace {

using namespace validate_fuzz;

constexpr uint64_t kSeed = 0x5eed'9c0f'fee0'2026ULL;
constexpr int kCases = 20000;
constexpr int kMaxReported = 5;  // stop after this many oracle/validator disagreements

// ---------------------------------------------------------------- running a case

// what() must read "<path>validate.cpp:<line>: <descriptive message>".
::testing::AssertionResult WellFormed(const Error& e) {
  const std::string what = e.what();
  const std::string tag = "validate.cpp:";
  const std::size_t at = what.find(tag);
  if (at == std::string::npos) return ::testing::AssertionFailure() << "no file:line in " << what;
  std::size_t i = at + tag.size();
  const std::size_t digits = i;
  while (i < what.size() && std::isdigit(static_cast<unsigned char>(what[i]))) ++i;
  if (i == digits || what.compare(i, 2, ": ") != 0) {
    return ::testing::AssertionFailure() << "no line number in " << what;
  }
  const std::string message = what.substr(i + 2);
  int letters = 0;
  for (char ch : message) letters += std::isalpha(static_cast<unsigned char>(ch)) ? 1 : 0;
  if (letters < 8) return ::testing::AssertionFailure() << "message too terse: " << what;
  const std::string file = e.file();
  if (e.line() <= 0 || file.size() < 12 ||
      file.compare(file.size() - 12, 12, "validate.cpp") != 0) {
    return ::testing::AssertionFailure() << "file()/line() are " << file << ":" << e.line();
  }
  return ::testing::AssertionSuccess();
}

struct Outcome {
  bool threw = false;
  std::string what;
  std::string other;  // a non-swiftqk exception, if any
  int line = 0;
};

Outcome RunValidate(const QkNormParams& p, int world) {
  Outcome o;
  try {
    validate_params(p, world);
  } catch (const Error& e) {
    o.threw = true;
    o.what = e.what();
    o.line = e.line();
    EXPECT_TRUE(WellFormed(e));
  } catch (const std::exception& e) {
    o.threw = true;
    o.other = e.what();
  }
  return o;
}

// ---------------------------------------------------------------- the fuzz test

TEST(ValidateFuzz, ValidatorAgreesWithByteMapOracle) {
  Rng g(kSeed);
  Arena arena;
  ByteMap map;
  int retries = 0, valid = 0, invalid = 0, mismatches = 0, cases = 0;
  int vec16 = 0, vec8 = 0, vec4 = 0, vec_scalar = 0, sole_checked = 0, in_place_valid = 0;
  int decided_by_conservative_2d = 0, decided_by_conservative_vector = 0;
  int rule_hits[kNumRules] = {};
  std::map<int, int> lines_hit;
  for (; cases < kCases && mismatches < kMaxReported; ++cases) {
    const Case c = Generate(g, &retries);
    const Verdict bad = Oracle(c, map);
    const QkNormParams p = Materialize(c, arena);
    const Outcome o = RunValidate(p, c.world);
    ASSERT_TRUE(o.other.empty()) << "non-swiftqk exception: " << o.other << "\n  " << Describe(c);
    for (int r = 0; r < kNumRules; ++r) rule_hits[r] += bad.test(r) ? 1 : 0;
    if (o.threw) ++lines_hit[o.line];
    if (o.threw != bad.any()) {
      ++mismatches;
      ADD_FAILURE() << "case " << cases << ": oracle says "
                    << (bad.any() ? "invalid (" + RuleList(bad) + ")" : "valid")
                    << ", validate_params " << (o.threw ? "threw: " + o.what : "accepted") << "\n  "
                    << Describe(c);
      continue;
    }
    if (bad.none()) {
      ++valid;
      if (c.tokens > 0 && !c.q.in.null && c.q.in.off == c.q.out.off) ++in_place_valid;
      const int want = ModelVectorBytes(c);
      const int got = vector_bytes_for(p);
      ++(want == 16                          ? vec16
         : want == 8                         ? vec8
         : want == 4 && kInSize[c.dtype] < 4 ? vec4
                                             : vec_scalar);
      if (got != want) {
        ++mismatches;
        ADD_FAILURE() << "case " << cases << ": vector_bytes_for = " << got << ", model says "
                      << want << "\n  " << Describe(c);
      }
      continue;
    }
    ++invalid;
    Verdict exact = bad;
    exact.reset(kStridesDifferRangesMeet).reset(kStridesDifferVectorMeet);
    if (exact.none()) {  // rejected only because of the documented conservative rule
      decided_by_conservative_2d += bad.test(kStridesDifferRangesMeet);
      decided_by_conservative_vector += !bad.test(kStridesDifferRangesMeet);
    }
    if (bad.count() == 1) {
      int r = 0;
      while (!bad.test(r)) ++r;
      ++sole_checked;
      EXPECT_NE(o.what.find(kRuleNeedles[r]), std::string::npos)
          << "the only problem is \"" << kRuleNames[r] << "\" but what() = " << o.what << "\n  "
          << Describe(c);
    }
  }

  std::cout << "[ fuzz     ] seed 0x" << std::hex << kSeed << std::dec << ": " << cases
            << " cases (" << retries << " regenerated to stay in the arena), " << valid
            << " valid (" << in_place_valid << " q in place), " << invalid << " invalid, "
            << mismatches << " disagreements\n"
            << "[ fuzz     ] " << NumMethods()
            << " Methods; vector_bytes_for on valid cases: " << vec16 << " x 16, " << vec8
            << " x 8, " << vec4 << " x 4, " << vec_scalar << " x element size\n"
            << "[ fuzz     ] " << sole_checked << " invalid cases with one problem had what() "
            << "checked\n"
            << "[ fuzz     ] invalid only by the different-strides rule: "
            << decided_by_conservative_2d << " (two [T, w] tensors), "
            << decided_by_conservative_vector << " (a weight or rstd_out in a row gap)\n"
            << "[ fuzz     ] " << lines_hit.size() << " distinct throw sites hit in validate.cpp\n";
  for (int r = 0; r < kNumRules; ++r) {
    std::cout << "[ fuzz     ]   " << rule_hits[r] << "\t" << kRuleNames[r] << "\n";
  }
  EXPECT_EQ(mismatches, 0);
  if (mismatches > 0) return;  // the loop stopped early; the coverage below would be noise
  EXPECT_EQ(cases, kCases);
  EXPECT_GE(valid, kCases / 5);
  EXPECT_GE(invalid, kCases / 5);
  EXPECT_GE(vec16, kCases / 50);
  EXPECT_GE(vec8, kCases / 100);
  EXPECT_GE(vec4, kCases / 200);
  EXPECT_GE(vec_scalar, kCases / 50);
  EXPECT_GE(in_place_valid, kCases / 50);
  for (int r = 0; r < kNumRules; ++r) {
    EXPECT_GT(rule_hits[r], 0) << "rule never violated: " << kRuleNames[r];
  }
}

// The generator is deterministic: the same seed gives the same cases.
TEST(ValidateFuzz, GeneratorIsDeterministic) {
  Rng a(kSeed), b(kSeed);
  int ra = 0, rb = 0;
  for (int i = 0; i < 200; ++i) {
    ASSERT_EQ(Describe(Generate(a, &ra)), Describe(Generate(b, &rb))) << "case " << i;
  }
}

}  // namespace
}  // namespace swiftqk
