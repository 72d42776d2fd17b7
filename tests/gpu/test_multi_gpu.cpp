// Several GPUs of one host, one rank per GPU: one process driving every GPU (peer access), one
// thread per GPU over an NCCL group (from_nccl and every NCCL baseline), and a missing peer on
// another GPU. Skipped, and reported as skipped, on machines with fewer than two GPUs.
#include <gtest/gtest.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "expect_error.hpp"
#include "problem.hpp"

namespace swiftqk::testing {
namespace {

int gpu_count() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

#define REQUIRE_GPUS(n)                                                        \
  if (gpu_count() < (n))                                                       \
  GTEST_SKIP() << "needs " << (n) << " GPUs, this machine has " << gpu_count() \
               << ": multi-GPU test skipped"

std::vector<int> first_devices(int n) {
  std::vector<int> d(n);
  std::iota(d.begin(), d.end(), 0);
  return d;
}

// TP sizes to try with the GPUs present: every power of two from 2 up, and all of them.
std::vector<int> tp_sizes() {
  std::vector<int> out;
  const int n = gpu_count();
  for (int tp = 2; tp <= n; tp *= 2) out.push_back(tp);
  if (out.empty() || out.back() != n) out.push_back(n);
  return out;
}

struct Streams {
  explicit Streams(int n) : s(n) {
    for (int r = 0; r < n; ++r) {
      SWIFTQK_CUDA_TRY(cudaSetDevice(r));
      SWIFTQK_CUDA_TRY(cudaStreamCreateWithFlags(&s[r], cudaStreamNonBlocking));
    }
    SWIFTQK_CUDA_TRY(cudaSetDevice(0));
  }
  ~Streams() {
    for (auto x : s) cudaStreamDestroy(x);
  }
  std::vector<cudaStream_t> s;
};

// Rank r's buffers live on GPU r.
std::vector<RankData> ranks_on_gpus(const Problem& p, int world, Layout layout) {
  std::vector<RankData> d;
  for (int r = 0; r < world; ++r) {
    SWIFTQK_CUDA_TRY(cudaSetDevice(r));
    d.push_back(make_rank(p, world, r, layout));
  }
  SWIFTQK_CUDA_TRY(cudaSetDevice(0));
  return d;
}

// One process, every rank on its own GPU; the launches of one call are issued back to back
// from this thread and run concurrently on the GPUs.
TEST(MultiGpu, OneProcessDrivesEveryGpu) {
  REQUIRE_GPUS(2);
  struct Shape {
    int64_t q, k;
    NormOrder order;
  };
  const Shape shapes[] = {{2048, 2048, NormOrder::kLlama},
                          {5120, 5120, NormOrder::kOlmo2},
                          {5120, 1024, NormOrder::kOlmo2},
                          {6144, 1024, NormOrder::kLlama}};
  for (int tp : tp_sizes()) {
    auto comms = Communicator::create_local_group(first_devices(tp));
    Streams st(tp);
    for (const Shape& sh : shapes) {
      for (int64_t tokens : {int64_t{1}, int64_t{64}, int64_t{4096}, int64_t{16500}}) {
        for (Layout layout : {Layout::kSeparate, Layout::kFusedInPlace}) {
          Problem p =
              Problem::random(tokens, sh.q, sh.k, DType::kBF16, sh.order, 1e-6f, tokens * 7 + sh.q);
          auto data = ranks_on_gpus(p, tp, layout);
          for (int r = 0; r < tp; ++r) {
            SWIFTQK_CUDA_TRY(cudaSetDevice(r));
            poison(data[r], st.s[r]);
            launch_qk_norm(comms[r], data[r].params, st.s[r]);
          }
          for (int r = 0; r < tp; ++r) comms[r].synchronize(st.s[r]);
          SWIFTQK_CUDA_TRY(cudaSetDevice(0));
          std::vector<RankData*> rp;
          for (auto& d : data) rp.push_back(&d);
          const Check c = check_ranks(p, tp, rp);
          EXPECT_EQ(c.wrong, 0) << "tp " << tp << " q " << sh.q << " k " << sh.k << " tokens "
                                << tokens << ": " << c.first_error;
          EXPECT_TRUE(c.rstd_identical) << "tp " << tp << " tokens " << tokens;
        }
      }
    }
  }
}

// Creating and destroying a group that spans GPUs leaves the caller's current device alone.
TEST(MultiGpu, GroupsKeepTheCurrentDevice) {
  REQUIRE_GPUS(2);
  for (int current : {0, 1}) {
    SWIFTQK_CUDA_TRY(cudaSetDevice(current));
    {
      auto comms = Communicator::create_local_group({1, 0});
      int now = -1;
      SWIFTQK_CUDA_TRY(cudaGetDevice(&now));
      EXPECT_EQ(now, current) << "after creating a group";
    }
    int now = -1;
    SWIFTQK_CUDA_TRY(cudaGetDevice(&now));
    EXPECT_EQ(now, current) << "after destroying a group";
  }
  SWIFTQK_CUDA_TRY(cudaSetDevice(0));
}

// Per-GPU CUDA graphs replayed many times with fresh inputs: the device counters stay in step.
TEST(MultiGpu, GraphReplaysOnEveryGpu) {
  REQUIRE_GPUS(2);
  const int tp = gpu_count();
  auto comms = Communicator::create_local_group(first_devices(tp));
  Streams st(tp);
  Problem p = Problem::random(200, 5120, 1024, DType::kBF16, NormOrder::kOlmo2, 1e-6f, 77);
  auto data = ranks_on_gpus(p, tp, Layout::kFusedOutOfPlace);
  std::vector<cudaGraphExec_t> exec(tp);
  for (int r = 0; r < tp; ++r) {
    SWIFTQK_CUDA_TRY(cudaSetDevice(r));
    exec[r] = capture_graph(st.s[r], [&] { launch_qk_norm(comms[r], data[r].params, st.s[r]); });
  }
  for (int round = 0; round < 10; ++round) {
    p.refill(900 + round);
    for (int r = 0; r < tp; ++r) {
      SWIFTQK_CUDA_TRY(cudaSetDevice(r));
      upload_inputs(p, tp, r, data[r], st.s[r]);
      poison(data[r], st.s[r]);
      for (int i = 0; i < 50; ++i) SWIFTQK_CUDA_TRY(cudaGraphLaunch(exec[r], st.s[r]));
    }
    for (int r = 0; r < tp; ++r) comms[r].synchronize(st.s[r]);
    SWIFTQK_CUDA_TRY(cudaSetDevice(0));
    std::vector<RankData*> rp;
    for (auto& d : data) rp.push_back(&d);
    EXPECT_EQ(check_ranks(p, tp, rp).wrong, 0) << "round " << round;
  }
  for (auto e : exec) SWIFTQK_CUDA_TRY(cudaGraphExecDestroy(e));
}

// One thread per GPU over an NCCL group of `world`, as an engine with one worker per GPU would
// run: rank r's thread sets GPU r, makes a stream and its NCCL rank, and runs body(r, nccl,
// stream, errors); what it throws is added to its errors. Returns each rank's errors.
template <typename Body>
std::vector<std::string> on_nccl_ranks(int world, Body body) {
  ncclUniqueId id;
  SWIFTQK_NCCL_TRY(ncclGetUniqueId(&id));
  std::vector<std::string> errors(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      ncclComm_t nccl = nullptr;
      cudaStream_t s = nullptr;
      try {
        SWIFTQK_CUDA_TRY(cudaSetDevice(r));
        SWIFTQK_CUDA_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
        SWIFTQK_NCCL_TRY(ncclCommInitRank(&nccl, world, id, r));
        body(r, nccl, s, errors[r]);
      } catch (const std::exception& e) {
        errors[r] += e.what();
      }
      if (nccl != nullptr) ncclCommDestroy(nccl);
      if (s != nullptr) cudaStreamDestroy(s);
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

// An NCCL group over every GPU, the communicator from it, and every method (the NCCL baselines
// too) checked against float64.
void nccl_group_runs_every_method(bool use_p2p) {
  const int world = gpu_count();
  const std::vector<std::string> errors =
      on_nccl_ranks(world, [&](int r, ncclComm_t nccl, cudaStream_t s, std::string& err) {
        CommConfig cfg;
        cfg.use_p2p = use_p2p;
        Communicator comm = Communicator::from_nccl(nccl, cfg, s);
        if (comm.rank() != r || comm.world_size() != world) err += "wrong rank/world; ";
        if (comm.p2p() != use_p2p) err += "p2p() is not what was asked; ";
        if (use_p2p && !comm.probe_peers(s)) err += "P2P write test failed; ";
        for (Method m : {Method::kSwiftQK, Method::kMiniMaxFused, Method::kAllGather,
                         Method::kCommOverlap, Method::kMiniMaxEager}) {
          for (NormOrder o : {NormOrder::kOlmo2, NormOrder::kLlama}) {
            for (int64_t tokens : {int64_t{1}, int64_t{300}, int64_t{5000}}) {
              Problem p = Problem::random(tokens, 5120, 1024, DType::kBF16, o, 1e-6f, tokens + 5);
              RankData d = make_rank(p, world, r, Layout::kFusedOutOfPlace);
              d.params.method = m;
              poison(d, s);
              launch_qk_norm(comm, d.params, s);
              comm.synchronize(s);
              const Check c = check_rank(p, world, r, d);
              if (c.wrong != 0) {
                err += to_string(m) + " " + to_string(o) + " tokens " + std::to_string(tokens) +
                       ": " + c.first_error + "; ";
              }
            }
          }
        }
      });
  for (int r = 0; r < world; ++r) EXPECT_EQ(errors[r], "") << "rank " << r << " p2p " << use_p2p;
}

TEST(MultiGpu, NcclGroupRunsEveryMethod) {
  REQUIRE_GPUS(2);
  nccl_group_runs_every_method(true);
}

// The group without P2P: the fused methods go through NCCL and stay correct.
TEST(MultiGpu, NcclGroupWithoutP2PRunsEveryMethod) {
  REQUIRE_GPUS(2);
  nccl_group_runs_every_method(false);
}

// A peer on another GPU that never calls: rank 0 fails within the timeout naming it, writes
// nothing, and after reset the group works again.
TEST(MultiGpu, MissingPeerOnAnotherGpuTimesOut) {
  REQUIRE_GPUS(2);
  CommConfig cfg;
  cfg.timeout_s = 0.2;
  auto comms = Communicator::create_local_group({0, 1}, cfg);
  Streams st(2);
  Problem p = Problem::random(64, 4096, 1024, DType::kBF16, NormOrder::kOlmo2, 1e-6f, 15);
  auto data = ranks_on_gpus(p, 2, Layout::kSeparate);
  poison(data[0], st.s[0]);
  const auto start = std::chrono::steady_clock::now();
  launch_qk_norm(comms[0], data[0].params, st.s[0]);
  // A call whose peer never came fails, naming it.
  expect_error([&] { comms[0].synchronize(st.s[0]); }, "waiting for rank 1");
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(secs, 5.0) << "the timeout of 0.2 s took " << secs << " s to surface";
  EXPECT_TRUE(census_rank(p, 2, 0, data[0]).all_nan());
  for (auto& c : comms) c.reset();
  for (int r = 0; r < 2; ++r) {
    SWIFTQK_CUDA_TRY(cudaSetDevice(r));
    launch_qk_norm(comms[r], data[r].params, st.s[r]);
  }
  for (int r = 0; r < 2; ++r) comms[r].synchronize(st.s[r]);
  SWIFTQK_CUDA_TRY(cudaSetDevice(0));
  EXPECT_EQ(check_ranks(p, 2, {&data[0], &data[1]}).wrong, 0);
}

// A peer on another GPU called with another token count: the token count is part of every
// k tag, so both ranks fail with a clear error and NaN outputs (without it, the rank with fewer
// tokens would take the other's first partials and return a wrong answer).
TEST(MultiGpu, PeerWithOtherTokenCountIsAnError) {
  REQUIRE_GPUS(2);
  CommConfig cfg;
  cfg.timeout_s = 0.2;
  auto comms = Communicator::create_local_group({0, 1}, cfg);
  Streams st(2);
  Problem a = Problem::random(96, 4096, 1024, DType::kBF16, NormOrder::kOlmo2, 1e-6f, 16);
  Problem b = Problem::random(32, 4096, 1024, DType::kBF16, NormOrder::kOlmo2, 1e-6f, 17);
  SWIFTQK_CUDA_TRY(cudaSetDevice(0));
  RankData r0 = make_rank(a, 2, 0, Layout::kSeparate);
  poison(r0, st.s[0]);
  launch_qk_norm(comms[0], r0.params, st.s[0]);
  SWIFTQK_CUDA_TRY(cudaSetDevice(1));
  RankData r1 = make_rank(b, 2, 1, Layout::kSeparate);
  poison(r1, st.s[1]);
  launch_qk_norm(comms[1], r1.params, st.s[1]);
  SWIFTQK_CUDA_TRY(cudaSetDevice(0));
  EXPECT_THROW(comms[0].synchronize(st.s[0]), Error);
  EXPECT_THROW(comms[1].synchronize(st.s[1]), Error);
  EXPECT_TRUE(census_rank(a, 2, 0, r0).all_nan());
  EXPECT_TRUE(census_rank(b, 2, 1, r1).all_nan());
}

// What comm.synchronize(s) raises, or "no error".
std::string synchronize_error(Communicator& comm, cudaStream_t s) {
  try {
    comm.synchronize(s);
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

// The NCCL fallback (no P2P) with a peer that skips a call: the eager all-reduce would wait
// for it for ever; the watchdog aborts the fallback's own NCCL communicator after timeout_s, the
// call's outputs are NaN, and the error names the rank and the tokens. reset() on every rank
// splits a new communicator, and the next call is correct again.
TEST(MultiGpu, NcclFallbackMissingPeerIsBoundedAndResetRecovers) {
  REQUIRE_GPUS(2);
  const int world = 2;
  std::vector<double> seconds(world, 0.0);
  std::atomic<bool> rank0_failed{false};
  const std::vector<std::string> errors =
      on_nccl_ranks(world, [&](int r, ncclComm_t nccl, cudaStream_t s, std::string& err) {
        CommConfig cfg;
        cfg.use_p2p = false;
        cfg.timeout_s = 0.5;
        Communicator comm = Communicator::from_nccl(nccl, cfg, s);
        Problem p = Problem::random(300, 5120, 1024, DType::kBF16, NormOrder::kOlmo2, 1e-6f, 41);
        RankData d = make_rank(p, world, r, Layout::kFusedOutOfPlace);
        auto call_is_correct = [&](const char* what) {
          poison(d, s);
          launch_qk_norm(comm, d.params, s);
          comm.synchronize(s);
          const Check c = check_rank(p, world, r, d);
          if (c.wrong != 0) err += std::string(what) + ": " + c.first_error + "; ";
        };
        call_is_correct("first call");
        if (r == 0) {  // a call rank 1 never makes
          poison(d, s);
          const auto start = std::chrono::steady_clock::now();
          launch_qk_norm(comm, d.params, s);
          const std::string msg = synchronize_error(comm, s);
          seconds[r] =
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
          for (const char* part : {"rank 0", "NCCL all-reduce", "tokens from 0", "reset()"}) {
            if (msg.find(part) == std::string::npos) {
              err += std::string("the error does not say '") + part + "': " + msg + "; ";
            }
          }
          if (!census_rank(p, world, r, d).all_nan()) err += "outputs not all NaN; ";
          // The next call raises before it enqueues anything.
          try {
            launch_qk_norm(comm, d.params, s);
            err += "a call after the failure did not raise; ";
          } catch (const Error&) {
          }
          rank0_failed = true;
        } else {
          const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(30);
          while (!rank0_failed && std::chrono::steady_clock::now() < end) {
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
          }
        }
        comm.reset();  // collective: a new exchange communicator on every rank
        call_is_correct("after reset");
      });
  for (int r = 0; r < world; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
  EXPECT_GT(seconds[0], 0.4) << "the error came before the 0.5 s bound";
  EXPECT_LT(seconds[0], 10.0) << "the 0.5 s bound took " << seconds[0] << " s to surface";
}

// The NCCL fallback with ranks that make one call with different eps: the all-reduce carries
// the per-call check, so both ranks raise code 7 with NaN outputs instead of normalising with a
// peer's mismatched sums; after reset() a call that agrees is correct.
TEST(MultiGpu, NcclFallbackRanksWithDifferentEpsAreCaught) {
  REQUIRE_GPUS(2);
  const int world = 2;
  const std::vector<std::string> errors =
      on_nccl_ranks(world, [&](int r, ncclComm_t nccl, cudaStream_t s, std::string& err) {
        CommConfig cfg;
        cfg.use_p2p = false;
        Communicator comm = Communicator::from_nccl(nccl, cfg, s);
        Problem p = Problem::random(200, 4096, 1024, DType::kBF16, NormOrder::kLlama, 1e-6f, 51);
        RankData d = make_rank(p, world, r, Layout::kFusedOutOfPlace);
        if (r == 1) d.params.eps = 1e-5f;  // rank 1 disagrees
        poison(d, s);
        launch_qk_norm(comm, d.params, s);
        const std::string msg = synchronize_error(comm, s);
        if (msg.find("different configurations") == std::string::npos) {
          err += "the error does not name the mismatch: " + msg + "; ";
        }
        if (!census_rank(p, world, r, d).all_nan()) err += "outputs not all NaN; ";
        comm.reset();
        d.params.eps = p.eps;
        poison(d, s);
        launch_qk_norm(comm, d.params, s);
        comm.synchronize(s);
        const Check c = check_rank(p, world, r, d);
        if (c.wrong != 0) err += "after reset: " + c.first_error + "; ";
      });
  for (int r = 0; r < world; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

}  // namespace
}  // namespace swiftqk::testing
