// Random calls on virtual ranks: every call either returns outputs that match the float64
// reference (and bitwise-identical scales on all ranks) or throws swiftqk::Error and writes
// nothing. The CPU fuzz test (test_validate_fuzz.cpp) shows the validator agrees with a byte-map
// oracle; this one shows that what it accepts the kernels compute correctly over random shapes,
// dtypes, orders, layouts, token counts, workspace sizes and methods, and that no call it refuses
// reaches a kernel.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "problem.hpp"
#include "require_gpu.hpp"

namespace swiftqk::testing {
namespace {

constexpr uint64_t kSeed = 0x5eed'f022'2026ull;
constexpr int kCases = 80;

enum class Corruption { kNone, kEpsNaN, kEpsZero, kNullOut, kMisaligned, kShortStride, kTokens };

const char* name_of(Corruption c) {
  switch (c) {
    case Corruption::kNone:
      return "none";
    case Corruption::kEpsNaN:
      return "eps NaN";
    case Corruption::kEpsZero:
      return "eps 0";
    case Corruption::kNullOut:
      return "null k.out";
    case Corruption::kMisaligned:
      return "misaligned q.in";
    case Corruption::kShortStride:
      return "k.in_stride < width";
    case Corruption::kTokens:
      return "one rank with another token count";
  }
  return "?";
}

// Breaks rank r's parameters in a way the library must refuse.
void corrupt(QkNormParams& p, Corruption c) {
  switch (c) {
    case Corruption::kNone:
      break;
    case Corruption::kEpsNaN:
      p.eps = std::numeric_limits<float>::quiet_NaN();
      break;
    case Corruption::kEpsZero:
      p.eps = 0.f;
      break;
    case Corruption::kNullOut:
      p.k.out = nullptr;
      break;
    case Corruption::kMisaligned:
      p.q.in = static_cast<const char*>(p.q.in) + 1;
      break;
    case Corruption::kShortStride:
      p.k.in_stride = p.k.width - 1;
      break;
    case Corruption::kTokens:
      p.tokens += 1;
      break;
  }
}

TEST(Fuzz, RandomCallsAreCorrectOrRefusedWithoutWriting) {
  REQUIRE_GPU();
  std::mt19937_64 rng(kSeed);
  auto pick = [&](auto... v) {
    const std::vector<std::common_type_t<decltype(v)...>> options{v...};
    return options[std::uniform_int_distribution<std::size_t>(0, options.size() - 1)(rng)];
  };
  auto uniform = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  int accepted = 0, refused = 0;
  for (int c = 0; c < kCases; ++c) {
    const int world = pick(1, 2, 3, 4, 8);
    // Local widths: half of them multiples of 8 (the 16-byte vector path), half anything.
    auto local_width = [&] { return uniform(0, 1) ? 8 * uniform(1, 96) : uniform(1, 700); };
    const int64_t q_width = world * local_width(), k_width = world * local_width();
    const int64_t tokens = uniform(0, 3) == 0 ? uniform(0, 3) : uniform(1, 700);
    const DType in = pick(DType::kBF16, DType::kF16, DType::kF32, DType::kF8E4M3);
    const NormOrder order = pick(NormOrder::kOlmo2, NormOrder::kLlama);
    const float eps = pick(1e-6f, 1e-5f);
    Layout layout = pick(Layout::kSeparate, Layout::kFusedInPlace, Layout::kFusedOutOfPlace);
    if (in == DType::kF8E4M3 && layout == Layout::kFusedInPlace) layout = Layout::kSeparate;
    const Method method = uniform(0, 4) == 0 ? Method::kMiniMaxFused : Method::kSwiftQK;
    CommConfig cfg;
    cfg.timeout_s = wait_s(10.0);
    if (uniform(0, 1)) cfg.token_capacity = uniform(1, 128);  // chunked launches
    // Refusals are only checked where outputs are separate from inputs (poison stays visible).
    Corruption bad = Corruption::kNone;
    if (tokens > 0 && layout != Layout::kFusedInPlace && uniform(0, 2) == 0) {
      bad = pick(Corruption::kEpsNaN, Corruption::kEpsZero, Corruption::kNullOut,
                 Corruption::kMisaligned, Corruption::kShortStride, Corruption::kTokens);
      if (bad == Corruption::kMisaligned && in == DType::kF8E4M3) bad = Corruption::kNullOut;
      if (bad == Corruption::kTokens && world == 1) bad = Corruption::kEpsZero;
    }
    const int bad_rank = static_cast<int>(uniform(0, world - 1));
    std::ostringstream what;
    what << "case " << c << ": world " << world << ", q " << q_width << ", k " << k_width
         << ", tokens " << tokens << ", " << to_string(in) << ", " << to_string(order)
         << ", layout " << static_cast<int>(layout) << ", " << to_string(method) << ", capacity "
         << cfg.token_capacity << ", corruption " << name_of(bad) << " on rank " << bad_rank;
    SCOPED_TRACE(what.str());

    auto comms = Communicator::create_local_group(std::vector<int>(world, 0), cfg);
    Problem p = Problem::random(tokens, q_width, k_width, in, order, eps, kSeed + c);
    std::vector<RankData> ranks;
    std::vector<Communicator*> cp;
    std::vector<QkNormParams> pp;
    for (int r = 0; r < world; ++r) {
      ranks.push_back(make_rank(p, world, r, layout));
      ranks.back().params.method = method;
      poison(ranks.back(), nullptr);
      cp.push_back(&comms[r]);
      pp.push_back(ranks.back().params);
    }
    SWIFTQK_CUDA_TRY(cudaDeviceSynchronize());
    if (bad != Corruption::kNone) {
      corrupt(pp[bad_rank], bad);
      EXPECT_THROW(launch_qk_norm_group(cp, pp, nullptr), Error);
      SWIFTQK_CUDA_TRY(cudaDeviceSynchronize());
      for (const RankData& d : ranks) EXPECT_TRUE(outputs_untouched(p, world, d));
      ++refused;
      continue;
    }
    launch_qk_norm_group(cp, pp, nullptr);
    for (auto& comm : comms) comm.synchronize(nullptr);
    std::vector<RankData*> rp;
    for (auto& d : ranks) rp.push_back(&d);
    const Check chk = check_ranks(p, world, rp);
    EXPECT_EQ(chk.wrong, 0) << chk.first_error;
    EXPECT_TRUE(chk.rstd_identical) << "ranks used different scales";
    ++accepted;
  }
  std::printf("fuzz: %d random calls computed correctly, %d corrupted calls refused cleanly\n",
              accepted, refused);
}

}  // namespace
}  // namespace swiftqk::testing
