// The deterministic mode on the host: the canonical sum's split over ranks, its accuracy against
// float64, the kernel shape it implies, and the checks that reject what it cannot do.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <utility>
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

// From kDetEightFromTokens tokens a launch, 8 vectors a thread keep their place before a one-lane
// layout of 4 with as many slots (OLMo2-13B's 40-vector segments); the other ties stay at 4.
TEST(DeterministicShape, ManyTokensTakeEightVectorsBeforeOneLane) {
  for (int world : {1, 2, 8, 16}) {
    const int64_t qw = 5120 / world;
    const std::string at = "OLMo2-13B TP " + std::to_string(world);
    const DeterministicShape few = deterministic_kernel_shape(qw, qw, 8, world, 256, 0, 64);
    EXPECT_EQ(few.shape.vectors_per_thread, 4) << at;
    EXPECT_EQ(few.shape.det_lanes, 1) << at;
    const DeterministicShape just_below =
        deterministic_kernel_shape(qw, qw, 8, world, 256, 0, kDetEightFromTokens - 1);
    EXPECT_EQ(just_below.shape.vectors_per_thread, 4) << at;
    const DeterministicShape many =
        deterministic_kernel_shape(qw, qw, 8, world, 256, 0, kDetEightFromTokens);
    EXPECT_EQ(many.shape.vectors_per_thread, 8) << at;
    EXPECT_EQ(many.shape.det_lanes, 2) << at;
    EXPECT_EQ(many.shape.group_threads * many.shape.vectors_per_thread,
              few.shape.group_threads * few.shape.vectors_per_thread)
        << at << ": as many slots";
    EXPECT_EQ(many.q_slots, 3) << at;
  }
  // Ties whose 4-vector layout holds several lanes a thread keep 4 at any token count: OLMoE
  // (8 threads of 4 lanes a segment) and MiniMax-M2 (16 of 2).
  for (const auto& [q, k] : {std::pair<int64_t, int64_t>{2048, 2048}, {6144, 1024}}) {
    const DeterministicShape d = deterministic_kernel_shape(q, k, 8, 1, 256, 0, 16384);
    EXPECT_EQ(d.shape.vectors_per_thread, 4) << q << ":" << k;
    EXPECT_GT(d.shape.det_lanes, 1) << q << ":" << k;
  }
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

// The kernel's procedure for one rank's row, step for step, on the host: each thread's staged
// slots (Q from the first up, K from the last down), its canonical lanes' totals and their tree,
// the shuffles of a segment, the scaled leaf, the segments' shuffles inside the warp and the
// warps' group_sum. Staged layouts only (a streamed row is one warp a segment, the order itself).
enum class Mutation { kNone, kLaneTreeAscending, kSegmentsDescending };  // negative controls

// One xor-butterfly level over v: every entry becomes v[j] + v[j ^ off], as lanes adding their
// partners' values do (a warp's __shfl_xor_sync, group_sum's levels, the ranks' exchange).
void xor_level(std::vector<float>& v, int off) {
  std::vector<float> next(v.size());
  for (std::size_t j = 0; j < v.size(); ++j) next[j] = v[j] + v[j ^ static_cast<std::size_t>(off)];
  v.swap(next);
}

float kernel_rank_sum(const float* row, int64_t width, int vec, int world, const KernelShape& s,
                      int q_slots, bool is_q, float scale, Mutation mutation = Mutation::kNone) {
  const int lanes = s.det_lanes, p = 32 / lanes, segs = 16 / world, g = s.group_threads;
  const int vpt = s.vectors_per_thread;
  const int64_t seg = width / vec / segs;
  auto vec_sum = [&](int64_t i) {
    float a = 0.f;
    for (int e = 0; e < vec; ++e) a = std::fma(row[i * vec + e], row[i * vec + e], a);
    return a;
  };
  std::vector<float> val(static_cast<std::size_t>(g));
  for (int gt = 0; gt < g; ++gt) {
    const int det_seg = gt / p, det_p = gt % p;
    std::vector<float> lane(static_cast<std::size_t>(lanes), 0.f);
    for (int u = 0; u < vpt; ++u) {  // the tensor's u-th slot: K's count from the last one down
      const int v = is_q ? u : vpt - 1 - u;
      if ((v < q_slots) != is_q) continue;
      const int64_t j = det_p + static_cast<int64_t>(p) * u;
      if (j >= seg) continue;
      lane[static_cast<std::size_t>(u % lanes)] += vec_sum(det_seg * seg + j);
    }
    if (mutation == Mutation::kLaneTreeAscending) {
      for (int h = 1; h < lanes; h <<= 1) {
        for (int i = 0; i + h < lanes; i += 2 * h) lane[i] += lane[i + h];
      }
    } else {
      for (int h = lanes / 2; h > 0; h >>= 1) {
        for (int i = 0; i < h; ++i) lane[i] += lane[i + h];
      }
    }
    val[static_cast<std::size_t>(gt)] = lane[0];
  }
  auto shuffle = [&](int off) { xor_level(val, off); };  // offsets below 32: within each warp
  for (int off = p / 2; off > 0; off >>= 1) shuffle(off);
  for (float& x : val) x = x * scale * scale;
  const int w = std::min(g, 32);
  if (mutation == Mutation::kSegmentsDescending) {
    for (int off = w / 2; off >= p; off >>= 1) shuffle(off);
  } else {
    for (int off = p; off < w; off <<= 1) shuffle(off);
  }
  if (g <= 32) return val[0];
  const int warps = g / 32;
  std::vector<float> part(static_cast<std::size_t>(warps));
  for (int i = 0; i < warps; ++i) part[i] = val[static_cast<std::size_t>(32 * i)];
  for (int off = 1; off < warps; off <<= 1) xor_level(part, off);
  return part[0];
}

// For every layout the policy or a forced count takes, the kernel's procedure on each rank, with
// the ranks' partials in the exchange's butterfly, gives the canonical sum's bits.
TEST(DeterministicShape, KernelProcedureOfEveryLayoutIsTheCanonicalOrder) {
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.f, 1.f);
  int layouts = 0;
  for (int world : {1, 2, 4, 8, 16}) {
    for (auto [q, k] : std::vector<std::pair<int64_t, int64_t>>{{2048, 2048},
                                                                {4096, 4096},
                                                                {5120, 5120},
                                                                {5120, 1024},
                                                                {6144, 1024},
                                                                {12288, 2048},
                                                                {2048, 256 * 16},
                                                                {128 * 24, 128 * 40}}) {
      for (int forced : {0, 2, 4, 8}) {
        const int vec = 8;
        if (q % (16 * vec) != 0 || k % (16 * vec) != 0) continue;
        DeterministicShape d;
        try {
          d = deterministic_kernel_shape(q / world, k / world, vec, world, 256, forced);
        } catch (const Error&) {
          continue;  // a forced count no layout fits (the test above checks the message)
        }
        if (d.shape.vectors_per_thread == 0) continue;
        ++layouts;
        std::vector<float> qrow(q), krow(k);
        for (float& x : qrow) x = nd(rng) * std::pow(10.f, nd(rng) * 0.5f);
        for (float& x : krow) x = nd(rng);
        const float scale = 0.75f;
        for (const bool is_q : {true, false}) {
          const std::vector<float>& row = is_q ? qrow : krow;
          const int64_t full = is_q ? q : k, local = full / world;
          std::vector<float> partial(static_cast<std::size_t>(world));
          for (int r = 0; r < world; ++r) {
            partial[r] = kernel_rank_sum(row.data() + r * local, local, vec, world, d.shape,
                                         d.q_slots, is_q, scale);
          }
          for (int off = 1; off < world; off <<= 1) xor_level(partial, off);
          const float want = ref::canonical_sum_of_squares(row.data(), full, vec, scale);
          uint32_t got_bits, want_bits;
          std::memcpy(&got_bits, &partial[0], 4);
          std::memcpy(&want_bits, &want, 4);
          EXPECT_EQ(got_bits, want_bits)
              << (is_q ? "Q " : "K ") << q << ":" << k << " TP " << world << " forced " << forced
              << " lanes " << d.shape.det_lanes << " vpt " << d.shape.vectors_per_thread;
        }
      }
    }
  }
  EXPECT_GE(layouts, 60);
}

// The negative control: the same procedure with its thread's lane tree taken in ascending
// offsets, or the segments' shuffles in descending ones, gives other bits on some rows.
TEST(DeterministicShape, KernelProcedureCatchesAnotherTreeOrder) {
  // OLMo2-7B at TP 1 in 8 slots: 4 lanes a thread, each with a vector of Q; 4 segments a warp.
  const int64_t q = 4096, k = 4096;
  const DeterministicShape d = deterministic_kernel_shape(q, k, 8, 1, 256, 8);
  ASSERT_EQ(d.shape.det_lanes, 4);
  ASSERT_EQ(d.q_slots, 4);
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> row(q);
  int differ[2] = {0, 0};
  for (int trial = 0; trial < 50; ++trial) {
    for (float& x : row) x = nd(rng) * std::pow(10.f, nd(rng));
    const float want = ref::canonical_sum_of_squares(row.data(), q, 8, 1.f);
    EXPECT_EQ(kernel_rank_sum(row.data(), q, 8, 1, d.shape, d.q_slots, true, 1.f), want);
    for (int m : {1, 2}) {
      const Mutation mu = m == 1 ? Mutation::kLaneTreeAscending : Mutation::kSegmentsDescending;
      if (kernel_rank_sum(row.data(), q, 8, 1, d.shape, d.q_slots, true, 1.f, mu) != want) {
        ++differ[m - 1];
      }
    }
  }
  EXPECT_GT(differ[0], 0) << "an ascending lane tree must change the bits on some rows";
  EXPECT_GT(differ[1], 0) << "descending segment shuffles must change the bits on some rows";
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
