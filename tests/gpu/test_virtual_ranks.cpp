// N virtual ranks on one GPU against the float64 reference: model shapes, odd shapes, token
// counts from 0 to beyond the workspace, dtypes, norm orders, layouts, both launch styles.
#include <gtest/gtest.h>

#include <cstdio>
#include <ostream>
#include <string>
#include <vector>

#include "problem.hpp"
#include "require_gpu.hpp"

namespace swiftqk::testing {
namespace {

enum class Launch { kGroup, kPerRankStreams };

struct Case {
  int world;
  int64_t tokens, q_width, k_width;
  DType in;
  NormOrder order;
  Layout layout = Layout::kSeparate;
  Launch launch = Launch::kGroup;
  int64_t capacity = 16384;
  float eps = 1e-6f;
  Method method = Method::kSwiftQK;
  int sm_budget = 0;  // 0: all SMs (kPerRankStreams splits them)
};

// eps as a name may spell it: 1e-05 reads 1em05 (gtest names are letters, digits and '_').
std::string eps_name(float eps) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", static_cast<double>(eps));
  std::string s = buf;
  for (char& ch : s) {
    if (ch == '-') ch = 'm';
    if (ch == '.') ch = 'p';
    if (ch == '+') ch = 'p';
  }
  return s;
}

// Every field that tells two cases apart; optional ones (method, SM budget, workspace, eps) only
// where they differ from the default.
std::string name_of(const Case& c) {
  const char* layout = c.layout == Layout::kSeparate       ? "separate"
                       : c.layout == Layout::kFusedInPlace ? "fused_in_place"
                                                           : "fused_out_of_place";
  return "tp" + std::to_string(c.world) + "_t" + std::to_string(c.tokens) + "_q" +
         std::to_string(c.q_width) + "_k" + std::to_string(c.k_width) + "_" + to_string(c.in) +
         "_" + to_string(c.order) + "_" + layout +
         (c.launch == Launch::kGroup ? "_group" : "_streams") +
         (c.method == Method::kSwiftQK ? "" : "_" + to_string(c.method)) +
         (c.sm_budget == 0 ? "" : "_sms" + std::to_string(c.sm_budget)) +
         (c.capacity == 16384 ? "" : "_cap" + std::to_string(c.capacity)) +
         (c.eps == 1e-6f ? "" : "_eps" + eps_name(c.eps));
}

// gtest prints a parameter in the test's listing and in failures: the readable name, not bytes.
void PrintTo(const Case& c, std::ostream* os) { *os << name_of(c); }

// Runs `calls` consecutive calls with fresh inputs each, checking every one.
void run_case(const Case& c, int calls = 2) {
  CommConfig cfg;
  cfg.token_capacity = c.capacity;
  cfg.timeout_s = wait_s(10.0);
  if (c.launch == Launch::kPerRankStreams) {
    // Separate concurrent launches must all be resident at once: split the SMs between them.
    int sms = 0;
    SWIFTQK_CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    cfg.sm_budget = std::max(1, sms / c.world);
  }
  if (c.sm_budget > 0) cfg.sm_budget = c.sm_budget;
  auto comms = Communicator::create_local_group(std::vector<int>(c.world, 0), cfg);
  Problem p = Problem::random(c.tokens, c.q_width, c.k_width, c.in, c.order, c.eps, 1234);
  std::vector<RankData> ranks;
  for (int r = 0; r < c.world; ++r) {
    ranks.push_back(make_rank(p, c.world, r, c.layout));
    ranks.back().params.method = c.method;
  }
  std::vector<cudaStream_t> streams(c.world);
  for (auto& s : streams) SWIFTQK_CUDA_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));

  for (int call = 0; call < calls; ++call) {
    p.refill(77 + call);
    for (int r = 0; r < c.world; ++r) {
      upload_inputs(p, c.world, r, ranks[r], nullptr);
      poison(ranks[r], nullptr);
    }
    SWIFTQK_CUDA_TRY(cudaDeviceSynchronize());
    if (c.launch == Launch::kGroup) {
      std::vector<Communicator*> cp;
      std::vector<QkNormParams> pp;
      for (int r = 0; r < c.world; ++r) {
        cp.push_back(&comms[r]);
        pp.push_back(ranks[r].params);
      }
      launch_qk_norm_group(cp, pp, streams[0]);
    } else {
      for (int r = 0; r < c.world; ++r) launch_qk_norm(comms[r], ranks[r].params, streams[r]);
    }
    for (int r = 0; r < c.world; ++r) comms[r].synchronize(streams[r]);
    std::vector<RankData*> rp;
    for (auto& d : ranks) rp.push_back(&d);
    const Check chk = check_ranks(p, c.world, rp);
    EXPECT_EQ(chk.wrong, 0) << name_of(c) << " call " << call << ": " << chk.first_error;
    EXPECT_TRUE(chk.rstd_identical) << name_of(c) << ": ranks used different scales";
  }
  for (auto& s : streams) SWIFTQK_CUDA_TRY(cudaStreamDestroy(s));
}

class ModelShapes : public ::testing::TestWithParam<Case> {};

TEST_P(ModelShapes, MatchesFloat64Reference) {
  REQUIRE_GPU();
  run_case(GetParam());
}

std::vector<Case> model_cases() {
  // DESIGN.md section 2: OLMoE, OLMo2-7B/Olmo3-7B, OLMo2-13B, OLMo3-32B, MiniMax-M2.
  const std::vector<std::pair<int64_t, int64_t>> shapes = {
      {2048, 2048}, {4096, 4096}, {5120, 5120}, {5120, 1024}, {6144, 1024}};
  std::vector<Case> v;
  for (auto [q, k] : shapes) {
    for (int world : {1, 2, 4, 8}) {
      if (k % world != 0) continue;
      for (int64_t t : {1, 64, 333}) {
        for (NormOrder o : {NormOrder::kOlmo2, NormOrder::kLlama}) {
          v.push_back({world, t, q, k, DType::kBF16, o});
        }
      }
    }
  }
  return v;
}
INSTANTIATE_TEST_SUITE_P(Design, ModelShapes, ::testing::ValuesIn(model_cases()),
                         [](const auto& info) { return name_of(info.param); });

std::vector<Case> odd_cases() {
  std::vector<Case> v;
  for (DType dt : {DType::kF16, DType::kF32, DType::kF8E4M3}) {
    for (int world : {1, 2, 8}) v.push_back({world, 100, 4096, 1024, dt, NormOrder::kOlmo2});
    v.push_back({4, 50, 5120, 1024, dt, NormOrder::kLlama});
  }
  // Token counts: none, one, many, and more than the workspace holds (chunked launches).
  v.push_back({2, 0, 4096, 4096, DType::kBF16, NormOrder::kOlmo2});
  v.push_back({4, 16500, 2048, 2048, DType::kBF16, NormOrder::kOlmo2});
  // Rows of 512 elements at TP 8 (choose_slot_layout): 16500 tokens are a launch of 16384 with
  // source-major slots, then one of 116 with token-major ones; fp8 rows of 32 vectors.
  v.push_back({8, 16500, 2048, 2048, DType::kBF16, NormOrder::kOlmo2});
  v.push_back({8, 300, 2048, 2048, DType::kF8E4M3, NormOrder::kLlama});
  v.push_back({2, 5000, 1024, 512, DType::kBF16, NormOrder::kLlama, Layout::kSeparate,
               Launch::kGroup, 1024});
  // Widths that are not powers of two, nor multiples of the 16-byte vector: 500 + 100 bf16 in
  // 8-byte vectors, the rest on the scalar path.
  v.push_back({2, 37, 1000, 200, DType::kBF16, NormOrder::kOlmo2});
  v.push_back({4, 37, 4100, 12, DType::kF32, NormOrder::kLlama});
  v.push_back({3, 21, 3 * 129, 3 * 7, DType::kF16, NormOrder::kOlmo2});
  v.push_back({1, 9, 40000, 1000, DType::kBF16, NormOrder::kOlmo2});  // streaming path
  // Streamed rows alone in 16-byte vectors of every 16- and 32-bit dtype (past the 64 KB staged
  // alone), whose vector counts leave a ragged last batch; in place too.
  v.push_back({1, 37, 11648, 7840, DType::kF32, NormOrder::kLlama});
  v.push_back({1, 13, 16384, 4100, DType::kF32, NormOrder::kOlmo2, Layout::kFusedInPlace});
  v.push_back({1, 21, 30000, 6008, DType::kF16, NormOrder::kOlmo2});
  // Rows of about 270 8- or 4-byte vectors with peers, in launches of 4096 tokens or more: 8
  // vectors a thread (kNarrowEightMaxVectors), 64-thread groups.
  v.push_back({8, 4100, 3280, 1040, DType::kBF16, NormOrder::kOlmo2});    // 4-byte vectors
  v.push_back({4, 4100, 3296, 5312, DType::kF8E4M3, NormOrder::kLlama});  // 8-byte vectors
  v.push_back({8, 4096, 3296, 5312, DType::kF8E4M3, NormOrder::kOlmo2});  // 4-byte vectors
  // 16-bit rows of 1281-1664 vectors alone in launches of 4096 tokens or more: 2 vectors a
  // thread (kAloneHalfVectorsMinGroup..MaxGroup); in place too.
  v.push_back({1, 4100, 7376, 4768, DType::kF16, NormOrder::kOlmo2});
  v.push_back({1, 4096, 5632, 5632, DType::kBF16, NormOrder::kLlama, Layout::kFusedInPlace});
  // Rows of 32-64 KB alone: staged in one group of up to 1024 threads a block
  // (staged_row_bytes_limit), in place too; with peers each rank's half row is staged as usual.
  v.push_back({1, 300, 16192, 15296, DType::kBF16, NormOrder::kOlmo2});
  v.push_back({1, 4100, 8512, 15584, DType::kF16, NormOrder::kLlama});
  v.push_back({1, 77, 8000, 6000, DType::kF32, NormOrder::kOlmo2});
  v.push_back({1, 9, 16192, 15296, DType::kBF16, NormOrder::kLlama, Layout::kFusedInPlace});
  v.push_back({2, 300, 16192, 15296, DType::kBF16, NormOrder::kOlmo2});
  v.push_back({2, 9, 131072, 2048, DType::kBF16, NormOrder::kLlama});
  // Views into a fused QKV projection output, in place and out of place.
  v.push_back({2, 64, 5120, 1024, DType::kBF16, NormOrder::kOlmo2, Layout::kFusedInPlace});
  v.push_back({8, 64, 6144, 1024, DType::kBF16, NormOrder::kLlama, Layout::kFusedOutOfPlace});
  v.push_back({4, 33, 2048, 2048, DType::kF32, NormOrder::kOlmo2, Layout::kFusedInPlace});
  // Each rank its own launch on its own stream (as separate processes would be).
  for (int world : {2, 4, 8}) {
    v.push_back({world, 300, 4096, 4096, DType::kBF16, NormOrder::kOlmo2, Layout::kSeparate,
                 Launch::kPerRankStreams});
  }
  v.push_back({4, 64, 2048, 2048, DType::kBF16, NormOrder::kOlmo2, Layout::kSeparate,
               Launch::kGroup, 16384, 1e-5f});
  return v;
}
INSTANTIATE_TEST_SUITE_P(Odd, ModelShapes, ::testing::ValuesIn(odd_cases()),
                         [](const auto& info) { return name_of(info.param); });

// The MiniMax-fused baseline (Lamport exchange) on the same shapes, and over more consecutive
// calls than its three buffers, with token counts that shrink and grow (the clearing of the
// previous call's buffer must cover what that call wrote).
std::vector<Case> minimax_cases() {
  std::vector<Case> v;
  for (auto [q, k] : std::vector<std::pair<int64_t, int64_t>>{
           {2048, 2048}, {4096, 4096}, {5120, 5120}, {5120, 1024}, {6144, 1024}}) {
    for (int world : {1, 2, 4, 8}) {
      for (int64_t t : {1, 333}) {
        Case c{world, t, q, k, DType::kBF16, NormOrder::kLlama};
        c.method = Method::kMiniMaxFused;
        v.push_back(c);
      }
    }
  }
  Case big{4, 16500, 2048, 2048, DType::kBF16, NormOrder::kOlmo2};
  big.method = Method::kMiniMaxFused;
  v.push_back(big);
  Case streams{4,
               300,
               4096,
               4096,
               DType::kBF16,
               NormOrder::kOlmo2,
               Layout::kSeparate,
               Launch::kPerRankStreams};
  streams.method = Method::kMiniMaxFused;
  v.push_back(streams);
  return v;
}
// A grid of one or two SMs: every block walks many tokens, so the deferred schedule, the stage
// ring's wrap-around and the parity buffers are exercised for dozens of iterations (and cheaply
// enough for compute-sanitizer's racecheck, which serialises shared-memory accesses).
std::vector<Case> few_block_cases() {
  std::vector<Case> v;
  for (int world : {1, 2, 4}) {
    for (NormOrder o : {NormOrder::kOlmo2, NormOrder::kLlama}) {
      Case c{world, 211, 2048, 512, DType::kBF16, o};
      c.sm_budget = world == 4 ? 2 : 1;
      v.push_back(c);
    }
  }
  Case mm{2, 211, 2048, 512, DType::kBF16, NormOrder::kOlmo2};
  mm.method = Method::kMiniMaxFused;
  mm.sm_budget = 1;
  v.push_back(mm);
  // Rows of 64 vectors (OLMoE at TP 8; 1024/1024 at TP 4) on a grid residency caps: the launch
  // packs them 2 to a warp (packed_kernel_shape), so 16-lane groups exchange and sum; at TP 8
  // from 256 tokens over source-major slots (choose_slot_layout), below over token-major ones.
  for (NormOrder o : {NormOrder::kOlmo2, NormOrder::kLlama}) {
    Case c{8, o == NormOrder::kOlmo2 ? 300 : 211, 2048, 2048, DType::kBF16, o};
    c.sm_budget = 4;
    v.push_back(c);
  }
  // Under a budget of 2 SMs the packed blocks (2 an SM) would leave 4 ranks without one: the
  // launch keeps the unpacked layout (4 an SM, one block a rank).
  Case tight{8, 211, 2048, 2048, DType::kBF16, NormOrder::kOlmo2};
  tight.sm_budget = 2;
  v.push_back(tight);
  Case packed4{4, 211, 1024, 1024, DType::kBF16, NormOrder::kLlama};
  packed4.sm_budget = 2;
  v.push_back(packed4);
  Case packed_mm{8, 211, 2048, 2048, DType::kBF16, NormOrder::kLlama};
  packed_mm.method = Method::kMiniMaxFused;
  packed_mm.sm_budget = 4;
  v.push_back(packed_mm);
  return v;
}
INSTANTIATE_TEST_SUITE_P(FewBlocks, ModelShapes, ::testing::ValuesIn(few_block_cases()),
                         [](const auto& info) { return name_of(info.param); });

INSTANTIATE_TEST_SUITE_P(MiniMaxFused, ModelShapes, ::testing::ValuesIn(minimax_cases()),
                         [](const auto& info) { return name_of(info.param); });

TEST(MiniMaxFused, TokenCountsShrinkAndGrowOverManyCalls) {
  REQUIRE_GPU();
  for (int world : {2, 8}) {
    auto comms = Communicator::create_local_group(std::vector<int>(world, 0));
    std::vector<Communicator*> cp;
    for (auto& c : comms) cp.push_back(&c);
    for (int call = 0; call < 12; ++call) {
      const int64_t t = (call % 3 == 0) ? 900 : (call % 3 == 1 ? 3 : 77);
      Problem p = Problem::random(t, 4096, 1024, DType::kBF16, NormOrder::kOlmo2, 1e-6f, call);
      std::vector<RankData> ranks;
      std::vector<QkNormParams> pp;
      for (int r = 0; r < world; ++r) {
        ranks.push_back(make_rank(p, world, r, Layout::kSeparate));
        ranks.back().params.method = call % 4 == 3 ? Method::kSwiftQK : Method::kMiniMaxFused;
        poison(ranks.back(), nullptr);
        pp.push_back(ranks.back().params);
      }
      launch_qk_norm_group(cp, pp, nullptr);
      for (auto& c : comms) c.synchronize(nullptr);
      std::vector<RankData*> rp;
      for (auto& d : ranks) rp.push_back(&d);
      const Check chk = check_ranks(p, world, rp);
      ASSERT_EQ(chk.wrong, 0) << "TP " << world << " call " << call << ": " << chk.first_error;
      ASSERT_TRUE(chk.rstd_identical);
    }
  }
}

}  // namespace
}  // namespace swiftqk::testing
