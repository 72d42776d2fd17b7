// The persistent kernel next to another kernel that holds most SMs (as a long GEMM on another
// stream would): with CommConfig.sm_budget leaving those SMs alone, a group launch completes
// while the other kernel is still running; without it, the launch completes or fails loudly
// within its timeout (NaN outputs and an error), never hangs and never goes silently wrong.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <thread>

#include "problem.hpp"
#include "require_gpu.hpp"
#include "sm_hog.hpp"

namespace swiftqk::testing {
namespace {

TEST(Concurrency, SmBudgetLetsTheKernelRunBesideAHog) {
  REQUIRE_GPU();
  int sms = 0;
  SWIFTQK_CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const int free_sms = 12;
  CommConfig cfg;
  cfg.sm_budget = free_sms / 2;  // head-room: the budget is a count, blocks land anywhere free
  cfg.timeout_s = 10.0;
  auto comms = Communicator::create_local_group({0, 0, 0, 0}, cfg);
  std::vector<Communicator*> cp;
  for (auto& c : comms) cp.push_back(&c);
  Problem p = Problem::random(512, 4096, 1024, DType::kBF16, NormOrder::kOlmo2, 1e-6f, 21);
  std::vector<RankData> ranks;
  std::vector<QkNormParams> pp;
  for (int r = 0; r < 4; ++r) {
    ranks.push_back(make_rank(p, 4, r, Layout::kSeparate));
    poison(ranks.back(), nullptr);
    pp.push_back(ranks.back().params);
  }
  cudaStream_t hog_stream, s;
  SWIFTQK_CUDA_TRY(cudaStreamCreateWithFlags(&hog_stream, cudaStreamNonBlocking));
  SWIFTQK_CUDA_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaEvent_t hog_done, ours_done;
  SWIFTQK_CUDA_TRY(cudaEventCreate(&hog_done));
  SWIFTQK_CUDA_TRY(cudaEventCreate(&ours_done));
  launch_sm_hog(sms - free_sms, uint64_t{2'000'000'000}, hog_stream);  // 2 s
  SWIFTQK_CUDA_TRY(cudaEventRecord(hog_done, hog_stream));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the hog is resident first
  launch_qk_norm_group(cp, pp, s);
  SWIFTQK_CUDA_TRY(cudaEventRecord(ours_done, s));
  SWIFTQK_CUDA_TRY(cudaEventSynchronize(ours_done));
  EXPECT_EQ(cudaEventQuery(hog_done), cudaErrorNotReady)
      << "the QK norm only finished after the hog: it did not run beside it";
  for (auto& c : comms) c.check_error();
  SWIFTQK_CUDA_TRY(cudaEventSynchronize(hog_done));
  std::vector<RankData*> rp;
  for (auto& d : ranks) rp.push_back(&d);
  EXPECT_EQ(check_ranks(p, 4, rp).wrong, 0);
  SWIFTQK_CUDA_TRY(cudaStreamDestroy(hog_stream));
  SWIFTQK_CUDA_TRY(cudaStreamDestroy(s));
  SWIFTQK_CUDA_TRY(cudaEventDestroy(hog_done));
  SWIFTQK_CUDA_TRY(cudaEventDestroy(ours_done));
}

// Half the SMs held for 1.5 s, and a group launch that counts on all of them (no budget): the
// blocks that are resident wait for peers' blocks that are not, so the call fails loudly after
// its timeout (0.2 s), long before the hog ends, or, if every block waited to be scheduled,
// completes correctly after it. Either way no element is finite and wrong.
TEST(Concurrency, WithoutABudgetAHogMakesTheCallFailLoudlyNotWrong) {
  REQUIRE_GPU();
  int sms = 0;
  SWIFTQK_CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  CommConfig cfg;
  cfg.timeout_s = 0.2;
  auto comms = Communicator::create_local_group({0, 0}, cfg);
  std::vector<Communicator*> cp{&comms[0], &comms[1]};
  Problem p = Problem::random(8192, 2048, 2048, DType::kBF16, NormOrder::kLlama, 1e-5f, 22);
  RankData r0 = make_rank(p, 2, 0, Layout::kSeparate), r1 = make_rank(p, 2, 1, Layout::kSeparate);
  poison(r0, nullptr);
  poison(r1, nullptr);
  cudaStream_t hog_stream, s;
  SWIFTQK_CUDA_TRY(cudaStreamCreateWithFlags(&hog_stream, cudaStreamNonBlocking));
  SWIFTQK_CUDA_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  SWIFTQK_CUDA_TRY(cudaDeviceSynchronize());
  const auto start = std::chrono::steady_clock::now();
  launch_sm_hog(sms / 2, uint64_t{1'500'000'000}, hog_stream);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  launch_qk_norm_group(cp, {r0.params, r1.params}, s);
  EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  SWIFTQK_CUDA_TRY(cudaStreamSynchronize(hog_stream));
  const Census c0 = census_rank(p, 2, 0, r0), c1 = census_rank(p, 2, 1, r1);
  EXPECT_EQ(c0.wrong + c1.wrong, 0) << "a silently wrong output";
  const bool failed = comms[0].failure().code != 0 || comms[1].failure().code != 0;
  EXPECT_EQ(c0.nan + c1.nan > 0, failed) << "NaN without an error, or an error without NaN";
  if (failed) {
    EXPECT_LT(secs, 1.4) << "the failure surfaced only after the hog had ended";
    EXPECT_THROW(comms[0].check_error(), Error);
    EXPECT_THROW(comms[1].check_error(), Error);
  } else {
    EXPECT_TRUE(c0.all_correct() && c1.all_correct());
  }
  std::printf("[ outcome  ] %s after %.2f s\n", failed ? "failed loudly" : "completed", secs);
  SWIFTQK_CUDA_TRY(cudaStreamDestroy(hog_stream));
  SWIFTQK_CUDA_TRY(cudaStreamDestroy(s));
}

}  // namespace
}  // namespace swiftqk::testing
