// CUDA-graph capture and many replays at varying token counts: the call counter lives on the
// device, so replays must stay correct long after capture.
#include <gtest/gtest.h>

#include <map>
#include <vector>

#include "comm_state.hpp"
#include "problem.hpp"
#include "require_gpu.hpp"

namespace swiftqk::testing {
namespace {

// One graph per token count (as engines capture one per batch size), replayed interleaved,
// with fresh inputs before every replay and an eager call mixed in.
void replay_test(int world, NormOrder order, int replays, Method method = Method::kSwiftQK) {
  const int64_t q_width = 5120, k_width = 1024;
  CommConfig cfg;
  cfg.timeout_s = wait_s(10.0);
  auto comms = Communicator::create_local_group(std::vector<int>(world, 0), cfg);
  std::vector<Communicator*> cp;
  for (auto& c : comms) cp.push_back(&c);
  cudaStream_t s;
  SWIFTQK_CUDA_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));

  const std::vector<int64_t> token_counts = {1, 7, 64, 513};
  std::map<int64_t, Problem> problems;
  std::map<int64_t, std::vector<RankData>> data;
  std::map<int64_t, cudaGraphExec_t> graphs;
  for (int64_t t : token_counts) {
    problems.emplace(t, Problem::random(t, q_width, k_width, DType::kBF16, order, 1e-6f, t));
    auto& ranks = data[t];
    for (int r = 0; r < world; ++r) {
      ranks.push_back(make_rank(problems.at(t), world, r, Layout::kSeparate));
      ranks.back().params.method = method;
    }
    std::vector<QkNormParams> pp;
    for (auto& d : ranks) pp.push_back(d.params);
    graphs[t] = capture_graph(s, [&] { launch_qk_norm_group(cp, pp, s); });
  }
  for (int i = 0; i < replays; ++i) {
    const int64_t t = token_counts[(i * 7 + i / 3) % token_counts.size()];
    Problem& p = problems.at(t);
    auto& ranks = data.at(t);
    p.refill(1000 + i);
    for (int r = 0; r < world; ++r) {
      upload_inputs(p, world, r, ranks[r], s);
      poison(ranks[r], s);
    }
    if (i % 5 == 4) {  // an eager call between replays advances the same device counter
      std::vector<QkNormParams> pp;
      for (auto& d : ranks) pp.push_back(d.params);
      launch_qk_norm_group(cp, pp, s);
    } else {
      SWIFTQK_CUDA_TRY(cudaGraphLaunch(graphs.at(t), s));
    }
    for (auto& c : comms) c.synchronize(s);
    std::vector<RankData*> rp;
    for (auto& d : ranks) rp.push_back(&d);
    const Check chk = check_ranks(p, world, rp);
    ASSERT_EQ(chk.wrong, 0) << "replay " << i << " tokens " << t << ": " << chk.first_error;
    ASSERT_TRUE(chk.rstd_identical) << "replay " << i;
  }
  // Many more replays without checking each, then one checked: no drift of the counters.
  const int64_t t = 64;
  for (int i = 0; i < 2000; ++i) SWIFTQK_CUDA_TRY(cudaGraphLaunch(graphs.at(t), s));
  Problem& p = problems.at(t);
  p.refill(99);
  for (int r = 0; r < world; ++r) {
    upload_inputs(p, world, r, data.at(t)[r], s);
    poison(data.at(t)[r], s);
  }
  SWIFTQK_CUDA_TRY(cudaGraphLaunch(graphs.at(t), s));
  for (auto& c : comms) c.synchronize(s);
  std::vector<RankData*> rp;
  for (auto& d : data.at(t)) rp.push_back(&d);
  EXPECT_EQ(check_ranks(p, world, rp).wrong, 0);
  for (auto& [k, g] : graphs) SWIFTQK_CUDA_TRY(cudaGraphExecDestroy(g));
  SWIFTQK_CUDA_TRY(cudaStreamDestroy(s));
}

TEST(GraphReplay, Tp1Olmo2) {
  REQUIRE_GPU();
  replay_test(1, NormOrder::kOlmo2, 40);
}
TEST(GraphReplay, Tp2Llama) {
  REQUIRE_GPU();
  replay_test(2, NormOrder::kLlama, 60);
}
TEST(GraphReplay, Tp4Olmo2) {
  REQUIRE_GPU();
  replay_test(4, NormOrder::kOlmo2, 60);
}
TEST(GraphReplay, Tp4MiniMaxFused) {
  REQUIRE_GPU();
  replay_test(4, NormOrder::kLlama, 60, Method::kMiniMaxFused);
}
TEST(GraphReplay, Tp8Olmo2) {
  REQUIRE_GPU();
  replay_test(8, NormOrder::kOlmo2, 60);
}

// As PyTorch does it: an eager warm-up on one stream, then capture on another stream in global
// mode. The launch must not query the previous stream's event during capture (that would
// invalidate a global-mode capture).
TEST(GraphReplay, CaptureOnAnotherStreamInGlobalMode) {
  REQUIRE_GPU();
  for (Method method : {Method::kSwiftQK, Method::kMiniMaxFused}) {
    auto comms = Communicator::create_local_group({0, 0});
    std::vector<Communicator*> cp{&comms[0], &comms[1]};
    Problem p = Problem::random(64, 4096, 1024, DType::kBF16, NormOrder::kOlmo2, 1e-6f, 31);
    std::vector<RankData> ranks;
    for (int r = 0; r < 2; ++r) {
      ranks.push_back(make_rank(p, 2, r, Layout::kSeparate));
      ranks.back().params.method = method;
    }
    std::vector<QkNormParams> pp{ranks[0].params, ranks[1].params};
    cudaStream_t warm, cap;
    SWIFTQK_CUDA_TRY(cudaStreamCreateWithFlags(&warm, cudaStreamNonBlocking));
    SWIFTQK_CUDA_TRY(cudaStreamCreateWithFlags(&cap, cudaStreamNonBlocking));
    launch_qk_norm_group(cp, pp, warm);  // eager, left in flight on purpose
    cudaGraphExec_t ge = capture_graph(
        cap, [&] { launch_qk_norm_group(cp, pp, cap); }, cudaStreamCaptureModeGlobal);
    SWIFTQK_CUDA_TRY(cudaStreamSynchronize(warm));
    for (int i = 0; i < 5; ++i) {
      p.refill(60 + i);
      for (int r = 0; r < 2; ++r) {
        upload_inputs(p, 2, r, ranks[r], cap);
        poison(ranks[r], cap);
      }
      SWIFTQK_CUDA_TRY(cudaGraphLaunch(ge, cap));
      for (auto& c : comms) c.synchronize(cap);
      EXPECT_EQ(check_ranks(p, 2, {&ranks[0], &ranks[1]}).wrong, 0)
          << to_string(method) << " replay " << i;
    }
    SWIFTQK_CUDA_TRY(cudaGraphExecDestroy(ge));
    SWIFTQK_CUDA_TRY(cudaStreamDestroy(warm));
    SWIFTQK_CUDA_TRY(cudaStreamDestroy(cap));
  }
}

}  // namespace
}  // namespace swiftqk::testing

// Soak: a million graph replays with token counts changing every thousand, the call counter
// started just below its 2^30 wrap, and every hundred-thousandth replay checked against the
// reference. (Latency drift is for the benchmark to measure; this checks correctness only.)

namespace swiftqk::testing {
namespace {

TEST(Soak, MillionReplaysAcrossTheCounterWrap) {
  REQUIRE_GPU();
  const int world = 4;
  auto comms = Communicator::create_local_group(std::vector<int>(world, 0));
  std::vector<Communicator*> cp;
  for (auto& c : comms) {
    cp.push_back(&c);
    const uint32_t near_wrap = 0x3fffff00u;  // wraps after 256 calls
    SWIFTQK_CUDA_TRY(
        cudaMemcpy(&c.state().d_state->call, &near_wrap, sizeof near_wrap, cudaMemcpyHostToDevice));
  }
  cudaStream_t s;
  SWIFTQK_CUDA_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const std::vector<int64_t> token_counts = {1, 5, 64};
  std::vector<Problem> problems;
  std::vector<std::vector<RankData>> data(token_counts.size());
  std::vector<cudaGraphExec_t> graphs(token_counts.size());
  for (std::size_t i = 0; i < token_counts.size(); ++i) {
    problems.push_back(Problem::random(token_counts[i], 2048, 512, DType::kBF16, NormOrder::kOlmo2,
                                       1e-6f, 90 + i));
    std::vector<QkNormParams> pp;
    for (int r = 0; r < world; ++r) {
      data[i].push_back(make_rank(problems[i], world, r, Layout::kSeparate));
      pp.push_back(data[i].back().params);
    }
    graphs[i] = capture_graph(s, [&] { launch_qk_norm_group(cp, pp, s); });
  }
  const int total = 1'000'000, per_switch = 1000, check_every = 100'000;
  for (int n = 0; n < total; n += per_switch) {
    const std::size_t i = (n / per_switch) % graphs.size();
    for (int j = 0; j < per_switch; ++j) SWIFTQK_CUDA_TRY(cudaGraphLaunch(graphs[i], s));
    if ((n + per_switch) % check_every == 0) {
      problems[i].refill(n);
      for (int r = 0; r < world; ++r) {
        upload_inputs(problems[i], world, r, data[i][r], s);
        poison(data[i][r], s);
      }
      SWIFTQK_CUDA_TRY(cudaGraphLaunch(graphs[i], s));
      for (auto& c : comms) c.synchronize(s);
      std::vector<RankData*> rp;
      for (auto& d : data[i]) rp.push_back(&d);
      const Check chk = check_ranks(problems[i], world, rp);
      ASSERT_EQ(chk.wrong, 0) << "after " << n + per_switch << " replays: " << chk.first_error;
      ASSERT_TRUE(chk.rstd_identical);
    }
  }
  for (auto g : graphs) SWIFTQK_CUDA_TRY(cudaGraphExecDestroy(g));
  SWIFTQK_CUDA_TRY(cudaStreamDestroy(s));
}

}  // namespace
}  // namespace swiftqk::testing
