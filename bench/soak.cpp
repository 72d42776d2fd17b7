// swiftqk_bench --soak N: N graph-replayed calls on virtual ranks, each checked bitwise on the
// GPU, in windows of 1000 with the token count changing every window (one graph per token count,
// as engines capture one per batch size). Each token count has 4
// input sets, cycled call by call. The first call on a set runs eagerly into poisoned outputs and
// is checked against the float64 reference; its output bytes (Q, K and the 1/rms pairs of every
// rank) are then the expected bits of every later call on the set, since the outputs are
// deterministic for given inputs and launch shape. A compared graph holds 100 calls, each followed
// by a comparison kernel (bench/bitwise_compare.cu) that adds the elements differing from the
// expected bits to a device counter and fills the outputs with 0xFF, so a call that writes
// nothing fails too. Before the soak, controls show that the check can fail: the kernel on
// synthetic outputs, and per set a comparison with no call before it (every element must count),
// a second call (none may) and expected bits with bytes changed (exactly those must). After
// every 9 compared windows of a token count, one more window replays a second graph, the same
// calls without the comparisons (not counted in N, not compared): those windows time the op
// alone, and their drift (the median of a token count's last tenth of
// windows against its first tenth's) is the figure a leak or a growing wait would show; the
// compared windows' time includes the comparisons and is reported apart. Correctness across the
// 2^30 counter wrap is the GPU soak test's job (tests/gpu/test_graph_replay.cpp).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>
#include <string>

#include "bench_common.hpp"
#include "expected_outputs.hpp"

namespace swiftqk::bench {

namespace {

constexpr int kSets = 4;           // input sets per token count, cycled call by call
constexpr int kPerGraph = 100;     // calls a graph holds
constexpr int kPerWindow = 1000;   // calls between token-count switches, timed together
constexpr int kLatencyEvery = 10;  // every 10th window of a token count: the calls alone
static_assert(kPerGraph % kSets == 0 && kPerWindow % kPerGraph == 0,
              "a graph cycles the sets whole, and a window replays whole graphs");

// One input set of a token count: its inputs, its ranks' buffers, and the output bits of the
// first call on it (verified against float64), which every later call on it must write again.
struct InputSet {
  testing::Problem problem;
  std::vector<testing::RankData> ranks;
  std::vector<QkNormParams> params;
  std::optional<ExpectedOutputs> expected;
};

// One token count: its input sets, its two graphs and what its windows measured.
struct TokenCount {
  int64_t tokens = 0;
  std::vector<InputSet> sets;
  cudaGraphExec_t checked = nullptr;      // kPerGraph calls, each followed by its comparison
  cudaGraphExec_t calls_only = nullptr;   // the same calls without comparisons
  std::vector<double> checked_us, op_us;  // us per call of each window of either graph
  int64_t elements = 0;                   // elements one comparison covers
  int64_t changed = 0;                    // elements the corrupted-data control changed
  unsigned long long mismatches = 0;
};

void poison_all(TokenCount& tc, cudaStream_t s) {
  for (InputSet& set : tc.sets) {
    for (testing::RankData& r : set.ranks) testing::poison(r, s);
  }
}

// The first call on a set: eager, into poisoned outputs, checked against the float64 reference.
Check first_call(InputSet& set, int tp, const std::vector<Communicator*>& cp, cudaStream_t s) {
  for (testing::RankData& r : set.ranks) testing::poison(r, s);
  launch_qk_norm_group(cp, set.params, s);
  for (Communicator* c : cp) c->synchronize(s);
  std::vector<testing::RankData*> rp;
  for (testing::RankData& r : set.ranks) rp.push_back(&r);
  return testing::check_ranks(set.problem, tp, rp);
}

// One comparison of the set's outputs with `e`, counted from zero.
CompareCounts compare_once(const ExpectedOutputs& e, CompareCounter& c, cudaStream_t s) {
  c.reset(s);
  e.compare_and_poison(c, s);
  return c.read(s);
}

std::string count_text(unsigned long long n) { return std::to_string(n); }

// The controls that show the check of every call can fail, on a set whose outputs still hold
// the first call's bits. Throws, naming the control, unless each counts what it must; returns the
// elements the corrupted-data control changed.
int64_t run_controls(InputSet& set, const std::vector<Communicator*>& cp, CompareCounter& c,
                     cudaStream_t s) {
  const ExpectedOutputs& e = *set.expected;
  const auto n = static_cast<unsigned long long>(e.elements());
  const std::string where = "soak control, " + std::to_string(set.problem.tokens) + " tokens: ";
  // The outputs the expected bits were copied from: nothing may differ.
  const CompareCounts same = compare_once(e, c, s);
  SWIFTQK_EXPECTS(same.mismatches == 0 && same.compares == 1,
                  where + "the comparison counted " + count_text(same.mismatches) +
                      " mismatches on the outputs its expected bits were copied from");
  // No call since that comparison filled the outputs with 0xFF, replayed as a graph as the
  // soak's comparisons are: every element must count, as for a call that wrote nothing.
  c.reset(s);
  cudaGraphExec_t g = testing::capture_graph(s, [&] { e.compare_and_poison(c, s); });
  SWIFTQK_CUDA_TRY(cudaGraphLaunch(g, s));
  const CompareCounts skipped = c.read(s);
  SWIFTQK_CUDA_TRY(cudaGraphExecDestroy(g));
  SWIFTQK_EXPECTS(skipped.mismatches == n && skipped.compares == 1,
                  where + "with no call before it the comparison counted " +
                      count_text(skipped.mismatches) + " of " + count_text(n) +
                      " elements: the refill after each comparison is not effective");
  // A second call on the same inputs must write the same bits, or nothing can be checked bitwise.
  launch_qk_norm_group(cp, set.params, s);
  const CompareCounts again = compare_once(e, c, s);
  SWIFTQK_EXPECTS(again.mismatches == 0,
                  where + "a second call on the same inputs wrote " + count_text(again.mismatches) +
                      " elements that differ from the first call's: the outputs are not "
                      "deterministic, so they cannot be checked bitwise");
  // Expected bits with bytes changed: exactly the elements changed must count.
  int64_t changed = 0;
  const ExpectedOutputs bad = e.corrupted(s, changed);
  launch_qk_norm_group(cp, set.params, s);
  const CompareCounts corrupted = compare_once(bad, c, s);
  SWIFTQK_EXPECTS(corrupted.mismatches > 0 || changed == 0,
                  where + "the comparison kernel found no mismatch on corrupted data (" +
                      std::to_string(changed) + " elements changed)");
  SWIFTQK_EXPECTS(corrupted.mismatches == static_cast<unsigned long long>(changed),
                  where + "on corrupted data the comparison counted " +
                      count_text(corrupted.mismatches) + " mismatches, not the " +
                      std::to_string(changed) + " elements changed");
  for (Communicator* cm : cp) cm->check_error();
  return changed;
}

// The medians of the first and the last tenth of a token count's windows, and their drift.
struct Drift {
  bool measured = false;
  double first = 0, last = 0, drift = 0;
};

Drift drift_of(const std::vector<double>& us) {
  if (us.empty()) return {};
  const std::size_t w = std::max<std::size_t>(1, us.size() / 10);
  const double first = stats_of(std::vector<double>(us.begin(), us.begin() + w)).median;
  const double last = stats_of(std::vector<double>(us.end() - w, us.end())).median;
  return {true, first, last, last / first - 1.0};
}

json or_null(bool has, double v) { return has ? json(v) : json(nullptr); }

void print_drift(const Drift& d) {
  if (d.measured) {
    std::printf(" %12.3f %12.3f %+8.1f%%", d.first, d.last, 100 * d.drift);
  } else {
    std::printf(" %12s %12s %9s", "-", "-", "-");
  }
}

}  // namespace

int run_soak(const Sweep& sw, int tp, int64_t calls) {
  const Model& m = sw.models.at(0);
  const DType dt = sw.dtypes.at(0);
  const NormOrder order = sw.order_for(m);
  SWIFTQK_EXPECTS(m.q % tp == 0 && m.k % tp == 0, "--soak: the model's widths do not split by TP");
  SWIFTQK_EXPECTS(!sw.tokens.empty(), "--soak: no token counts");
  CommConfig cfg;
  int64_t max_t = 1;
  for (int64_t t : sw.tokens) max_t = std::max(max_t, t);
  cfg.token_capacity = std::max<int64_t>(16384, max_t);
  auto comms = Communicator::create_local_group(std::vector<int>(tp, 0), cfg);
  std::vector<Communicator*> cp;
  for (auto& c : comms) cp.push_back(&c);
  cudaStream_t s;
  SWIFTQK_CUDA_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const std::size_t kinds = sw.tokens.size();
  const int64_t compared_windows = (calls + kPerWindow - 1) / kPerWindow;
  std::printf(
      "soak: %lld calls of %s (%s, %s order) at TP %d on virtual ranks, each compared bitwise on "
      "the GPU; %zu token counts changing every %d calls, %d input sets each, cycled call by "
      "call; every %dth window of a token count, %d more calls alone (latency, not compared)\n",
      static_cast<long long>(compared_windows * kPerWindow), m.name.c_str(), to_string(dt).c_str(),
      to_string(order).c_str(), tp, kinds, kPerWindow, kSets, kLatencyEvery, kPerWindow);
  std::fflush(stdout);
  compare_kernel_self_test(s);

  // Every set's first call against float64, its expected bits and its controls, then the graphs.
  CompareCounter counter;
  std::vector<TokenCount> tcs(kinds);
  int64_t checks = 0;
  for (std::size_t i = 0; i < kinds; ++i) {
    TokenCount& tc = tcs[i];
    tc.tokens = sw.tokens[i];
    tc.sets.reserve(kSets);
    for (int j = 0; j < kSets; ++j) {
      tc.sets.push_back(
          {testing::Problem::random(tc.tokens, m.q, m.k, dt, order, m.eps, 500 + kSets * i + j),
           {},
           {},
           std::nullopt});
      InputSet& set = tc.sets.back();
      for (int r = 0; r < tp; ++r) {
        set.ranks.push_back(testing::make_rank(set.problem, tp, r, testing::Layout::kSeparate));
        apply_options(sw.options, set.ranks.back().params);
        set.params.push_back(set.ranks.back().params);
      }
      const Check chk = first_call(set, tp, cp, s);
      ++checks;
      const int64_t bad = chk.wrong + (chk.rstd_identical ? 0 : 1);
      if (bad > 0) {
        // Wrong expected bits would make every comparison meaningless: no soak.
        std::printf(
            "soak: the first call on input set %d of %lld tokens is wrong against float64: %lld "
            "elements wrong%s%s%s; the soak does not run\n",
            j, static_cast<long long>(tc.tokens), static_cast<long long>(chk.wrong),
            chk.rstd_identical ? "" : ", the ranks' 1/rms not identical",
            chk.first_error.empty() ? "" : ", ", chk.first_error.c_str());
        json rows = json::array();
        rows.push_back({{"method", "swiftqk"},
                        {"mode", "soak"},
                        {"model", m.name},
                        {"tp", tp},
                        {"tokens", tc.tokens},
                        {"dtype", to_string(dt)},
                        {"calls", 0},
                        {"checks", checks},
                        {"wrong", bad},
                        {"first_error", chk.first_error},
                        {"device", device_name()},
                        {"commit", sw.options.commit}});
        write_outputs(sw, rows);
        std::printf("FAILED: the first call on an input set is wrong (%lld wrong results)\n",
                    static_cast<long long>(bad));
        return 1;
      }
      set.expected.emplace(outputs_of(set.ranks), s);
      tc.elements = set.expected->elements();
      tc.changed = run_controls(set, cp, counter, s);
    }
    std::printf(
        "%lld tokens: %d first calls verified against float64; controls on each set: no call "
        "before a comparison counted %lld of %lld elements, a second call the same bits, "
        "changed expected bits %lld of %lld counted: ok\n",
        static_cast<long long>(tc.tokens), kSets, static_cast<long long>(tc.elements),
        static_cast<long long>(tc.elements), static_cast<long long>(tc.changed),
        static_cast<long long>(tc.changed));
    std::fflush(stdout);
  }
  for (TokenCount& tc : tcs) {
    tc.checked = testing::capture_graph(s, [&] {
      for (int j = 0; j < kPerGraph; ++j) {
        const InputSet& set = tc.sets[j % kSets];
        launch_qk_norm_group(cp, set.params, s);
        set.expected->compare_and_poison(counter, s);
      }
    });
    tc.calls_only = testing::capture_graph(s, [&] {
      for (int j = 0; j < kPerGraph; ++j) launch_qk_norm_group(cp, tc.sets[j % kSets].params, s);
    });
    poison_all(tc, s);
  }
  counter.reset(s);
  CompareCounts seen = counter.read(s);

  cudaEvent_t a, b;
  SWIFTQK_CUDA_TRY(cudaEventCreate(&a));
  SWIFTQK_CUDA_TRY(cudaEventCreate(&b));
  int64_t compared_calls = 0, latency_calls = 0;
  int reported = 0;
  for (int64_t w = 0; compared_calls < compared_windows * kPerWindow; ++w) {
    TokenCount& tc = tcs[static_cast<std::size_t>(w) % kinds];
    const bool latency = (w / static_cast<int64_t>(kinds)) % kLatencyEvery == kLatencyEvery - 1;
    const cudaGraphExec_t g = latency ? tc.calls_only : tc.checked;
    SWIFTQK_CUDA_TRY(cudaEventRecord(a, s));
    for (int j = 0; j < kPerWindow / kPerGraph; ++j) SWIFTQK_CUDA_TRY(cudaGraphLaunch(g, s));
    SWIFTQK_CUDA_TRY(cudaEventRecord(b, s));
    SWIFTQK_CUDA_TRY(cudaEventSynchronize(b));
    float ms = 0;
    SWIFTQK_CUDA_TRY(cudaEventElapsedTime(&ms, a, b));
    (latency ? tc.op_us : tc.checked_us).push_back(ms * 1000.0 / kPerWindow);
    (latency ? latency_calls : compared_calls) += kPerWindow;
    try {
      for (auto& c : comms) c.check_error();
    } catch (const std::exception& e) {
      std::printf("soak: window %lld (%lld tokens, %lld calls before it): %s\n",
                  static_cast<long long>(w), static_cast<long long>(tc.tokens),
                  static_cast<long long>(w * kPerWindow), e.what());
      throw;
    }
    const CompareCounts now = counter.read(s);
    const unsigned long long found = now.mismatches - seen.mismatches;
    seen = now;
    tc.mismatches += found;
    if (found > 0 && reported++ < 10) {
      std::printf("soak: window %lld (%lld tokens): %llu mismatching elements\n",
                  static_cast<long long>(w), static_cast<long long>(tc.tokens), found);
      std::fflush(stdout);
    }
    // The calls alone leave valid outputs: refilled, so the next compared call must write them.
    if (latency) poison_all(tc, s);
  }

  const unsigned long long mismatches = seen.mismatches, checked_calls = seen.compares;
  const bool every_call = checked_calls == static_cast<unsigned long long>(compared_calls);
  std::printf(
      "soak: %lld calls: %lld in compared windows, of which %llu compared bitwise on the GPU "
      "(%s), %llu mismatching elements; %lld in latency-only windows (the calls alone, not "
      "compared)\n",
      static_cast<long long>(compared_calls + latency_calls),
      static_cast<long long>(compared_calls), checked_calls,
      every_call ? "every one" : "NOT every one", mismatches,
      static_cast<long long>(latency_calls));
  std::printf(
      "latency per call, medians of the first and the last tenth of each token count's windows:\n"
      "  op: the calls alone (latency-only windows); checked: each call with its comparison "
      "kernel (compared windows)\n");
  std::printf("%8s %12s %12s %9s %12s %12s %9s %11s\n", "tokens", "op_first_us", "op_last_us",
              "op_drift", "chk_first_us", "chk_last_us", "chk_drift", "mismatches");
  json all = json::array();
  for (const TokenCount& tc : tcs) {
    const Drift op = drift_of(tc.op_us), chk = drift_of(tc.checked_us);
    std::printf("%8lld", static_cast<long long>(tc.tokens));
    print_drift(op);
    print_drift(chk);
    std::printf(" %11llu\n", tc.mismatches);
    all.push_back({{"method", "swiftqk"},
                   {"mode", "soak"},
                   {"model", m.name},
                   {"tp", tp},
                   {"tokens", tc.tokens},
                   {"dtype", to_string(dt)},
                   {"calls", compared_calls + latency_calls},
                   {"checks", checks},
                   // The op alone: the latency-only windows (what the soak reported before the
                   // per-call comparison, then from every window).
                   {"first_median_us", or_null(op.measured, op.first)},
                   {"last_median_us", or_null(op.measured, op.last)},
                   {"drift", or_null(op.measured, op.drift)},
                   {"latency_windows", tc.op_us.size()},
                   // Each call with its comparison kernel: the compared windows.
                   {"checked_first_median_us", or_null(chk.measured, chk.first)},
                   {"checked_last_median_us", or_null(chk.measured, chk.last)},
                   {"checked_drift", or_null(chk.measured, chk.drift)},
                   {"checked_windows", tc.checked_us.size()},
                   {"input_sets", kSets},
                   {"compared_elements_per_call", tc.elements},
                   {"compared_calls", compared_calls},
                   {"latency_only_calls", latency_calls},
                   {"checked_calls", checked_calls},
                   {"checked_every_call", every_call},
                   {"mismatches", mismatches},
                   {"mismatches_at_tokens", tc.mismatches},
                   {"wrong", 0},
                   {"device", device_name()},
                   {"commit", sw.options.commit}});
  }
  write_outputs(sw, all);
  for (TokenCount& tc : tcs) {
    SWIFTQK_CUDA_TRY(cudaGraphExecDestroy(tc.checked));
    SWIFTQK_CUDA_TRY(cudaGraphExecDestroy(tc.calls_only));
  }
  SWIFTQK_CUDA_TRY(cudaEventDestroy(a));
  SWIFTQK_CUDA_TRY(cudaEventDestroy(b));
  SWIFTQK_CUDA_TRY(cudaStreamDestroy(s));
  if (!every_call) {
    std::printf("FAILED: %llu comparisons ran, not one for each of the %lld compared calls\n",
                checked_calls, static_cast<long long>(compared_calls));
  }
  if (mismatches > 0) {
    std::printf("FAILED: %llu mismatching elements in %lld calls compared bitwise\n", mismatches,
                static_cast<long long>(compared_calls));
  }
  if (!every_call || mismatches > 0) return 1;
  std::printf(
      "soak: 0 mismatches in %lld calls compared bitwise on the GPU, every one; %lld first calls "
      "verified against float64\n",
      static_cast<long long>(compared_calls), static_cast<long long>(checks));
  return 0;
}

}  // namespace swiftqk::bench
