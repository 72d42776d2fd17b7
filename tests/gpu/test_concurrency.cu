// The persistent kernel next to another kernel that holds most SMs (as a long GEMM on another
// stream would): with CommConfig.sm_budget leaving those SMs alone, a group launch completes
// while the other kernel is still running.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "problem.hpp"

namespace swiftqk::testing {
namespace {

// Holds one SM per block (its shared memory makes the block exclusive) for `ns` nanoseconds.
__global__ void hog_kernel(uint64_t ns) {
  extern __shared__ char smem[];
  uint64_t start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    if (threadIdx.x == 0) smem[0] = static_cast<char>(now);
  } while (now - start < ns);
}

TEST(Concurrency, SmBudgetLetsTheKernelRunBesideAHog) {
  if (!has_gpu()) GTEST_SKIP() << "no CUDA GPU on this machine: GPU test skipped";
  int sms = 0, smem = 0;
  SWIFTQK_CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  SWIFTQK_CUDA_TRY(cudaDeviceGetAttribute(&smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0));
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
  SWIFTQK_CUDA_TRY(
      cudaFuncSetAttribute(hog_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  cudaStream_t hog_stream, s;
  SWIFTQK_CUDA_TRY(cudaStreamCreateWithFlags(&hog_stream, cudaStreamNonBlocking));
  SWIFTQK_CUDA_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaEvent_t hog_done, ours_done;
  SWIFTQK_CUDA_TRY(cudaEventCreate(&hog_done));
  SWIFTQK_CUDA_TRY(cudaEventCreate(&ours_done));
  hog_kernel<<<sms - free_sms, 32, smem, hog_stream>>>(uint64_t{2'000'000'000});  // 2 s
  SWIFTQK_CUDA_TRY(cudaGetLastError());
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

}  // namespace
}  // namespace swiftqk::testing
