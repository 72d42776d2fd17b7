// Failure semantics on one GPU (virtual ranks, and in-process ranks that meet through
// IpcBootstrap): a fault is loud (every later output NaN, the host raises naming rank, peer and
// token), contained (a second kernel of one communicator is caught on the device), recoverable
// (a collective reset, then correct calls) and tears down without a peer writing into freed
// memory. Every scenario asserts what the caller sees, and that no output element is ever
// finite and wrong.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "concurrent_replays.hpp"
#include "expect_error.hpp"
#include "failure_helpers.hpp"
#include "problem.hpp"
#include "require_gpu.hpp"
#include "stream_gate.hpp"

namespace swiftqk::testing {
namespace {

// A late peer: rank 0 times out alone, then rank 1 calls. Rank 0's error names rank 1 and a
// token; rank 1 stops at once (it does not wait out its own timeout) and names rank 0; both
// outputs are NaN, in place included (the inputs are lost, as documented).
TEST(FailureSemantics, LatePeerFailsLoudlyOnBothRanks) {
  REQUIRE_GPU();
  CommConfig cfg;
  cfg.timeout_s = 1.0;
  auto comms = Communicator::create_local_group({0, 0}, cfg);
  Problem p = Problem::random(64, 4096, 1024, DType::kBF16, NormOrder::kOlmo2, 1e-6f, 21);
  RankData r0 = make_rank(p, 2, 0, Layout::kFusedInPlace);
  RankData r1 = make_rank(p, 2, 1, Layout::kSeparate);
  poison(r1, nullptr);
  cudaStream_t s0 = new_stream(), s1 = new_stream();

  auto start = Clock::now();
  launch_qk_norm(comms[0], r0.params, s0);
  EXPECT_THROW(comms[0].synchronize(s0), Error);
  const double t0 = seconds_since(start);
  EXPECT_GE(t0, 0.9 * cfg.timeout_s);
  EXPECT_LT(t0, 3.0 * cfg.timeout_s);
  const DeviceFailure f0 = comms[0].failure();
  EXPECT_EQ(f0.code, 1u);
  EXPECT_EQ(f0.rank, 0);
  EXPECT_EQ(f0.peer, 1);
  EXPECT_GE(f0.token, 0);
  EXPECT_LT(f0.token, p.tokens);
  const std::string e0 = error_of(comms[0]);
  EXPECT_NE(e0.find("rank 0 timed out waiting for rank 1"), std::string::npos) << e0;
  EXPECT_NE(e0.find("token " + std::to_string(f0.token)), std::string::npos) << e0;
  EXPECT_TRUE(census_rank(p, 2, 0, r0).all_nan()) << "rank 0 left a plausible output";

  start = Clock::now();
  launch_qk_norm(comms[1], r1.params, s1);  // the late peer
  EXPECT_THROW(comms[1].synchronize(s1), Error);
  EXPECT_LT(seconds_since(start), 0.5 * cfg.timeout_s) << "the late peer waited out a timeout";
  const DeviceFailure f1 = comms[1].failure();
  EXPECT_EQ(f1.code, 3u);
  EXPECT_EQ(f1.rank, 1);
  EXPECT_EQ(f1.peer, 0);
  const std::string e1 = error_of(comms[1]);
  EXPECT_NE(e1.find("rank 1 stopped because rank 0"), std::string::npos) << e1;
  const Census c1 = census_rank(p, 2, 1, r1);
  EXPECT_TRUE(c1.all_nan()) << c1.correct << " correct, " << c1.wrong << " wrong";
  // The host refuses the next eager launch of either rank.
  EXPECT_THROW(launch_qk_norm(comms[0], r0.params, s0), Error);
  EXPECT_THROW(launch_qk_norm(comms[1], r1.params, s1), Error);
  SWIFTQK_CUDA_TRY(cudaStreamDestroy(s0));
  SWIFTQK_CUDA_TRY(cudaStreamDestroy(s1));
}

// Graph replays go past the host: after a failure, a graph captured before it writes NaN on
// every rank, at once, and a capture after it raises. A reset then gives 1000 correct calls,
// each compared bit for bit with a call checked against float64.
TEST(FailureSemantics, ReplaysAfterAFailureAreNaNAndResetRecovers) {
  REQUIRE_GPU();
  CommConfig cfg;
  cfg.timeout_s = 0.3;
  auto comms = Communicator::create_local_group({0, 0}, cfg);
  std::vector<Communicator*> cp{&comms[0], &comms[1]};
  Problem p = Problem::random(48, 2048, 512, DType::kBF16, NormOrder::kLlama, 1e-5f, 22);
  RankData r0 = make_rank(p, 2, 0, Layout::kFusedOutOfPlace);
  RankData r1 = make_rank(p, 2, 1, Layout::kFusedOutOfPlace);
  cudaStream_t s = new_stream();
  cudaGraphExec_t before = capture_graph(s, [&] {
    launch_qk_norm_group(cp, {r0.params, r1.params}, s);
  });
  poison(r0, s);
  poison(r1, s);
  SWIFTQK_CUDA_TRY(cudaGraphLaunch(before, s));
  SWIFTQK_CUDA_TRY(cudaStreamSynchronize(s));
  ASSERT_EQ(check_ranks(p, 2, {&r0, &r1}).wrong, 0);

  launch_qk_norm(comms[0], r0.params, s);  // rank 1 never comes: a timeout
  EXPECT_THROW(comms[0].synchronize(s), Error);
  for (int i = 0; i < 4; ++i) {
    poison(r0, s);
    poison(r1, s);
    const auto start = Clock::now();
    EXPECT_EQ(cudaGraphLaunch(before, s), cudaSuccess);
    EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    EXPECT_LT(seconds_since(start), 0.5 * cfg.timeout_s) << "a replay waited out a timeout";
    EXPECT_TRUE(census_rank(p, 2, 0, r0).all_nan()) << "replay " << i;
    EXPECT_TRUE(census_rank(p, 2, 1, r1).all_nan()) << "replay " << i;
  }
  EXPECT_EQ(comms[0].failure().code, 1u);
  EXPECT_EQ(comms[1].failure().code, 3u);
  EXPECT_EQ(comms[1].failure().peer, 0);

  // A capture after the failure: the host check raises while capturing.
  SWIFTQK_CUDA_TRY(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  expect_error([&] { launch_qk_norm_group(cp, {r0.params, r1.params}, s); }, "timed out");
  cudaGraph_t g = nullptr;
  (void)cudaStreamEndCapture(s, &g);
  if (g != nullptr) SWIFTQK_CUDA_TRY(cudaGraphDestroy(g));
  (void)cudaGetLastError();

  comms[0].reset();  // a local group resets as a whole
  EXPECT_EQ(comms[0].failure().code, 0u);
  EXPECT_EQ(comms[1].failure().code, 0u);
  poison(r0, s);
  poison(r1, s);
  SWIFTQK_CUDA_TRY(cudaGraphLaunch(before, s));
  SWIFTQK_CUDA_TRY(cudaStreamSynchronize(s));
  ASSERT_EQ(check_ranks(p, 2, {&r0, &r1}).wrong, 0);
  EXPECT_EQ(replays_unlike(before, s, {&r0, &r1}, {output_bytes(r0), output_bytes(r1)}, 1000), 0);
  EXPECT_EQ(error_of(comms[0]), "");
  EXPECT_EQ(error_of(comms[1]), "");
  SWIFTQK_CUDA_TRY(cudaGraphExecDestroy(before));
  SWIFTQK_CUDA_TRY(cudaStreamDestroy(s));
}

// Two graphs of the same communicators replayed at once on two streams (each within half the
// SMs, so both are resident together): the device catches the second kernel, the outputs are
// correct or NaN, never mixed, and a reset recovers. The two graphs normalise different inputs,
// so a partial taken from the other kernel makes a row wrong.
TEST(FailureSemantics, TwoReplaysAtOnceAreCaughtNotMixed) {
  REQUIRE_GPU();
  ConcurrentReplays x(23, 123);
  int caught = 0;
  for (int it = 0; it < 5; ++it) {
    x.poison_all();
    const Together run = x.replay();
    EXPECT_EQ(run.a, cudaSuccess);
    EXPECT_EQ(run.b, cudaSuccess);
    int64_t nan = 0;
    for (auto [d, r, pr] :
         {std::tuple{&x.a0, 0, &x.pa}, {&x.a1, 1, &x.pa}, {&x.b0, 0, &x.pb}, {&x.b1, 1, &x.pb}}) {
      const Census c = census_rank(*pr, 2, r, *d);
      EXPECT_EQ(c.wrong, 0) << "iteration " << it << ": a silently wrong output";
      nan += c.nan;
    }
    const uint32_t code0 = x.comms[0].failure().code, code1 = x.comms[1].failure().code;
    const bool failed = code0 != 0 || code1 != 0;
    EXPECT_EQ(nan > 0, failed) << "NaN without an error, or an error with every output correct";
    if (failed) {
      ++caught;
      EXPECT_TRUE(code0 == 2 || code1 == 2) << code0 << " " << code1;
      const std::string e = error_of(code0 == 2 ? x.comms[0] : x.comms[1]);
      EXPECT_NE(e.find("second kernel"), std::string::npos) << e;
    }
    x.comms[0].reset();
  }
  EXPECT_GE(caught, 1) << "the two replays never overlapped: the scenario did not happen";
  for (RankData* d : {&x.a0, &x.a1}) poison(*d, nullptr);
  SWIFTQK_CUDA_TRY(cudaGraphLaunch(x.ga, x.sa));
  SWIFTQK_CUDA_TRY(cudaStreamSynchronize(x.sa));
  EXPECT_EQ(check_ranks(x.pa, 2, {&x.a0, &x.a1}).wrong, 0) << "no recovery after reset";
  EXPECT_EQ(error_of(x.comms[0]), "");
}

// Virtual ranks launched apart, each on its own stream, the second 20 ms after the first: each
// launch takes its share of the GPU, so both are resident together and complete.
TEST(FailureSemantics, RanksLaunchedApartShareTheGpu) {
  REQUIRE_GPU();
  CommConfig cfg;
  cfg.timeout_s = 2.0;
  auto comms = Communicator::create_local_group({0, 0}, cfg);
  Problem p = Problem::random(4096, 4096, 4096, DType::kBF16, NormOrder::kOlmo2, 1e-6f, 24);
  RankData r0 = make_rank(p, 2, 0, Layout::kSeparate), r1 = make_rank(p, 2, 1, Layout::kSeparate);
  poison(r0, nullptr);
  poison(r1, nullptr);
  SWIFTQK_CUDA_TRY(cudaDeviceSynchronize());
  cudaStream_t s0 = new_stream(), s1 = new_stream();
  const auto start = Clock::now();
  launch_qk_norm(comms[0], r0.params, s0);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  launch_qk_norm(comms[1], r1.params, s1);
  comms[0].synchronize(s0);
  comms[1].synchronize(s1);
  EXPECT_LT(seconds_since(start), cfg.timeout_s);
  EXPECT_EQ(check_ranks(p, 2, {&r0, &r1}).wrong, 0);
  SWIFTQK_CUDA_TRY(cudaStreamDestroy(s0));
  SWIFTQK_CUDA_TRY(cudaStreamDestroy(s1));
}

// Two ranks of one process that meet through IpcBootstrap (as threads of an engine would).
struct IpcPair {
  std::vector<Communicator> comms;
  explicit IpcPair(const CommConfig& cfg) {
    IpcBootstrap b0(0, 2, 0, cfg), b1(1, 2, 0, cfg);
    const std::vector<std::vector<uint8_t>> h{b0.local_handle(), b1.local_handle()};
    comms.push_back(b0.connect(h));
    comms.push_back(b1.connect(h));
  }
  // Both ranks must reach the close barrier, so they close at once, as separate ranks would
  // (closed one after the other, rank 0 waited out its bound for rank 1). A test that left one
  // rank closed on purpose (CloseNamesAPeerThatNeverComes) has asserted on it already; the other
  // rank's close then fails after its bound, which is reported as the destructor would.
  ~IpcPair() {
    std::thread other([this] { close_quietly(comms[1]); });
    close_quietly(comms[0]);
    other.join();
  }
  static void close_quietly(Communicator& c) {
    if (c.closed()) return;
    try {
      c.close();
    } catch (const Error& e) {
      std::fprintf(stderr, "IpcPair: %s\n", e.what());
    }
  }
};

// Ranks whose configurations disagree (here each field the handles carry) are refused at
// connect, on both ranks, naming the field, before any peer is mapped; the same handles with
// agreeing configurations then connect.
TEST(FailureSemantics, RanksThatDisagreeOnTheirConfigurationAreRefusedAtConnect) {
  REQUIRE_GPU();
  const CommConfig base;
  std::vector<std::pair<CommConfig, const char*>> cases;
  CommConfig c = base;
  c.token_capacity = 4096;
  cases.push_back({c, "CommConfig.token_capacity"});
  c = base;
  c.chunk_oversize = false;
  cases.push_back({c, "CommConfig.chunk_oversize"});
  c = base;
  c.timeout_s = 0.5;
  cases.push_back({c, "CommConfig.timeout_s"});
  c = base;
  c.use_p2p = false;
  cases.push_back({c, "CommConfig.use_p2p"});
  for (const auto& [other, field] : cases) {
    IpcBootstrap b0(0, 2, 0, base), b1(1, 2, 0, other);
    const std::vector<std::vector<uint8_t>> h{b0.local_handle(), b1.local_handle()};
    expect_error([&] { b0.connect(h); }, {"IpcBootstrap::connect: rank 1 has ", field});
    expect_error([&] { b1.connect(h); }, {"IpcBootstrap::connect: rank 0 has ", field});
  }
  IpcPair agreeing(base);
  EXPECT_EQ(agreeing.comms.size(), 2u);
}

// Teardown while a peer is late: rank 1's kernel still waits for rank 0 when rank 0 closes.
// Rank 0's close waits at the barrier until rank 1 has finished (its wait times out) and closes
// too; neither frees memory the other may still write.
TEST(FailureSemantics, CloseWaitsForALatePeer) {
  REQUIRE_GPU();
  CommConfig cfg;
  cfg.timeout_s = 0.5;
  IpcPair pair(cfg);
  Problem p = Problem::random(32, 2048, 2048, DType::kBF16, NormOrder::kOlmo2, 1e-6f, 25);
  RankData r1 = make_rank(p, 2, 1, Layout::kSeparate);
  cudaStream_t s1 = new_stream();
  launch_qk_norm(pair.comms[1], r1.params, s1);  // waits for rank 0, which never calls
  std::thread late([&] {
    expect_error([&] { pair.comms[1].synchronize(s1); }, "rank 1 timed out waiting for rank 0");
    pair.comms[1].close();
  });
  const auto start = Clock::now();
  EXPECT_NO_THROW(pair.comms[0].close());
  const double secs = seconds_since(start);
  late.join();
  EXPECT_GE(secs, 0.8 * cfg.timeout_s) << "rank 0 closed before the late peer had finished";
  EXPECT_LT(secs, 4.0 * cfg.timeout_s + 2.0);
  EXPECT_TRUE(pair.comms[0].closed() && pair.comms[1].closed());
  EXPECT_THROW(launch_qk_norm(pair.comms[0], r1.params, s1), Error);
  SWIFTQK_CUDA_TRY(cudaStreamDestroy(s1));
}

// A peer that never closes: close() gives up after its bound (2 x timeout_s + 1 s), naming it.
TEST(FailureSemantics, CloseNamesAPeerThatNeverComes) {
  REQUIRE_GPU();
  CommConfig cfg;
  cfg.timeout_s = 0.3;
  IpcPair pair(cfg);
  const auto start = Clock::now();
  expect_error([&] { pair.comms[0].close(); }, "rank 1 did not reach the close barrier");
  EXPECT_LT(seconds_since(start), 4.0 * cfg.timeout_s + 2.0);
  EXPECT_TRUE(pair.comms[0].closed());
  EXPECT_NO_THROW(pair.comms[1].close());  // rank 0's barrier word is there: it passes
}

// Communicators a group decided not to use (as communicator_from_group drops them when it falls
// back) close without the barrier, at once on each rank; one that has launched is refused, stays
// open, and closes with close() on every rank (IpcPair's destructor).
TEST(FailureSemantics, CloseWithoutBarrierWaitsForNoPeerAndRefusesOnceLaunched) {
  REQUIRE_GPU();
  CommConfig cfg;
  cfg.timeout_s = 0.3;
  {
    IpcPair unused(cfg);
    const auto start = Clock::now();
    EXPECT_NO_THROW(unused.comms[0].close_without_barrier());
    EXPECT_NO_THROW(unused.comms[1].close_without_barrier());
    EXPECT_LT(seconds_since(start), 1.0) << "a barrier ran (its bound is 1.6 s)";
    EXPECT_TRUE(unused.comms[0].closed() && unused.comms[1].closed());
  }
  IpcPair pair(cfg);
  Problem p = Problem::random(8, 2048, 2048, DType::kBF16, NormOrder::kOlmo2, 1e-6f, 28);
  RankData r1 = make_rank(p, 2, 1, Layout::kSeparate);
  cudaStream_t s1 = new_stream();
  launch_qk_norm(pair.comms[1], r1.params, s1);  // rank 0 never calls: a timeout, then it ends
  EXPECT_THROW(pair.comms[1].synchronize(s1), Error);
  expect_error([&] { pair.comms[1].close_without_barrier(); }, "has launched");
  EXPECT_FALSE(pair.comms[1].closed());
  SWIFTQK_CUDA_TRY(cudaStreamDestroy(s1));
}

// Twenty calls of both ranks of a pair on fresh inputs (seeds first_seed, ...), every output
// checked against float64: what a recovered pair must do.
void expect_correct_calls(IpcPair& pair, Problem& p, RankData& r0, RankData& r1, cudaStream_t s0,
                          cudaStream_t s1, uint64_t first_seed) {
  for (int call = 0; call < 20; ++call) {
    p.refill(first_seed + static_cast<uint64_t>(call));
    upload_inputs(p, 2, 0, r0, s0);
    upload_inputs(p, 2, 1, r1, s1);
    poison(r0, s0);
    poison(r1, s1);
    SWIFTQK_CUDA_TRY(cudaDeviceSynchronize());
    launch_qk_norm(pair.comms[0], r0.params, s0);
    launch_qk_norm(pair.comms[1], r1.params, s1);
    pair.comms[0].synchronize(s0);
    pair.comms[1].synchronize(s1);
    ASSERT_EQ(check_ranks(p, 2, {&r0, &r1}).wrong, 0) << "call " << call;
  }
}

// A collective reset across in-process ranks after a late peer, then correct calls.
TEST(FailureSemantics, CollectiveResetAfterALatePeer) {
  REQUIRE_GPU();
  CommConfig cfg;
  cfg.timeout_s = 0.3;
  IpcPair pair(cfg);
  Problem p = Problem::random(40, 4096, 1024, DType::kF16, NormOrder::kOlmo2, 1e-6f, 26);
  RankData r0 = make_rank(p, 2, 0, Layout::kSeparate), r1 = make_rank(p, 2, 1, Layout::kSeparate);
  cudaStream_t s0 = new_stream(), s1 = new_stream();
  launch_qk_norm(pair.comms[0], r0.params, s0);
  EXPECT_THROW(pair.comms[0].synchronize(s0), Error);
  launch_qk_norm(pair.comms[1], r1.params, s1);  // late: stops on rank 0's fault word
  EXPECT_THROW(pair.comms[1].synchronize(s1), Error);
  std::thread other([&] { pair.comms[1].reset(); });
  pair.comms[0].reset();
  other.join();
  ASSERT_NO_FATAL_FAILURE(expect_correct_calls(pair, p, r0, r1, s0, s1, 900));
  std::thread closer([&] { pair.comms[1].close(); });
  pair.comms[0].close();
  closer.join();
  SWIFTQK_CUDA_TRY(cudaStreamDestroy(s0));
  SWIFTQK_CUDA_TRY(cudaStreamDestroy(s1));
}

// A reset that some ranks made alone and that failed at a barrier (rank 0's at the first, before
// clearing; rank 1's at the second, after clearing) does not leave the ranks' probe rounds out of
// step: the next reset, made by every rank, meets at the same rounds and the group works again.
TEST(FailureSemantics, AResetAfterResetsThatFailedAtTheirBarriersRecovers) {
  REQUIRE_GPU();
  CommConfig cfg;
  cfg.timeout_s = 0.2;
  IpcPair pair(cfg);
  Problem p = Problem::random(40, 4096, 1024, DType::kBF16, NormOrder::kOlmo2, 1e-6f, 27);
  RankData r0 = make_rank(p, 2, 0, Layout::kSeparate), r1 = make_rank(p, 2, 1, Layout::kSeparate);
  cudaStream_t s0 = new_stream(), s1 = new_stream();
  launch_qk_norm(pair.comms[0], r0.params, s0);  // rank 1 never calls: a timeout
  EXPECT_THROW(pair.comms[0].synchronize(s0), Error);
  expect_error([&] { pair.comms[0].reset(); }, "rank 1 did not reach the reset barrier");
  expect_error([&] { pair.comms[1].reset(); }, "rank 0 did not reach the reset barrier");
  std::thread other([&] { pair.comms[1].reset(); });
  EXPECT_NO_THROW(pair.comms[0].reset());
  other.join();
  ASSERT_NO_FATAL_FAILURE(expect_correct_calls(pair, p, r0, r1, s0, s1, 700));
  SWIFTQK_CUDA_TRY(cudaStreamDestroy(s0));
  SWIFTQK_CUDA_TRY(cudaStreamDestroy(s1));
}

TEST(FailureSemantics, UnboundedTimeoutsAreRefused) {
  REQUIRE_GPU();
  for (double t : {std::numeric_limits<double>::infinity(), 1e30, 2e10}) {
    CommConfig cfg;
    cfg.timeout_s = t;
    SCOPED_TRACE(t);
    expect_error([&] { Communicator::create_local_group({0, 0}, cfg); }, "timeout_s");
  }
}

}  // namespace
}  // namespace swiftqk::testing
