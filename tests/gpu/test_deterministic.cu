// The deterministic mode on virtual ranks: the same output bits at TP 1, 2, 4, 8 and 16, for
// every model shape, dtype and norm order, for one token alone or inside a batch, and the same
// sums as the host's emulation of the canonical order; what it cannot do is refused before
// anything is written.
#include <gtest/gtest.h>
#include <nccl.h>

#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "comm_state.hpp"
#include "expect_error.hpp"
#include "launch_plan.hpp"
#include "nccl_allreduce_fallback.hpp"
#include "problem.hpp"
#include "reference.hpp"
#include "require_gpu.hpp"

namespace swiftqk::testing {
namespace {

// Full outputs reassembled from the ranks' shards, and rank 0's 1/rms.
struct Gathered {
  std::vector<uint8_t> q, k;
  std::vector<float> rstd;
};

bool tp_allowed(const Problem& p, int world) {
  if (p.q_width % world != 0 || p.k_width % world != 0) return false;
  try {
    deterministic_kernel_shape(p.q_width / world, p.k_width / world,
                               static_cast<int>(16 / dtype_size(p.in)), world, 256);
    return true;
  } catch (const Error&) {
    return false;
  }
}

Gathered gather_outputs(const Problem& p, int world, const std::vector<RankData>& ranks);

// One call of p at TP `world` (virtual ranks, one group launch), checked against float64 first.
Gathered run_at(const Problem& p, int world, bool det = true, int64_t capacity = 16384,
                const LaunchTuning& tuning = {}) {
  CommConfig cfg;
  cfg.token_capacity = capacity;
  cfg.chunk_oversize = true;
  cfg.timeout_s = wait_s(10.0);
  auto comms = Communicator::create_local_group(std::vector<int>(world, 0), cfg);
  std::vector<RankData> ranks;
  std::vector<Communicator*> cp;
  std::vector<QkNormParams> pp;
  for (int r = 0; r < world; ++r) {
    ranks.push_back(make_rank(p, world, r, Layout::kSeparate));
    ranks.back().params.deterministic = det;
    ranks.back().params.tuning = tuning;
    poison(ranks.back(), nullptr);
  }
  for (int r = 0; r < world; ++r) {
    cp.push_back(&comms[r]);
    pp.push_back(ranks[r].params);
  }
  SWIFTQK_CUDA_TRY(cudaDeviceSynchronize());
  launch_qk_norm_group(cp, pp, nullptr);
  for (auto& c : comms) c.synchronize(nullptr);
  std::vector<RankData*> rp;
  for (auto& d : ranks) rp.push_back(&d);
  const Check chk = check_ranks(p, world, rp);
  EXPECT_EQ(chk.wrong, 0) << "TP " << world << ": " << chk.first_error;
  EXPECT_TRUE(chk.rstd_identical) << "TP " << world;

  return gather_outputs(p, world, ranks);
}

// The ranks' outputs of p at TP `world`, reassembled into full rows, and rank 0's 1/rms.
Gathered gather_outputs(const Problem& p, int world, const std::vector<RankData>& ranks) {
  const std::size_t os = dtype_size(p.out());
  const int64_t T = p.tokens, qs = p.q_width / world, ks = p.k_width / world;
  Gathered g;
  g.q.resize(T * p.q_width * os);
  g.k.resize(T * p.k_width * os);
  std::vector<uint8_t> host(T * (qs + ks) * os);
  for (int r = 0; r < world; ++r) {
    SWIFTQK_CUDA_TRY(
        cudaMemcpy(host.data(), ranks[r].out.get(), host.size(), cudaMemcpyDeviceToHost));
    for (int64_t t = 0; t < T; ++t) {
      std::memcpy(&g.q[(t * p.q_width + r * qs) * os], &host[t * qs * os], qs * os);
      std::memcpy(&g.k[(t * p.k_width + r * ks) * os], &host[(T * qs + t * ks) * os], ks * os);
    }
  }
  g.rstd.resize(2 * T);
  SWIFTQK_CUDA_TRY(cudaMemcpy(g.rstd.data(), ranks[0].rstd.get(), 2 * T * sizeof(float),
                              cudaMemcpyDeviceToHost));
  return g;
}

// The first differing element of two gathered outputs, or "" when they are bitwise equal.
std::string first_difference(const Gathered& a, const Gathered& b, std::size_t elem) {
  for (std::size_t i = 0; i < a.q.size(); i += elem) {
    if (std::memcmp(&a.q[i], &b.q[i], elem) != 0) return "q element " + std::to_string(i / elem);
  }
  for (std::size_t i = 0; i < a.k.size(); i += elem) {
    if (std::memcmp(&a.k[i], &b.k[i], elem) != 0) return "k element " + std::to_string(i / elem);
  }
  if (std::memcmp(a.rstd.data(), b.rstd.data(), a.rstd.size() * sizeof(float)) != 0) {
    return "rstd";
  }
  return "";
}

struct Case {
  int64_t tokens, q_width, k_width;
  DType in;
  NormOrder order;
  int64_t capacity = 16384;
};

std::string name_of(const Case& c) {
  return "t" + std::to_string(c.tokens) + "_q" + std::to_string(c.q_width) + "_k" +
         std::to_string(c.k_width) + "_" + to_string(c.in) + "_" + to_string(c.order) +
         (c.capacity == 16384 ? "" : "_cap" + std::to_string(c.capacity));
}
void PrintTo(const Case& c, std::ostream* os) { *os << name_of(c); }

class TpInvariant : public ::testing::TestWithParam<Case> {};

TEST_P(TpInvariant, EveryTpDegreeWritesTheSameBits) {
  REQUIRE_GPU();
  const Case c = GetParam();
  const Problem p = Problem::random(c.tokens, c.q_width, c.k_width, c.in, c.order, 1e-6f, 4242);
  const Gathered tp1 = run_at(p, 1, true, c.capacity);
  int compared = 0;
  for (int world : {2, 4, 8, 16}) {
    if (!tp_allowed(p, world)) continue;
    const Gathered g = run_at(p, world, true, c.capacity);
    EXPECT_EQ(first_difference(tp1, g, dtype_size(p.out())), "")
        << name_of(c) << ": TP " << world << " differs from TP 1";
    ++compared;
  }
  EXPECT_GE(compared, 2) << name_of(c) << ": too few TP degrees allow the widths";
}

std::vector<Case> tp_cases() {
  // docs/design.md's shapes: OLMoE, OLMo2-7B, OLMo2-13B, OLMo3-32B, MiniMax-M2.
  const std::vector<std::pair<int64_t, int64_t>> shapes = {
      {2048, 2048}, {4096, 4096}, {5120, 5120}, {5120, 1024}, {6144, 1024}};
  std::vector<Case> v;
  for (auto [q, k] : shapes) {
    for (NormOrder o : {NormOrder::kOlmo2, NormOrder::kLlama}) {
      for (int64_t t : {1, 333}) v.push_back({t, q, k, DType::kBF16, o});
    }
  }
  for (DType dt : {DType::kF16, DType::kF32, DType::kF8E4M3}) {
    v.push_back({333, 2048, 2048, dt, NormOrder::kOlmo2});
    v.push_back({64, 6144, 1024, dt, NormOrder::kLlama});
  }
  v.push_back({4096, 5120, 1024, DType::kBF16, NormOrder::kOlmo2});
  v.push_back({16384, 2048, 2048, DType::kBF16, NormOrder::kLlama});
  // More tokens than the workspace holds: launches of 4096 tokens and a shorter last one.
  v.push_back({10000, 2048, 2048, DType::kBF16, NormOrder::kLlama, 4096});
  // A row too wide to stage (the streamed path): 16384 + 16384 elements.
  v.push_back({7, 16384, 16384, DType::kBF16, NormOrder::kOlmo2});
  return v;
}
INSTANTIATE_TEST_SUITE_P(Deterministic, TpInvariant, ::testing::ValuesIn(tp_cases()),
                         [](const auto& info) { return name_of(info.param); });

// The NCCL fallback's group of one rank (no P2P), made once for all the runs of a test: an NCCL
// communicator takes far longer to create than a run.
struct FallbackGroup {
  ncclComm_t nccl = nullptr;
  std::optional<Communicator> comm;
  FallbackGroup() {
    ncclUniqueId id;
    SWIFTQK_NCCL_TRY(ncclGetUniqueId(&id));
    SWIFTQK_NCCL_TRY(ncclCommInitRank(&nccl, 1, id, 0));
    CommConfig cfg;
    cfg.use_p2p = false;
    comm.emplace(Communicator::from_nccl(nccl, cfg, nullptr));
    EXPECT_FALSE(comm->p2p());
  }
  ~FallbackGroup() {
    comm.reset();  // the communicator goes before the NCCL group it was made from
    const ncclResult_t r = ncclCommDestroy(nccl);
    EXPECT_EQ(r, ncclSuccess) << ncclGetErrorString(r);
  }
  FallbackGroup(const FallbackGroup&) = delete;
  FallbackGroup& operator=(const FallbackGroup&) = delete;
};

// The NCCL fallback (a group without P2P) in the deterministic mode at TP `world` on one GPU: a
// group of one runs launch_qk_norm end to end (its partials and scale); for TP 2-16, where NCCL
// would need a GPU per rank, each virtual rank's canonical partials go into the buffer where
// ncclAllGather puts them, then each rank's rank tree and scale run as the fallback runs them.
Gathered run_fallback_at(Communicator& comm, const Problem& p, int world) {
  Gathered g;
  {
    std::vector<RankData> ranks;
    for (int r = 0; r < world; ++r) {
      ranks.push_back(make_rank(p, world, r, Layout::kSeparate));
      ranks.back().params.deterministic = true;
      poison(ranks.back(), nullptr);
    }
    SWIFTQK_CUDA_TRY(cudaDeviceSynchronize());
    if (world == 1) {
      launch_qk_norm(comm, ranks[0].params, nullptr);
      comm.synchronize(nullptr);
    } else {
      // Each rank's block in the gather: its T partials, then its per-call check floats (the
      // same hash on every rank, so the check passes and the outputs are the sums').
      const int64_t T = p.tokens, stride = T + kConfigCheckFloats / 2;
      const uint32_t hash = 0x5eed1234u;
      float2 *gathered = nullptr, *sums = nullptr;
      SWIFTQK_CUDA_TRY(cudaMalloc(&gathered, world * stride * sizeof(float2)));
      SWIFTQK_CUDA_TRY(cudaMalloc(&sums, stride * sizeof(float2)));
      float* check = reinterpret_cast<float*>(sums + T);
      const int segments = kCanonicalSegments / world;
      for (int r = 0; r < world; ++r) {
        const QkNormParams& q = ranks[r].params;
        float2* mine = gathered + r * stride;
        detail::launch_canonical_partials(p.in, detail::rank_args_for(comm.state(), q, 0), T,
                                          q.q.width, q.k.width, segments, mine, nullptr,
                                          reinterpret_cast<float*>(mine + T), hash);
      }
      detail::launch_canonical_ranks(gathered, world, T, stride, sums, check, nullptr);
      for (int r = 0; r < world; ++r) {
        const QkNormParams& q = ranks[r].params;
        detail::launch_apply_scale(
            p.in, detail::rank_args_for(comm.state(), q, 0), T, q.q.width, q.k.width, true, p.order,
            sums, false, 1.f / static_cast<float>(p.q_width), 1.f / static_cast<float>(p.k_width),
            q.eps, nullptr, nullptr, check, hash, world);
      }
      SWIFTQK_CUDA_TRY(cudaDeviceSynchronize());
      SWIFTQK_CUDA_TRY(cudaFree(gathered));
      SWIFTQK_CUDA_TRY(cudaFree(sums));
    }
    std::vector<RankData*> rp;
    for (auto& d : ranks) rp.push_back(&d);
    const Check chk = check_ranks(p, world, rp);
    EXPECT_EQ(chk.wrong, 0) << "fallback TP " << world << ": " << chk.first_error;
    g = gather_outputs(p, world, ranks);
  }
  return g;
}

// Without P2P the deterministic mode gives the fused path's bits, at every TP degree: the
// canonical partials, the rank tree over the gathered partials and the same scale.
TEST(Deterministic, TheNcclFallbackWritesTheFusedPathsBits) {
  REQUIRE_GPU();
  FallbackGroup group;
  int compared = 0;
  for (const Case& c : tp_cases()) {
    if (c.capacity != 16384 || c.tokens > 4096) continue;  // one chunk: the fallback's path
    const Problem p = Problem::random(c.tokens, c.q_width, c.k_width, c.in, c.order, 1e-6f, 777);
    const Gathered fused = run_at(p, 1);
    for (int world : {1, 2, 4, 8, 16}) {
      if (!tp_allowed(p, world)) continue;
      EXPECT_EQ(
          first_difference(fused, run_fallback_at(*group.comm, p, world), dtype_size(p.out())), "")
          << name_of(c) << ": the fallback at TP " << world << " differs from the fused TP 1";
      ++compared;
    }
  }
  EXPECT_GE(compared, 40);
}

// Every launch shape the tuning may force (vectors per thread, and so the lanes a thread holds;
// stage depth; block size) writes the bits of the tuned shape, at TP 1, 2 and 8.
TEST(Deterministic, EveryForcedLaunchShapeWritesTheSameBits) {
  REQUIRE_GPU();
  struct Shape {
    int64_t q, k;
    NormOrder order;
  };
  for (const Shape sh : {Shape{2048, 2048, NormOrder::kLlama}, Shape{5120, 5120, NormOrder::kOlmo2},
                         Shape{6144, 1024, NormOrder::kLlama}}) {
    const Problem p = Problem::random(333, sh.q, sh.k, DType::kBF16, sh.order, 1e-6f, 777);
    const Gathered want = run_at(p, 1);
    int compared = 0, refused = 0;
    for (int world : {1, 2, 8}) {
      for (int vpt : {0, 2, 4, 8}) {
        for (int stages : {0, 2, 5}) {
          for (int block : {0, 64, 1024}) {
            LaunchTuning t;
            t.vectors_per_thread = vpt;
            t.stages = stages;
            t.block_threads = block;
            const std::string at = std::to_string(sh.q) + ":" + std::to_string(sh.k) + " TP " +
                                   std::to_string(world) + " vpt " + std::to_string(vpt) +
                                   " stages " + std::to_string(stages) + " block " +
                                   std::to_string(block);
            bool fits = true;
            try {
              deterministic_kernel_shape(sh.q / world, sh.k / world, 8, world, 256, vpt);
            } catch (const Error& e) {
              fits = false;  // e.g. 40 vectors a segment in 2 slots a thread
              EXPECT_NE(std::string(e.what()).find("vectors per thread"), std::string::npos) << at;
            }
            if (!fits) {
              ++refused;
              continue;
            }
            Gathered g;
            try {
              g = run_at(p, world, true, 16384, t);
            } catch (const Error& e) {
              // A block too large for the kernel's registers cannot be resident: refused, not run.
              EXPECT_NE(std::string(e.what()).find("occupancy 0"), std::string::npos)
                  << at << ": " << e.what();
              ++refused;
              continue;
            }
            EXPECT_EQ(first_difference(want, g, dtype_size(p.out())), "") << at;
            ++compared;
          }
        }
      }
    }
    EXPECT_GE(compared, 40) << sh.q << ":" << sh.k << " (" << refused << " refused)";
  }
}

// The block order (interleaved from 2048 tokens with peers, or forced) changes which block
// serves a token, never the order of a sum: both orders write TP 1's bits.
TEST(Deterministic, BothBlockOrdersWriteTheSameBits) {
  REQUIRE_GPU();
  const Problem p = Problem::random(2500, 5120, 5120, DType::kBF16, NormOrder::kOlmo2, 1e-6f, 31);
  const Gathered want = run_at(p, 1);
  for (int world : {2, 8}) {
    for (auto order : {LaunchTuning::BlockOrder::kTuned, LaunchTuning::BlockOrder::kRankMajor,
                       LaunchTuning::BlockOrder::kInterleaved}) {
      LaunchTuning t;
      t.block_order = order;
      EXPECT_EQ(first_difference(want, run_at(p, world, true, 16384, t), dtype_size(p.out())), "")
          << "TP " << world << ", block order " << static_cast<int>(order);
    }
  }
}

TEST(Deterministic, DefaultModeDiffersAcrossTpDegrees) {
  // The negative control: without the mode, TP 1 and TP 8 sum in other orders, so the
  // comparison above would see different bits for these rows.
  REQUIRE_GPU();
  const Problem p = Problem::random(333, 5120, 5120, DType::kBF16, NormOrder::kOlmo2, 1e-6f, 99);
  const Gathered a = run_at(p, 1, false), b = run_at(p, 8, false);
  EXPECT_NE(first_difference(a, b, 2), "");
}

TEST(Deterministic, ATokenAloneAndInABatchOf4096GetTheSameBits) {
  REQUIRE_GPU();
  Problem batch = Problem::random(4096, 5120, 1024, DType::kBF16, NormOrder::kLlama, 1e-6f, 5);
  Problem one = Problem::random(1, 5120, 1024, DType::kBF16, NormOrder::kLlama, 1e-6f, 6);
  one.wq = batch.wq;
  one.wk = batch.wk;
  one.wqd = batch.wqd;
  one.wkd = batch.wkd;
  const int64_t row = 1234, os = 2;
  std::memcpy(one.q.data(), &batch.q[row * 5120 * os], 5120 * os);
  std::memcpy(one.k.data(), &batch.k[row * 1024 * os], 1024 * os);
  std::copy(batch.qd.begin() + row * 5120, batch.qd.begin() + (row + 1) * 5120, one.qd.begin());
  std::copy(batch.kd.begin() + row * 1024, batch.kd.begin() + (row + 1) * 1024, one.kd.begin());
  for (int world : {1, 8}) {
    const Gathered b = run_at(batch, world), a = run_at(one, world);
    EXPECT_EQ(std::memcmp(a.q.data(), &b.q[row * 5120 * os], 5120 * os), 0) << "TP " << world;
    EXPECT_EQ(std::memcmp(a.k.data(), &b.k[row * 1024 * os], 1024 * os), 0) << "TP " << world;
    EXPECT_EQ(std::memcmp(a.rstd.data(), &b.rstd[2 * row], 2 * sizeof(float)), 0) << "TP " << world;
  }
}

__global__ void inv_rms_of(const float* sums, int n, float inv_full, float eps, float* out) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = rsqrtf(sums[i] * inv_full + eps);  // the kernel's inv_rms
}

TEST(Deterministic, SumsAreTheHostEmulationOfTheCanonicalOrder) {
  REQUIRE_GPU();
  for (DType dt : {DType::kBF16, DType::kF8E4M3, DType::kF32}) {
    const int64_t T = 64, Q = 4096, K = 1024;
    const Problem p = Problem::random(T, Q, K, dt, NormOrder::kOlmo2, 1e-6f, 31);
    const int vec = static_cast<int>(16 / dtype_size(dt));
    std::vector<float> sums(2 * T), row;
    for (int64_t t = 0; t < T; ++t) {
      for (int which = 0; which < 2; ++which) {
        const int64_t w = which == 0 ? Q : K;
        const std::vector<uint8_t>& src = which == 0 ? p.q : p.k;
        row.resize(w);
        for (int64_t i = 0; i < w; ++i) {
          row[i] = static_cast<float>(ref::load_element(src.data(), dt, t * w + i));
        }
        sums[2 * t + which] =
            ref::canonical_sum_of_squares(row.data(), w, vec, which == 0 ? p.q_scale : p.k_scale);
      }
    }
    // The device's inverse square root of the host's sums, one list per tensor.
    DeviceBuffer d_sums(2 * T * sizeof(float)), d_out(2 * T * sizeof(float));
    std::vector<float> want(2 * T), qs(T), ks(T);
    for (int64_t t = 0; t < T; ++t) {
      qs[t] = sums[2 * t];
      ks[t] = sums[2 * t + 1];
    }
    for (int which = 0; which < 2; ++which) {
      const std::vector<float>& s = which == 0 ? qs : ks;
      SWIFTQK_CUDA_TRY(
          cudaMemcpy(d_sums.get(), s.data(), T * sizeof(float), cudaMemcpyHostToDevice));
      inv_rms_of<<<1, 64>>>(d_sums.get<float>(), static_cast<int>(T),
                            1.0f / static_cast<float>(which == 0 ? Q : K), p.eps,
                            d_out.get<float>());
      SWIFTQK_CUDA_TRY(cudaGetLastError());
      std::vector<float> r(T);
      SWIFTQK_CUDA_TRY(
          cudaMemcpy(r.data(), d_out.get(), T * sizeof(float), cudaMemcpyDeviceToHost));
      for (int64_t t = 0; t < T; ++t) want[2 * t + which] = r[t];
    }
    for (int world : {1, 4, 16}) {
      const Gathered g = run_at(p, world);
      EXPECT_EQ(std::memcmp(g.rstd.data(), want.data(), want.size() * sizeof(float)), 0)
          << to_string(dt) << " TP " << world << ": rstd[0] " << g.rstd[0] << " want " << want[0];
    }
  }
}

// What the mode cannot do is refused at launch, naming it, and nothing is written.
void expect_refused(const Problem& p, int world, Method method, const std::string& needle) {
  CommConfig cfg;
  cfg.timeout_s = wait_s(10.0);
  auto comms = Communicator::create_local_group(std::vector<int>(world, 0), cfg);
  std::vector<RankData> ranks;
  std::vector<Communicator*> cp;
  std::vector<QkNormParams> pp;
  for (int r = 0; r < world; ++r) {
    ranks.push_back(make_rank(p, world, r, Layout::kSeparate));
    ranks.back().params.deterministic = true;
    ranks.back().params.method = method;
    poison(ranks.back(), nullptr);
  }
  for (int r = 0; r < world; ++r) {
    cp.push_back(&comms[r]);
    pp.push_back(ranks[r].params);
  }
  SWIFTQK_CUDA_TRY(cudaDeviceSynchronize());
  expect_error([&] { launch_qk_norm_group(cp, pp, nullptr); }, {needle});
  SWIFTQK_CUDA_TRY(cudaDeviceSynchronize());
  for (int r = 0; r < world; ++r) EXPECT_TRUE(outputs_untouched(p, world, ranks[r])) << r;
}

TEST(Deterministic, RefusesWhatItCannotDoAndWritesNothing) {
  REQUIRE_GPU();
  expect_refused(Problem::random(8, 3072, 3072, DType::kBF16, NormOrder::kOlmo2, 1e-6f, 1), 3,
                 Method::kSwiftQK, "TP degree 3");
  expect_refused(Problem::random(8, 1600, 1600, DType::kBF16, NormOrder::kOlmo2, 1e-6f, 2), 2,
                 Method::kSwiftQK, "800");
  expect_refused(Problem::random(8, 2048, 2048, DType::kBF16, NormOrder::kOlmo2, 1e-6f, 3), 2,
                 Method::kMiniMaxFused, "Method::kSwiftQK");
}

}  // namespace
}  // namespace swiftqk::testing
