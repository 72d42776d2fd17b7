// swiftqk_bench --soak N: N graph-replayed calls on virtual ranks with the token count changing
// every 1000 calls (one graph per token count, as engines capture one per batch size), every
// 50000th call checked against the float64 reference on fresh inputs, and the latency recorded
// per window of calls: the figure is how much the last windows' latency differs from the first
// ones' (drift), which a leak or a growing wait would show. Correctness across the 2^30 counter
// wrap is the GPU soak test's job (tests/gpu/test_graph_replay.cpp).
#include <algorithm>
#include <cstdio>

#include "bench_common.hpp"

namespace swiftqk::bench {

int run_soak(const Sweep& sw, int tp, int64_t calls) {
  const Model& m = sw.models.at(0);
  const DType dt = sw.dtypes.at(0);
  const NormOrder order = sw.order_for(m);
  SWIFTQK_EXPECTS(m.q % tp == 0 && m.k % tp == 0, "--soak: the model's widths do not split by TP");
  CommConfig cfg;
  int64_t max_t = 1;
  for (int64_t t : sw.tokens) max_t = std::max(max_t, t);
  cfg.token_capacity = std::max<int64_t>(16384, max_t);
  auto comms = Communicator::create_local_group(std::vector<int>(tp, 0), cfg);
  std::vector<Communicator*> cp;
  for (auto& c : comms) cp.push_back(&c);
  cudaStream_t s;
  SWIFTQK_CUDA_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));

  const int per_graph = 100, per_switch = 1000, check_every = 50'000;
  const std::size_t kinds = sw.tokens.size();
  std::vector<testing::Problem> problems;
  std::vector<std::vector<testing::RankData>> data(kinds);
  std::vector<cudaGraphExec_t> graphs(kinds);
  for (std::size_t i = 0; i < kinds; ++i) {
    problems.push_back(testing::Problem::random(sw.tokens[i], m.q, m.k, dt, order, m.eps, 500 + i));
    std::vector<QkNormParams> pp;
    for (int r = 0; r < tp; ++r) {
      data[i].push_back(testing::make_rank(problems[i], tp, r, testing::Layout::kSeparate));
      apply_options(sw.options, data[i].back().params);
      pp.push_back(data[i].back().params);
    }
    graphs[i] = testing::capture_graph(s, [&] {
      for (int j = 0; j < per_graph; ++j) launch_qk_norm_group(cp, pp, s);
    });
  }
  cudaEvent_t a, b;
  SWIFTQK_CUDA_TRY(cudaEventCreate(&a));
  SWIFTQK_CUDA_TRY(cudaEventCreate(&b));
  // us per call of each timed block of per_switch calls, by token-count kind
  std::vector<std::vector<double>> us(kinds);
  int64_t wrong = 0, checks = 0;
  for (int64_t n = 0; n < calls; n += per_switch) {
    const std::size_t i = static_cast<std::size_t>(n / per_switch) % kinds;
    SWIFTQK_CUDA_TRY(cudaEventRecord(a, s));
    for (int j = 0; j < per_switch / per_graph; ++j)
      SWIFTQK_CUDA_TRY(cudaGraphLaunch(graphs[i], s));
    SWIFTQK_CUDA_TRY(cudaEventRecord(b, s));
    SWIFTQK_CUDA_TRY(cudaEventSynchronize(b));
    float ms = 0;
    SWIFTQK_CUDA_TRY(cudaEventElapsedTime(&ms, a, b));
    us[i].push_back(ms * 1000.0 / per_switch);
    for (auto& c : comms) c.check_error();
    if ((n + per_switch) % check_every == 0 || n + per_switch >= calls) {
      problems[i].refill(static_cast<uint64_t>(n));
      std::vector<QkNormParams> pp;
      for (int r = 0; r < tp; ++r) {
        testing::upload_inputs(problems[i], tp, r, data[i][r], s);
        testing::poison(data[i][r], s);
        pp.push_back(data[i][r].params);
      }
      launch_qk_norm_group(cp, pp, s);  // one eager call, on the same counters
      for (auto& c : comms) c.synchronize(s);
      std::vector<testing::RankData*> rp;
      for (auto& d : data[i]) rp.push_back(&d);
      const Check chk = testing::check_ranks(problems[i], tp, rp);
      wrong += chk.wrong + (chk.rstd_identical ? 0 : 1);
      ++checks;
    }
  }
  // Drift: the median of the last tenth of each kind's blocks against the first tenth's.
  json all = json::array();
  std::printf(
      "soak: %lld calls, %s, TP %d virtual ranks, %zu token counts, %lld checks, %lld wrong\n",
      static_cast<long long>(calls), m.name.c_str(), tp, kinds, static_cast<long long>(checks),
      static_cast<long long>(wrong));
  std::printf("%8s %12s %12s %8s\n", "tokens", "first_us", "last_us", "drift");
  for (std::size_t i = 0; i < kinds; ++i) {
    const std::size_t w = std::max<std::size_t>(1, us[i].size() / 10);
    const Stats first = stats_of(std::vector<double>(us[i].begin(), us[i].begin() + w));
    const Stats last = stats_of(std::vector<double>(us[i].end() - w, us[i].end()));
    const double drift = last.median / first.median - 1.0;
    std::printf("%8lld %12.3f %12.3f %+7.1f%%\n", static_cast<long long>(sw.tokens[i]),
                first.median, last.median, 100 * drift);
    all.push_back({{"method", "swiftqk"},
                   {"mode", "soak"},
                   {"model", m.name},
                   {"tp", tp},
                   {"tokens", sw.tokens[i]},
                   {"dtype", to_string(dt)},
                   {"calls", calls},
                   {"checks", checks},
                   {"first_median_us", first.median},
                   {"last_median_us", last.median},
                   {"drift", drift},
                   {"wrong", wrong},
                   {"device", device_name()},
                   {"commit", sw.options.commit}});
  }
  for (auto g : graphs) SWIFTQK_CUDA_TRY(cudaGraphExecDestroy(g));
  SWIFTQK_CUDA_TRY(cudaEventDestroy(a));
  SWIFTQK_CUDA_TRY(cudaEventDestroy(b));
  SWIFTQK_CUDA_TRY(cudaStreamDestroy(s));
  return finish(sw, all, wrong);
}

}  // namespace swiftqk::bench
