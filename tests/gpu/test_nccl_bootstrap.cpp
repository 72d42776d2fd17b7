// Communicator::from_nccl and the NCCL baselines. One GPU allows an NCCL group of one (NCCL
// refuses two ranks on one GPU); larger groups run under the multi-GPU issue.
#include <gtest/gtest.h>
#include <nccl.h>

#include <string>
#include <vector>

#include "comm_state.hpp"
#include "expect_error.hpp"
#include "nccl_allreduce_fallback.hpp"
#include "problem.hpp"
#include "protocol.hpp"
#include "require_gpu.hpp"

namespace swiftqk::testing {
namespace {

class NcclGroupOfOne : public ::testing::Test {
 protected:
  void SetUp() override {
    REQUIRE_GPU();
    SWIFTQK_CUDA_TRY(cudaSetDevice(0));
    ncclUniqueId id;
    SWIFTQK_NCCL_TRY(ncclGetUniqueId(&id));
    SWIFTQK_NCCL_TRY(ncclCommInitRank(&nccl_, 1, id, 0));
    SWIFTQK_CUDA_TRY(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }
  void TearDown() override {
    if (nccl_ != nullptr) ncclCommDestroy(nccl_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }
  ncclComm_t nccl_ = nullptr;
  cudaStream_t stream_ = nullptr;
};

TEST_F(NcclGroupOfOne, FromNcclRunsEveryMethod) {
  Communicator comm = Communicator::from_nccl(nccl_, CommConfig{}, stream_);
  EXPECT_EQ(comm.rank(), 0);
  EXPECT_EQ(comm.world_size(), 1);
  for (Method m : {Method::kSwiftQK, Method::kMiniMaxFused, Method::kAllGather,
                   Method::kCommOverlap, Method::kMiniMaxEager}) {
    for (NormOrder o : {NormOrder::kOlmo2, NormOrder::kLlama}) {
      Problem p = Problem::random(100, 2048, 1000, DType::kBF16, o, 1e-5f, 3);
      RankData d = make_rank(p, 1, 0, Layout::kFusedOutOfPlace);
      d.params.method = m;
      poison(d, stream_);
      launch_qk_norm(comm, d.params, stream_);
      comm.synchronize(stream_);
      const Check c = check_ranks(p, 1, {&d});
      EXPECT_EQ(c.wrong, 0) << to_string(m) << " " << to_string(o) << ": " << c.first_error;
    }
  }
}

// Without P2P (forced here through CommConfig::use_p2p, the same path a failed write test
// takes) the fused methods still give correct results, through NCCL, eager and from a graph.
TEST_F(NcclGroupOfOne, WithoutP2PFusedMethodsUseTheNcclPath) {
  CommConfig cfg;
  cfg.use_p2p = false;
  Communicator comm = Communicator::from_nccl(nccl_, cfg, stream_);
  EXPECT_FALSE(comm.p2p());
  for (Method m : {Method::kSwiftQK, Method::kMiniMaxFused}) {
    Problem p = Problem::random(77, 5120, 1024, DType::kBF16, NormOrder::kOlmo2, 1e-6f, 12);
    RankData d = make_rank(p, 1, 0, Layout::kFusedInPlace);
    d.params.method = m;
    launch_qk_norm(comm, d.params, stream_);
    comm.synchronize(stream_);
    EXPECT_EQ(check_ranks(p, 1, {&d}).wrong, 0) << to_string(m) << " eager";
    cudaGraphExec_t ge = capture_graph(
        stream_, [&] { launch_qk_norm(comm, d.params, stream_); }, cudaStreamCaptureModeGlobal);
    p.refill(13);
    upload_inputs(p, 1, 0, d, stream_);
    SWIFTQK_CUDA_TRY(cudaGraphLaunch(ge, stream_));
    comm.synchronize(stream_);
    EXPECT_EQ(check_ranks(p, 1, {&d}).wrong, 0) << to_string(m) << " graph";
    SWIFTQK_CUDA_TRY(cudaGraphExecDestroy(ge));
  }
}

// The fallback's scale kernel reads the abort flag that the watchdog sets before it aborts an
// all-reduce: at 0 it writes the normalised rows, at 1 NaN everywhere (never the stale or
// poisoned bytes, never finite values from sums the aborted all-reduce left half-written).
// White-box: a group of one has no all-reduce to abort, so the flag is set by hand.
TEST_F(NcclGroupOfOne, TheFallbackScaleWritesNaNWhenItsAllReduceWasAborted) {
  CommConfig cfg;
  cfg.use_p2p = false;
  Communicator comm = Communicator::from_nccl(nccl_, cfg, stream_);
  const int64_t tokens = 50, qw = 2048, kw = 1024;
  int* h_flag = nullptr;
  int* d_flag = nullptr;
  float2* sums = nullptr;
  SWIFTQK_CUDA_TRY(
      cudaHostAlloc(reinterpret_cast<void**>(&h_flag), sizeof(int), cudaHostAllocMapped));
  SWIFTQK_CUDA_TRY(cudaHostGetDevicePointer(reinterpret_cast<void**>(&d_flag), h_flag, 0));
  SWIFTQK_CUDA_TRY(cudaMalloc(&sums, tokens * sizeof(float2)));
  for (DType dt : {DType::kBF16, DType::kF8E4M3}) {
    for (int flag : {0, 1, 0}) {
      SCOPED_TRACE(to_string(dt) + ", abort flag " + std::to_string(flag));
      Problem p = Problem::random(tokens, qw, kw, dt, NormOrder::kLlama, 1e-6f, 22 + flag);
      RankData d = make_rank(p, 1, 0, Layout::kSeparate);
      poison(d, stream_);
      *h_flag = flag;
      const detail::RankArgs ra = detail::rank_args_for(comm.state(), d.params, 0);
      detail::launch_partial_sums(dt, ra, tokens, qw, kw, true, sums, stream_);
      detail::launch_apply_scale(dt, ra, tokens, qw, kw, true, NormOrder::kLlama, sums, false,
                                 1.f / qw, 1.f / kw, 1e-6f, stream_, d_flag);
      SWIFTQK_CUDA_TRY(cudaStreamSynchronize(stream_));
      if (flag == 0) {
        const Check c = check_ranks(p, 1, {&d});
        EXPECT_EQ(c.wrong, 0) << c.first_error;
      } else {
        EXPECT_TRUE(census_rank(p, 1, 0, d).all_nan());
      }
    }
  }
  SWIFTQK_CUDA_TRY(cudaFree(sums));
  SWIFTQK_CUDA_TRY(cudaFreeHost(h_flag));
}

// The fallback's per-call check, driven by hand on one GPU: the check floats are set to what an
// all-reduce over two ranks would leave. Ranks that sent the same hash: correct outputs; a rank
// that sent another (other eps, widths, order, dtype or token count): NaN everywhere, code 7,
// and the next check_error raises naming it; reset() clears it.
TEST_F(NcclGroupOfOne, TheFallbackScaleChecksThatEveryRankMadeTheSameCall) {
  CommConfig cfg;
  cfg.use_p2p = false;
  Communicator comm = Communicator::from_nccl(nccl_, cfg, stream_);
  const int64_t tokens = 40, qw = 2048, kw = 1024;
  const uint32_t mine = config_hash(qw, kw, 2, 1e-6f, 0, tokens);
  const uint32_t other = config_hash(qw, kw, 2, 1e-5f, 0, tokens);
  float2* sums = nullptr;
  SWIFTQK_CUDA_TRY(cudaMalloc(&sums, (tokens + kConfigCheckFloats / 2) * sizeof(float2)));
  float* check = reinterpret_cast<float*>(sums + tokens);
  for (bool agree : {true, false, true}) {
    SCOPED_TRACE(agree ? "the ranks agree" : "a rank disagrees");
    Problem p = Problem::random(tokens, qw, kw, DType::kBF16, NormOrder::kOlmo2, 1e-6f, 31);
    RankData d = make_rank(p, 1, 0, Layout::kSeparate);
    poison(d, stream_);
    const detail::RankArgs ra = detail::rank_args_for(comm.state(), d.params, 0);
    detail::launch_partial_sums(DType::kBF16, ra, tokens, qw, kw, true, sums, stream_, check, mine);
    std::vector<float> written(kConfigCheckFloats), reduced(kConfigCheckFloats);
    SWIFTQK_CUDA_TRY(cudaMemcpyAsync(written.data(), check, sizeof(float) * kConfigCheckFloats,
                                     cudaMemcpyDeviceToHost, stream_));
    SWIFTQK_CUDA_TRY(cudaStreamSynchronize(stream_));
    for (int i = 0; i < kConfigCheckFloats; ++i) {
      EXPECT_EQ(written[i], config_check_value(mine, i)) << "check float " << i;
      reduced[i] = written[i] + config_check_value(agree ? mine : other, i);
    }
    SWIFTQK_CUDA_TRY(cudaMemcpyAsync(check, reduced.data(), sizeof(float) * kConfigCheckFloats,
                                     cudaMemcpyHostToDevice, stream_));
    detail::launch_apply_scale(DType::kBF16, ra, tokens, qw, kw, true, NormOrder::kOlmo2, sums,
                               false, 1.f / qw, 1.f / kw, 1e-6f, stream_, nullptr, check, mine, 2);
    SWIFTQK_CUDA_TRY(cudaStreamSynchronize(stream_));
    if (agree) {
      const Check c = check_ranks(p, 1, {&d});
      EXPECT_EQ(c.wrong, 0) << c.first_error;
      EXPECT_EQ(comm.failure().code, 0u);
    } else {
      EXPECT_TRUE(census_rank(p, 1, 0, d).all_nan());
      EXPECT_EQ(comm.failure().code, 7u);
      expect_error([&] { comm.check_error(); }, "different configurations");
      comm.reset();
      EXPECT_EQ(comm.failure().code, 0u);
    }
  }
  SWIFTQK_CUDA_TRY(cudaFree(sums));
}

TEST_F(NcclGroupOfOne, BaselinesReplayFromGraphsAfterAnEagerWarmUp) {
  Communicator comm = Communicator::from_nccl(nccl_, CommConfig{}, stream_);
  for (Method m : {Method::kAllGather, Method::kCommOverlap, Method::kMiniMaxEager}) {
    Problem p = Problem::random(64, 5120, 1024, DType::kBF16, NormOrder::kOlmo2, 1e-6f, 4);
    RankData d = make_rank(p, 1, 0, Layout::kSeparate);
    d.params.method = m;
    launch_qk_norm(comm, d.params, stream_);  // sizes the scratch
    comm.synchronize(stream_);
    cudaGraphExec_t ge = capture_graph(stream_, [&] { launch_qk_norm(comm, d.params, stream_); });
    for (int i = 0; i < 3; ++i) {
      p.refill(40 + i);
      upload_inputs(p, 1, 0, d, stream_);
      poison(d, stream_);
      SWIFTQK_CUDA_TRY(cudaGraphLaunch(ge, stream_));
      comm.synchronize(stream_);
      EXPECT_EQ(check_ranks(p, 1, {&d}).wrong, 0) << to_string(m) << " replay " << i;
    }
    SWIFTQK_CUDA_TRY(cudaGraphExecDestroy(ge));
  }
}

TEST(NcclBaselines, NeedNcclBeyondOneRank) {
  REQUIRE_GPU();
  auto comms = Communicator::create_local_group({0, 0});
  Problem p = Problem::random(8, 2048, 2048, DType::kBF16, NormOrder::kOlmo2, 1e-6f, 5);
  RankData d = make_rank(p, 2, 0, Layout::kSeparate);
  d.params.method = Method::kAllGather;
  // all_gather at TP 2 needs a communicator made from NCCL.
  expect_error([&] { launch_qk_norm(comms[0], d.params, nullptr); }, "from_nccl");
  EXPECT_THROW(launch_qk_norm_group({&comms[0], &comms[1]}, {d.params, d.params}, nullptr), Error);
}

}  // namespace
}  // namespace swiftqk::testing
