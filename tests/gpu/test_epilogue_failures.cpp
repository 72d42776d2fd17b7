// The fused QK epilogue's failure semantics on one GPU (virtual ranks): a peer that does not
// come makes the waiting rank raise by its timeout and the late one at once, each naming the
// other; no output element is finite and wrong (Q NaN, no K written to the cache); a graph
// captured before the fault replays as NaN until a collective reset, after which it is correct;
// and a failure of the plain norm on the same communicators stops the epilogue too.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "epilogue_group.hpp"
#include "epilogue_problem.hpp"
#include "expect_error.hpp"
#include "failure_helpers.hpp"
#include "require_gpu.hpp"

namespace swiftqk::testing {
namespace {

constexpr int kWorld = 2;

// OLMo3-32B's heads on fewer tokens: 40 Q and 8 KV heads, 20 and 4 a rank.
EpilogueHost small_problem(uint64_t seed) {
  EpilogueSetup s;
  s.tokens = 48;
  s.q_heads = 40;
  s.kv_heads = 8;
  s.seed = seed;
  return EpilogueHost::random(s);
}

// Fresh inputs in every rank, outputs and caches poisoned, caches snapshotted.
void refresh(EpilogueHost& h, EpilogueRanks& r, uint64_t seed, cudaStream_t s) {
  h.refill(seed);
  for (int i = 0; i < kWorld; ++i) {
    upload_epilogue_inputs(h, kWorld, i, r.d[i], s);
    poison_epilogue(r.d[i], seed + i, s);
  }
  SWIFTQK_CUDA_TRY(cudaStreamSynchronize(s));
  for (int i = 0; i < kWorld; ++i) r.before[i] = snapshot_caches(r.d[i]);
}

// Rank i after a call of a failed group: nothing finite and wrong, no stray cache byte, and no
// token finished: every Q element NaN and no K written into the cache.
void expect_rank_failed(const EpilogueHost& h, const EpilogueRanks& r, int i,
                        const std::string& what) {
  const ref::EpilogueExpected gold = ref::epilogue_fp64(h.ref);
  const EpilogueCheck c = check_epilogue_rank(h, gold, kWorld, i, r.d[i], r.before[i], {}, 1.0,
                                              EpilogueExpect::kCorrectOrFailed);
  EXPECT_TRUE(c.ok()) << what << ", rank " << i << ": Q " << c.q_wrong << ", K " << c.k_wrong
                      << ", V " << c.v_wrong << " wrong, " << c.cache_changed
                      << " other cache bytes changed; first: " << c.first_error;
  const int64_t hd = h.s.head_dim;
  const int64_t slotted =
      std::count_if(h.slots.begin(), h.slots.end(), [](int64_t v) { return v >= 0; });
  EXPECT_EQ(c.q_nan, h.s.tokens * h.s.q_heads / kWorld * hd) << what << ", rank " << i;
  EXPECT_EQ(c.k_unwritten, slotted * h.s.kv_heads / kWorld * hd) << what << ", rank " << i;
}

TEST(EpilogueFailures, LatePeerFailsLoudlyOnBothRanks) {
  REQUIRE_GPU();
  CommConfig cfg;
  cfg.timeout_s = 1.0;
  EpilogueGroup g(kWorld, cfg);
  const EpilogueHost h = small_problem(3001);
  EpilogueRanks r = make_ranks(h, kWorld, 3002);
  cudaStream_t s0 = new_stream(), s1 = new_stream();

  auto start = Clock::now();
  launch_qk_epilogue(g.comms[0], r.d[0].params, s0);  // rank 1 has not come
  EXPECT_THROW(g.comms[0].synchronize(s0), Error);
  const double t0 = seconds_since(start);
  EXPECT_GE(t0, 0.9 * cfg.timeout_s);
  EXPECT_LT(t0, 3.0 * cfg.timeout_s);
  const DeviceFailure f0 = g.comms[0].failure();
  EXPECT_EQ(f0.code, 1u);
  EXPECT_EQ(f0.rank, 0);
  EXPECT_EQ(f0.peer, 1);
  EXPECT_GE(f0.token, 0);
  EXPECT_LT(f0.token, h.s.tokens);
  const std::string e0 = error_of(g.comms[0]);
  EXPECT_NE(e0.find("rank 0 timed out waiting for rank 1"), std::string::npos) << e0;
  expect_rank_failed(h, r, 0, "the rank that waited");

  start = Clock::now();
  launch_qk_epilogue(g.comms[1], r.d[1].params, s1);  // the late peer
  EXPECT_THROW(g.comms[1].synchronize(s1), Error);
  EXPECT_LT(seconds_since(start), 0.5 * cfg.timeout_s) << "the late peer waited out a timeout";
  const DeviceFailure f1 = g.comms[1].failure();
  EXPECT_EQ(f1.code, 3u);
  EXPECT_EQ(f1.peer, 0);
  const std::string e1 = error_of(g.comms[1]);
  EXPECT_NE(e1.find("rank 1 stopped because rank 0"), std::string::npos) << e1;
  expect_rank_failed(h, r, 1, "the late rank");
  // The host refuses the next eager launch of either rank.
  EXPECT_THROW(launch_qk_epilogue(g.comms[0], r.d[0].params, s0), Error);
  EXPECT_THROW(launch_qk_epilogue(g.comms[1], r.d[1].params, s1), Error);
  SWIFTQK_CUDA_TRY(cudaStreamDestroy(s0));
  SWIFTQK_CUDA_TRY(cudaStreamDestroy(s1));
}

TEST(EpilogueFailures, ReplaysAfterAFailureAreNaNAndResetRecovers) {
  REQUIRE_GPU();
  CommConfig cfg;
  cfg.timeout_s = 0.5;
  EpilogueGroup g(kWorld, cfg);
  EpilogueHost h = small_problem(3101);
  EpilogueRanks r = make_ranks(h, kWorld, 3102);
  cudaStream_t s = new_stream();
  const std::vector<QkEpilogueParams> params = r.params();
  cudaGraphExec_t before = capture_graph(s, [&] { launch_qk_epilogue_group(g.ptrs, params, s); });
  refresh(h, r, 3103, s);
  SWIFTQK_CUDA_TRY(cudaGraphLaunch(before, s));
  SWIFTQK_CUDA_TRY(cudaStreamSynchronize(s));
  expect_ranks_correct(h, kWorld, r);

  launch_qk_epilogue(g.comms[0], r.d[0].params, s);  // rank 1 never comes: a timeout
  EXPECT_THROW(g.comms[0].synchronize(s), Error);
  for (int i = 0; i < 3; ++i) {
    refresh(h, r, 3200 + 10 * i, s);
    const auto start = Clock::now();
    EXPECT_EQ(cudaGraphLaunch(before, s), cudaSuccess);
    EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    EXPECT_LT(seconds_since(start), 0.5 * cfg.timeout_s) << "a replay waited out a timeout";
    for (int k = 0; k < kWorld; ++k) expect_rank_failed(h, r, k, "replay " + std::to_string(i));
  }
  EXPECT_EQ(g.comms[0].failure().code, 1u);
  EXPECT_EQ(g.comms[1].failure().code, 3u);
  EXPECT_EQ(g.comms[1].failure().peer, 0);

  // A capture after the failure: the host check raises while capturing.
  SWIFTQK_CUDA_TRY(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  expect_error([&] { launch_qk_epilogue_group(g.ptrs, params, s); }, {"timed out"});
  cudaGraph_t graph = nullptr;
  (void)cudaStreamEndCapture(s, &graph);
  if (graph != nullptr) SWIFTQK_CUDA_TRY(cudaGraphDestroy(graph));
  (void)cudaGetLastError();

  g.comms[0].reset();  // a local group resets as a whole
  EXPECT_EQ(g.comms[0].failure().code, 0u);
  EXPECT_EQ(g.comms[1].failure().code, 0u);
  for (int i = 0; i < 3; ++i) {
    refresh(h, r, 3300 + 10 * i, s);
    SWIFTQK_CUDA_TRY(cudaGraphLaunch(before, s));
    SWIFTQK_CUDA_TRY(cudaStreamSynchronize(s));
    expect_ranks_correct(h, kWorld, r);
  }
  EXPECT_EQ(error_of(g.comms[0]), "");
  EXPECT_EQ(error_of(g.comms[1]), "");
  SWIFTQK_CUDA_TRY(cudaGraphExecDestroy(before));
  SWIFTQK_CUDA_TRY(cudaStreamDestroy(s));
}

// The plain norm and the epilogue on the same communicators: once the norm has timed out, an
// eager epilogue launch is refused before it writes anything, and a replay of an epilogue graph
// captured before writes NaN; after reset() both work again.
TEST(EpilogueFailures, ANormFailureStopsTheEpilogueOfTheSameGroup) {
  REQUIRE_GPU();
  CommConfig cfg;
  cfg.timeout_s = 0.5;
  EpilogueGroup g(kWorld, cfg);
  EpilogueHost h = small_problem(3401);
  EpilogueRanks r = make_ranks(h, kWorld, 3402);
  cudaStream_t s = new_stream();
  const std::vector<QkEpilogueParams> params = r.params();
  cudaGraphExec_t epilogue = capture_graph(s, [&] { launch_qk_epilogue_group(g.ptrs, params, s); });
  const int64_t hd = h.s.head_dim;
  Problem p = Problem::random(32, h.s.q_heads * hd, h.s.kv_heads * hd, DType::kBF16,
                              NormOrder::kOlmo2, 1e-6f, 3403);
  RankData n0 = make_rank(p, kWorld, 0, Layout::kSeparate);
  RankData n1 = make_rank(p, kWorld, 1, Layout::kSeparate);

  launch_qk_norm(g.comms[0], n0.params, s);  // rank 1's norm never comes
  EXPECT_THROW(g.comms[0].synchronize(s), Error);

  refresh(h, r, 3410, s);
  expect_error([&] { launch_qk_epilogue_group(g.ptrs, params, s); }, {"timed out"});
  SWIFTQK_CUDA_TRY(cudaStreamSynchronize(s));
  for (int i = 0; i < kWorld; ++i) {  // refused before anything was written
    const CacheSnapshot now = snapshot_caches(r.d[i]);
    EXPECT_EQ(now.k, r.before[i].k);
    EXPECT_EQ(now.v, r.before[i].v);
  }

  refresh(h, r, 3420, s);
  SWIFTQK_CUDA_TRY(cudaGraphLaunch(epilogue, s));
  SWIFTQK_CUDA_TRY(cudaStreamSynchronize(s));
  for (int i = 0; i < kWorld; ++i) expect_rank_failed(h, r, i, "epilogue replay after the norm");

  g.comms[0].reset();
  refresh(h, r, 3430, s);
  SWIFTQK_CUDA_TRY(cudaGraphLaunch(epilogue, s));
  SWIFTQK_CUDA_TRY(cudaStreamSynchronize(s));
  expect_ranks_correct(h, kWorld, r);
  poison(n0, s);
  poison(n1, s);
  launch_qk_norm_group(g.ptrs, {n0.params, n1.params}, s);
  SWIFTQK_CUDA_TRY(cudaStreamSynchronize(s));
  EXPECT_EQ(check_ranks(p, kWorld, {&n0, &n1}).wrong, 0);
  EXPECT_EQ(error_of(g.comms[0]), "");
  EXPECT_EQ(error_of(g.comms[1]), "");
  SWIFTQK_CUDA_TRY(cudaGraphExecDestroy(epilogue));
  SWIFTQK_CUDA_TRY(cudaStreamDestroy(s));
}

}  // namespace
}  // namespace swiftqk::testing
