// Programmatic dependent launch (QkNormParams::pdl): a fused launch may be scheduled while the
// kernel before it on the stream is still running, so it must wait for that kernel's writes
// before reading its inputs, and for the previous call's counter before using a slot bank.
#include <gtest/gtest.h>

#include <ostream>
#include <string>
#include <vector>

#include "expect_error.hpp"
#include "problem.hpp"
#include "require_gpu.hpp"

namespace swiftqk::testing {
namespace {

constexpr int kMaxCopies = 8;
struct Copies {
  const uint4* src[kMaxCopies];
  uint4* dst[kMaxCopies];
  int64_t vectors[kMaxCopies];
  int count;
};

// An engine's producer (the QKV projection) that lets its dependents be scheduled at once and
// writes their inputs only after `ns` nanoseconds: a dependent that read before waiting would
// read the poison left in the input buffers.
__global__ void late_producer_kernel(const __grid_constant__ Copies c, uint64_t ns) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
  uint64_t start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < ns);
  for (int j = 0; j < c.count; ++j) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < c.vectors[j];
         i += int64_t(gridDim.x) * blockDim.x) {
      c.dst[j][i] = c.src[j][i];
    }
  }
}

bool pdl_supported() {
  int major = 0;
  SWIFTQK_CUDA_TRY(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
  return major >= 9;
}

#define REQUIRE_PDL_GPU() \
  REQUIRE_GPU();          \
  if (!pdl_supported()) GTEST_SKIP() << "programmatic dependent launch needs sm_90 or later"

// One data set of a group: every rank's buffers, and a copy of their inputs the producer
// writes into them.
struct Set {
  std::vector<RankData> ranks;
  std::vector<DeviceBuffer> staged;
};

Set make_set(const Problem& p, int world, bool pdl) {
  Set s;
  for (int r = 0; r < world; ++r) {
    s.ranks.push_back(make_rank(p, world, r, Layout::kSeparate));
    s.ranks.back().params.pdl = pdl;
    s.staged.emplace_back(s.ranks.back().in.bytes());
  }
  return s;
}

// Fresh inputs into the staging copies; the input buffers themselves get NaN bytes, and the
// outputs are poisoned.
void stage_fresh(Problem& p, int world, Set& s, uint64_t seed, cudaStream_t st) {
  p.refill(seed);
  for (int r = 0; r < world; ++r) {
    RankData& d = s.ranks[r];
    upload_inputs(p, world, r, d, st);
    SWIFTQK_CUDA_TRY(
        cudaMemcpyAsync(s.staged[r].get(), d.in.get(), d.in.bytes(), cudaMemcpyDeviceToDevice, st));
    SWIFTQK_CUDA_TRY(cudaMemsetAsync(d.in.get(), 0xFF, d.in.bytes(), st));
    poison(d, st);
  }
}

void launch_producer(const Set& s, cudaStream_t st) {
  Copies c{};
  c.count = static_cast<int>(s.ranks.size());
  for (int r = 0; r < c.count; ++r) {
    c.src[r] = s.staged[r].get<uint4>();
    c.dst[r] = s.ranks[r].in.get<uint4>();
    c.vectors[r] = static_cast<int64_t>(s.ranks[r].in.bytes() / sizeof(uint4));
  }
  late_producer_kernel<<<64, 256, 0, st>>>(c, 20'000);
  SWIFTQK_CUDA_TRY(cudaGetLastError());
}

void launch_set(std::vector<Communicator*>& cp, const Set& s, cudaStream_t st) {
  std::vector<QkNormParams> pp;
  for (const auto& d : s.ranks) pp.push_back(d.params);
  launch_qk_norm_group(cp, pp, st);
}

void expect_correct(const Problem& p, int world, Set& s, const std::string& what) {
  std::vector<RankData*> rp;
  for (auto& d : s.ranks) rp.push_back(&d);
  const Check chk = check_ranks(p, world, rp);
  EXPECT_EQ(chk.wrong, 0) << what << ": " << chk.first_error;
  EXPECT_TRUE(chk.rstd_identical) << what;
}

struct PdlCase {
  int world;
  int64_t tokens;
  Method method;
};

// gtest prints a parameter in the test's listing and in failures: readable values, not bytes.
void PrintTo(const PdlCase& c, std::ostream* os) {
  *os << "tp" << c.world << "_t" << c.tokens << "_" << to_string(c.method);
}

class Pdl : public ::testing::TestWithParam<PdlCase> {};

// Eager: producer, then the PDL launch; then a graph of the producer and `chain` PDL launches
// back to back on different data (each launch's predecessor is the previous call on the same
// communicators, so its call counter must be read only after that call ends), replayed with
// fresh inputs each time.
TEST_P(Pdl, WaitsForTheProducerAndThePreviousCall) {
  REQUIRE_PDL_GPU();
  const PdlCase c = GetParam();
  const int chain = 3;
  CommConfig cfg;
  cfg.timeout_s = wait_s(10.0);
  auto comms = Communicator::create_local_group(std::vector<int>(c.world, 0), cfg);
  std::vector<Communicator*> cp;
  for (auto& x : comms) cp.push_back(&x);
  cudaStream_t st;
  SWIFTQK_CUDA_TRY(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  std::vector<Problem> problems;
  std::vector<Set> sets;
  for (int i = 0; i < chain; ++i) {
    problems.push_back(
        Problem::random(c.tokens, 2048, 1024, DType::kBF16, NormOrder::kLlama, 1e-5f, 70 + i));
    sets.push_back(make_set(problems.back(), c.world, true));
    for (auto& d : sets.back().ranks) d.params.method = c.method;
  }

  stage_fresh(problems[0], c.world, sets[0], 1, st);
  launch_producer(sets[0], st);
  launch_set(cp, sets[0], st);
  for (auto& x : comms) x.synchronize(st);
  expect_correct(problems[0], c.world, sets[0], "eager");

  cudaGraphExec_t ge = capture_graph(st, [&] {
    launch_producer(sets[0], st);
    for (int i = 0; i < chain; ++i) launch_set(cp, sets[i], st);
  });
  for (int rep = 0; rep < 20; ++rep) {
    stage_fresh(problems[0], c.world, sets[0], 100 + rep, st);
    for (int i = 1; i < chain; ++i) {
      problems[i].refill(200 + 10 * rep + i);
      for (int r = 0; r < c.world; ++r) {
        upload_inputs(problems[i], c.world, r, sets[i].ranks[r], st);
        poison(sets[i].ranks[r], st);
      }
    }
    SWIFTQK_CUDA_TRY(cudaGraphLaunch(ge, st));
    for (auto& x : comms) x.synchronize(st);
    for (int i = 0; i < chain; ++i) {
      expect_correct(problems[i], c.world, sets[i],
                     "replay " + std::to_string(rep) + ", launch " + std::to_string(i));
    }
    if (HasFailure()) break;
  }
  SWIFTQK_CUDA_TRY(cudaGraphExecDestroy(ge));
  SWIFTQK_CUDA_TRY(cudaStreamDestroy(st));
}

std::string pdl_case_name(const ::testing::TestParamInfo<PdlCase>& i) {
  return "tp" + std::to_string(i.param.world) + "_t" + std::to_string(i.param.tokens) +
         (i.param.method == Method::kSwiftQK ? "_swiftqk" : "_minimax_fused");
}

INSTANTIATE_TEST_SUITE_P(
    Cases, Pdl,
    ::testing::Values(PdlCase{1, 1, Method::kSwiftQK}, PdlCase{1, 4099, Method::kSwiftQK},
                      PdlCase{2, 64, Method::kSwiftQK}, PdlCase{2, 4099, Method::kSwiftQK},
                      PdlCase{4, 7, Method::kSwiftQK}, PdlCase{8, 1000, Method::kSwiftQK},
                      PdlCase{2, 64, Method::kMiniMaxFused},
                      PdlCase{4, 1000, Method::kMiniMaxFused}),
    pdl_case_name);

TEST(PdlGroup, RanksMustAgree) {
  REQUIRE_GPU();
  auto comms = Communicator::create_local_group({0, 0});
  std::vector<Communicator*> cp = {&comms[0], &comms[1]};
  Problem p = Problem::random(8, 256, 256, DType::kBF16, NormOrder::kOlmo2, 1e-6f, 5);
  Set s = make_set(p, 2, true);
  s.ranks[1].params.pdl = false;
  cudaStream_t st;
  SWIFTQK_CUDA_TRY(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  for (int r = 0; r < 2; ++r) poison(s.ranks[r], st);
  // A group launch whose ranks disagree on pdl is refused.
  expect_error([&] { launch_set(cp, s, st); }, "pdl");
  SWIFTQK_CUDA_TRY(cudaStreamSynchronize(st));
  for (int r = 0; r < 2; ++r) EXPECT_TRUE(outputs_untouched(p, 2, s.ranks[r]));
  SWIFTQK_CUDA_TRY(cudaStreamDestroy(st));
}

}  // namespace
}  // namespace swiftqk::testing
