// Bounded waits and misuse: a missing peer fails within the timeout with a clear error naming
// it, leaves NaN in every output, and the group recovers after reset(); a second stream is
// refused; bad input writes nothing.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "expect_error.hpp"
#include "problem.hpp"
#include "require_gpu.hpp"

namespace swiftqk::testing {
namespace {

TEST(Faults, MissingPeerTimesOutNamingIt) {
  REQUIRE_GPU();
  CommConfig cfg;
  cfg.timeout_s = 0.2;
  auto comms = Communicator::create_local_group({0, 0}, cfg);
  Problem p = Problem::random(64, 4096, 1024, DType::kBF16, NormOrder::kOlmo2, 1e-6f, 5);
  RankData r0 = make_rank(p, 2, 0, Layout::kSeparate);
  RankData r1 = make_rank(p, 2, 1, Layout::kSeparate);
  poison(r0, nullptr);
  const auto start = std::chrono::steady_clock::now();
  launch_qk_norm(comms[0], r0.params, nullptr);  // rank 1 never calls
  // A call whose peer never came fails, naming both ranks.
  expect_error([&] { comms[0].synchronize(nullptr); }, {"waiting for rank 1", "rank 0 timed out"});
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(secs, 5.0) << "the timeout of 0.2 s took " << secs << " s to surface";
  EXPECT_TRUE(census_rank(p, 2, 0, r0).all_nan()) << "a failed call left a plausible output";
  // Further launches are refused until reset.
  EXPECT_THROW(launch_qk_norm(comms[0], r0.params, nullptr), Error);
  for (auto& c : comms) c.reset();
  std::vector<Communicator*> cp{&comms[0], &comms[1]};
  launch_qk_norm_group(cp, {r0.params, r1.params}, nullptr);
  for (auto& c : comms) c.synchronize(nullptr);
  EXPECT_EQ(check_ranks(p, 2, {&r0, &r1}).wrong, 0);
}

// Ranks 0 and 1 called with problems a and b that disagree, each on its own stream: both calls
// fail, and both ranks' outputs are NaN.
void expect_mismatch_detected(const Problem& a, const Problem& b) {
  CommConfig cfg;
  cfg.timeout_s = 0.2;
  auto comms = Communicator::create_local_group({0, 0}, cfg);
  RankData r0 = make_rank(a, 2, 0, Layout::kSeparate);
  RankData r1 = make_rank(b, 2, 1, Layout::kSeparate);
  poison(r0, nullptr);
  poison(r1, nullptr);
  SWIFTQK_CUDA_TRY(cudaDeviceSynchronize());
  cudaStream_t s0, s1;
  SWIFTQK_CUDA_TRY(cudaStreamCreateWithFlags(&s0, cudaStreamNonBlocking));
  SWIFTQK_CUDA_TRY(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
  launch_qk_norm(comms[0], r0.params, s0);
  launch_qk_norm(comms[1], r1.params, s1);
  EXPECT_THROW(comms[0].synchronize(s0), Error);
  EXPECT_THROW(comms[1].synchronize(s1), Error);
  EXPECT_TRUE(census_rank(a, 2, 0, r0).all_nan());
  EXPECT_TRUE(census_rank(b, 2, 1, r1).all_nan());
  SWIFTQK_CUDA_TRY(cudaStreamDestroy(s0));
  SWIFTQK_CUDA_TRY(cudaStreamDestroy(s1));
}

TEST(Faults, PeerWithOtherWidthsIsDetected) {
  REQUIRE_GPU();
  expect_mismatch_detected(
      Problem::random(16, 4096, 1024, DType::kBF16, NormOrder::kOlmo2, 1e-6f, 6),
      Problem::random(16, 4096, 2048, DType::kBF16, NormOrder::kOlmo2, 1e-6f, 7));
}

// The chunk's token count is hashed into the k tags: ranks called with 40 and 24 tokens both
// fail with NaN outputs (the rank with 24 must not take the other's first partials).
TEST(Faults, PeerWithOtherTokenCountIsDetected) {
  REQUIRE_GPU();
  expect_mismatch_detected(
      Problem::random(40, 4096, 1024, DType::kBF16, NormOrder::kOlmo2, 1e-6f, 10),
      Problem::random(24, 4096, 1024, DType::kBF16, NormOrder::kOlmo2, 1e-6f, 11));
}

TEST(Faults, SecondStreamWhileInFlightIsRefused) {
  REQUIRE_GPU();
  CommConfig cfg;
  cfg.timeout_s = 1.0;
  auto comms = Communicator::create_local_group({0, 0}, cfg);
  Problem p = Problem::random(8, 2048, 2048, DType::kBF16, NormOrder::kOlmo2, 1e-6f, 8);
  RankData r0 = make_rank(p, 2, 0, Layout::kSeparate);
  cudaStream_t a, b;
  SWIFTQK_CUDA_TRY(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
  SWIFTQK_CUDA_TRY(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
  launch_qk_norm(comms[0], r0.params, a);  // spins: rank 1 is absent
  // A second stream is refused while a call is in flight.
  expect_error([&] { launch_qk_norm(comms[0], r0.params, b); }, "still in flight");
  EXPECT_THROW(comms[0].synchronize(a), Error);  // the first call times out
  SWIFTQK_CUDA_TRY(cudaStreamDestroy(a));
  SWIFTQK_CUDA_TRY(cudaStreamDestroy(b));
}

TEST(Faults, BadInputWritesNothing) {
  REQUIRE_GPU();
  auto comms = Communicator::create_local_group({0, 0});
  Problem p = Problem::random(8, 2048, 2048, DType::kBF16, NormOrder::kOlmo2, 1e-6f, 9);
  RankData r0 = make_rank(p, 2, 0, Layout::kSeparate);
  RankData r1 = make_rank(p, 2, 1, Layout::kSeparate);
  poison(r0, nullptr);
  poison(r1, nullptr);
  std::vector<Communicator*> cp{&comms[0], &comms[1]};
  QkNormParams bad = r1.params;
  bad.eps = -1.f;
  EXPECT_THROW(launch_qk_norm_group(cp, {r0.params, bad}, nullptr), Error);
  bad = r1.params;
  bad.tokens = 9;  // disagrees with rank 0
  EXPECT_THROW(launch_qk_norm_group(cp, {r0.params, bad}, nullptr), Error);
  // The same rank twice, and ranks of two different groups, in one launch.
  EXPECT_THROW(launch_qk_norm_group({&comms[0], &comms[0]}, {r0.params, r1.params}, nullptr),
               Error);
  auto other = Communicator::create_local_group({0, 0});
  EXPECT_THROW(launch_qk_norm_group({&comms[0], &other[1]}, {r0.params, r1.params}, nullptr),
               Error);
  CommConfig fixed;
  fixed.token_capacity = 4;
  fixed.chunk_oversize = false;
  auto small = Communicator::create_local_group({0, 0}, fixed);
  std::vector<Communicator*> sp{&small[0], &small[1]};
  // 8 tokens are refused by a 4-token workspace that does not chunk.
  const std::vector<QkNormParams> both = {r0.params, r1.params};
  expect_error([&] { launch_qk_norm_group(sp, both, nullptr); }, "exceed the workspace");
  SWIFTQK_CUDA_TRY(cudaDeviceSynchronize());
  EXPECT_TRUE(outputs_untouched(p, 2, r0));
  EXPECT_TRUE(outputs_untouched(p, 2, r1));
}

TEST(Faults, ProbeFindsLocalPeers) {
  REQUIRE_GPU();
  auto comms = Communicator::create_local_group({0, 0, 0, 0});
  // The probe is collective: run every rank's probe concurrently on its own stream.
  std::vector<cudaStream_t> s(4);
  for (auto& x : s) SWIFTQK_CUDA_TRY(cudaStreamCreateWithFlags(&x, cudaStreamNonBlocking));
  std::vector<std::thread> threads;
  std::vector<int> ok(4, 0);
  for (int r = 0; r < 4; ++r) {
    threads.emplace_back([&, r] { ok[r] = comms[r].probe_peers(s[r]) ? 1 : 0; });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < 4; ++r) EXPECT_EQ(ok[r], 1) << "rank " << r;
  for (auto& x : s) SWIFTQK_CUDA_TRY(cudaStreamDestroy(x));
}

}  // namespace
}  // namespace swiftqk::testing
