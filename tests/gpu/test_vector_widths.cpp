// The four vector widths of the fused kernel on virtual ranks, against the float64 reference:
// rows whose widths, strides or pointers allow 8-byte vectors but not 16-byte ones (fp8 widths
// that are multiples of 8 elements, 16-bit ones of 4, f32 ones of 2), rows that allow 4-byte
// vectors but not 8-byte ones (fp8 widths of 4, 16-bit ones of 2), staged and streamed, and
// every forced LaunchTuning::vector_bytes on rows that allow 16-byte vectors, at every
// forced vectors-per-thread count. Each case first asserts which width the rows allow, so that
// none passes on another path than the one it names.
#include <gtest/gtest.h>

#include <initializer_list>
#include <string>
#include <vector>

#include "expect_error.hpp"
#include "problem.hpp"
#include "require_gpu.hpp"

namespace swiftqk::testing {
namespace {

struct Case {
  int world;
  int64_t tokens, q_width, k_width;  // full widths
  DType in;
  NormOrder order;
  Layout layout = Layout::kSeparate;
  Method method = Method::kSwiftQK;
  LaunchTuning tuning = {};
};

std::string name_of(const Case& c) {
  return "tp" + std::to_string(c.world) + " t" + std::to_string(c.tokens) + " q" +
         std::to_string(c.q_width) + " k" + std::to_string(c.k_width) + " " + to_string(c.in) +
         " " + to_string(c.order) + (c.layout == Layout::kSeparate ? "" : " fused") + " " +
         to_string(c.method) + " vector bytes " + std::to_string(c.tuning.vector_bytes) + " vpt " +
         std::to_string(c.tuning.vectors_per_thread);
}

// Runs one call of c into poisoned outputs and checks it; expects every rank's rows to allow
// vectors of want_bytes (vector_bytes_for) before the launch.
void run_case(const Case& c, int want_bytes) {
  CommConfig cfg;
  cfg.token_capacity = 4096;
  cfg.timeout_s = wait_s(10.0);
  auto comms = Communicator::create_local_group(std::vector<int>(c.world, 0), cfg);
  Problem p = Problem::random(c.tokens, c.q_width, c.k_width, c.in, c.order, 1e-6f, 4321);
  std::vector<RankData> ranks;
  std::vector<Communicator*> cp;
  std::vector<QkNormParams> pp;
  for (int r = 0; r < c.world; ++r) {
    ranks.push_back(make_rank(p, c.world, r, c.layout));
    ranks.back().params.method = c.method;
    ranks.back().params.tuning = c.tuning;
    ASSERT_EQ(vector_bytes_for(ranks.back().params), want_bytes) << name_of(c) << " rank " << r;
    poison(ranks.back(), nullptr);
  }
  for (int r = 0; r < c.world; ++r) {
    cp.push_back(&comms[r]);
    pp.push_back(ranks[r].params);
  }
  SWIFTQK_CUDA_TRY(cudaDeviceSynchronize());
  launch_qk_norm_group(cp, pp, nullptr);
  for (auto& comm : comms) comm.synchronize(nullptr);
  std::vector<RankData*> rp;
  for (auto& d : ranks) rp.push_back(&d);
  const Check chk = check_ranks(p, c.world, rp);
  EXPECT_EQ(chk.wrong, 0) << name_of(c) << ": " << chk.first_error;
  EXPECT_TRUE(chk.rstd_identical) << name_of(c) << ": ranks used different scales";
}

std::size_t size_of(DType t) {
  switch (t) {
    case DType::kF32:
      return 4;
    case DType::kF16:
    case DType::kBF16:
      return 2;
    case DType::kF8E4M3:
      return 1;
  }
  return 1;
}

// Local widths of odd numbers of `bytes`-byte vectors (q and k of `odds`), so that no wider
// vector divides them, at TP 1, 2 and 4 in both orders, each case run and checked by run_case;
// returns how many ran.
struct Odd {
  int64_t q, k;
};
int run_odd_rows(int bytes, std::initializer_list<DType> dtypes, std::initializer_list<Odd> odds) {
  int ran = 0;
  for (DType dt : dtypes) {
    const int64_t v = static_cast<int64_t>(bytes / size_of(dt));  // elements of a vector
    for (int world : {1, 2, 4}) {
      for (const Odd o : odds) {
        for (NormOrder order : {NormOrder::kOlmo2, NormOrder::kLlama}) {
          // The streamed rows' float64 reference is the slow part: fewer tokens there.
          for (int64_t tokens : {int64_t{1}, o.q > 1000 ? int64_t{40} : int64_t{333}}) {
            run_case(Case{world, tokens, world * v * o.q, world * v * o.k, dt, order}, bytes);
            ++ran;
          }
        }
      }
    }
  }
  return ran;
}

// Odd numbers of 8-byte vectors: short rows (packed at TP 2-4), rows of a few hundred vectors,
// and rows past the staged limit's bytes (4096 8-byte vectors), which stream.
TEST(VectorWidths, EightByteRowsMatchTheReference) {
  REQUIRE_GPU();
  const int ran = run_odd_rows(8, {DType::kBF16, DType::kF16, DType::kF32, DType::kF8E4M3},
                               {Odd{7, 3}, Odd{251, 37}, Odd{3001, 1501}});
  EXPECT_EQ(ran, 4 * 3 * 3 * 2 * 2);
}

// Odd numbers of 4-byte vectors of 1- and 2-byte types (fp8's 412 at TP 8 of 3296 is one):
// packed short rows at TP 2-4, rows of a few hundred vectors, and rows past 4096 vectors, which
// stream.
TEST(VectorWidths, FourByteRowsMatchTheReference) {
  REQUIRE_GPU();
  const int ran = run_odd_rows(4, {DType::kBF16, DType::kF16, DType::kF8E4M3},
                               {Odd{7, 3}, Odd{103, 63}, Odd{2501, 2001}});
  EXPECT_EQ(ran, 3 * 3 * 3 * 2 * 2);
}

// A fused QKV buffer whose row (Q + 2 K) is an odd number of 4-byte vectors, so every other
// token's rows start 4 bytes off 8-byte alignment: in place for 16-bit inputs, out of place
// for fp8 (whose bf16 outputs cannot overwrite it).
TEST(VectorWidths, FourByteFusedRows) {
  REQUIRE_GPU();
  for (int world : {1, 2, 4}) {
    for (DType dt : {DType::kBF16, DType::kF16, DType::kF8E4M3}) {
      const int64_t v4 = static_cast<int64_t>(4 / size_of(dt));
      Case fused{world,
                 257,
                 world * v4 * 51,
                 world * v4 * 13,
                 dt,
                 NormOrder::kOlmo2,
                 dt == DType::kF8E4M3 ? Layout::kFusedOutOfPlace : Layout::kFusedInPlace};
      run_case(fused, 4);
    }
  }
}

// In place in a fused QKV buffer whose row (Q + 2 K) is an odd number of 8-byte vectors, and the
// MiniMax-fused method, which has no 8-byte kernels and takes the scalar path on such rows.
TEST(VectorWidths, EightByteFusedRowsAndTheMiniMaxScalarPath) {
  REQUIRE_GPU();
  for (int world : {1, 2, 4}) {
    for (DType dt : {DType::kBF16, DType::kF32}) {
      const int64_t v8 = static_cast<int64_t>(8 / size_of(dt));
      Case fused{world,
                 257,
                 world * v8 * 51,
                 world * v8 * 13,
                 dt,
                 NormOrder::kOlmo2,
                 Layout::kFusedInPlace};
      run_case(fused, 8);
    }
    for (DType dt : {DType::kBF16, DType::kF8E4M3}) {
      const int64_t v8 = static_cast<int64_t>(8 / size_of(dt));
      Case mm{world, 129, world * v8 * 51, world * v8 * 13, dt, NormOrder::kLlama};
      mm.method = Method::kMiniMaxFused;
      run_case(mm, 8);
    }
  }
}

// Rows that allow 16-byte vectors, under every forced width (16, 8, 4, 1) and vectors-per-thread
// count: each instantiation of the 8- and 4-byte tables runs at least once per dtype (f32 has
// no 4-byte vectors and takes the scalar path under 4). A forced count
// that would need more than 1024 threads a row is refused by name, before anything is written.
TEST(VectorWidths, EveryCapAndForcedCountOnWideRows) {
  REQUIRE_GPU();
  int ran = 0, refused = 0;
  for (DType dt : {DType::kBF16, DType::kF16, DType::kF32, DType::kF8E4M3}) {
    for (int world : {1, 2, 8}) {
      for (int cap : {0, 16, 8, 4, 1}) {
        for (int vpt : {0, 1, 2, 4, 8}) {
          for (NormOrder order : {NormOrder::kOlmo2, NormOrder::kLlama}) {
            Case c{world, 77, 2048, 512, dt, order};
            c.tuning.vector_bytes = cap;
            c.tuning.vectors_per_thread = vpt;
            const int64_t local_elems = (2048 + 512) / world;
            // Tuned (0): fp8 alone takes 8-byte vectors, the rest 16 (choose_vector_bytes).
            int bytes = cap != 0 ? cap : (dt == DType::kF8E4M3 && world == 1 ? 8 : 16);
            if (bytes == 4 && size_of(dt) == 4) bytes = 1;
            const int64_t vectors =
                bytes == 1 ? local_elems : local_elems / static_cast<int64_t>(bytes / size_of(dt));
            if (bytes > 1 && vpt != 0 && (vectors + vpt - 1) / vpt > 1024) {
              EXPECT_TRUE(throws_error([&] { run_case(c, 16); }, "more than 1024 threads"))
                  << name_of(c);
              ++refused;
              continue;
            }
            run_case(c, 16);
            ++ran;
          }
        }
      }
    }
  }
  // 6 forced counts need more than 1024 threads a row, all at TP 1 and 1 vector a thread: bf16
  // and f16 in 4-byte vectors (1280 of them), f32 in 8-byte ones (1280), in both orders.
  EXPECT_EQ(ran + refused, 4 * 3 * 5 * 5 * 2);
  EXPECT_EQ(refused, 6);
}

// fp8 with peers in launches of 1-64 tokens on rows of more than 1 KB a rank takes 8-byte
// vectors where the rows allow 16 (kFp8FewTokensMax, kFp8FewTokensMinRowBytes; the CPU tests pin
// the choice): OLMo2-13B's widths at TP 2, 4 and 8 (10240 fp8 bytes of Q + K over the ranks) on
// both sides of the token bound, in both orders, and fused QKV rows out of place (768-3072 bytes
// a rank: TP 8 keeps 16-byte vectors).
TEST(VectorWidths, Fp8WithPeersAtFewTokensOnWideRows) {
  REQUIRE_GPU();
  int ran = 0;
  for (int world : {2, 4, 8}) {
    for (int64_t tokens : {int64_t{1}, int64_t{16}, int64_t{64}, int64_t{65}}) {
      for (NormOrder order : {NormOrder::kOlmo2, NormOrder::kLlama}) {
        run_case(Case{world, tokens, 5120, 5120, DType::kF8E4M3, order}, 16);
        ++ran;
      }
    }
    run_case(
        Case{world, 33, 5120, 1024, DType::kF8E4M3, NormOrder::kOlmo2, Layout::kFusedOutOfPlace},
        16);
    ++ran;
  }
  EXPECT_EQ(ran, 3 * (4 * 2 + 1));
}

// The deterministic mode's canonical order is defined on 16-byte vectors: a width below 16 is
// refused by name, and so are rows that allow only 8-byte vectors.
TEST(VectorWidths, DeterministicModeRefusesNarrowerVectors) {
  REQUIRE_GPU();
  LaunchTuning eight;
  eight.vector_bytes = 8;
  EXPECT_TRUE(throws_error(
      [&] {
        CommConfig cfg;
        cfg.timeout_s = wait_s(10.0);
        auto comms = Communicator::create_local_group({0, 0}, cfg);
        Problem p = Problem::random(16, 2048, 512, DType::kBF16, NormOrder::kOlmo2, 1e-6f, 9);
        std::vector<RankData> ranks;
        std::vector<Communicator*> cp;
        std::vector<QkNormParams> pp;
        for (int r = 0; r < 2; ++r) {
          ranks.push_back(make_rank(p, 2, r, Layout::kSeparate));
          ranks.back().params.tuning = eight;
          ranks.back().params.deterministic = true;
          cp.push_back(&comms[r]);
          pp.push_back(ranks.back().params);
        }
        launch_qk_norm_group(cp, pp, nullptr);
      },
      "vector_bytes"));
}

}  // namespace
}  // namespace swiftqk::testing
