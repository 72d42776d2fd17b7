// swiftqk_fault_report: the failure scenarios of docs/design.md ("Failure semantics") on one GPU,
// each injected on fresh communicators (virtual ranks, or two in-process ranks that meet through
// IpcBootstrap), with what the caller saw, the time to the error and every output element of the
// call classified as correct (within the dtype's tolerance of float64), NaN, or wrong (finite and
// out of tolerance: a silent error). Prints a markdown table, writes the rows as JSON (--json),
// and exits 1 if any output was wrong or any scenario did not end as it must (`ok` false).
// This measures and reports; the GPU tests (tests/gpu/test_failure_semantics.cu,
// test_epilogue_failures.cpp) assert the same behaviour.
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "concurrent_replays.hpp"
#include "epilogue_problem.hpp"
#include "failure_helpers.hpp"
#include "problem.hpp"
#include "sm_hog.hpp"
#include "stream_gate.hpp"

namespace swiftqk::bench {
namespace {

using namespace swiftqk::testing;

struct Row {
  std::string scenario, injected, saw;
  double seconds = 0;  // launch (or call) to the error the caller saw
  int64_t correct = 0, nan = 0, wrong = 0;
  bool ok = false;  // ended as docs/design.md says it must
};

Row row(std::string scenario, std::string injected) {
  Row r;
  r.scenario = std::move(scenario);
  r.injected = std::move(injected);
  return r;
}

void add(Row& r, const Census& c) {
  r.correct += c.correct;
  r.nan += c.nan;
  r.wrong += c.wrong;
}

// The first line of an error, which names the rank, the peer and the token.
std::string first_line(const std::string& s) {
  const std::string line = s.substr(0, s.find('\n'));
  return line.size() > 160 ? line.substr(0, 157) + "..." : line;
}

// Runs fn, which must throw swiftqk::Error: the message, and the seconds from the call.
std::pair<std::string, double> caught(const std::function<void()>& fn) {
  const auto start = Clock::now();
  try {
    fn();
  } catch (const Error& e) {
    return {first_line(e.what()), seconds_since(start)};
  }
  return {"", seconds_since(start)};
}

constexpr int64_t kTokens = 64, kQ = 4096, kK = 1024;

Problem problem(uint64_t seed) {
  return Problem::random(kTokens, kQ, kK, DType::kBF16, NormOrder::kOlmo2, 1e-6f, seed);
}

// A late peer: rank 0 calls, rank 1 does not (yet), then rank 1 calls after rank 0 has failed.
// Then a graph captured before the fault is replayed, a capture is attempted, and a collective
// reset is followed by 1000 replays compared bit for bit with a checked call.
void late_peer_and_recovery(std::vector<Row>& rows) {
  CommConfig cfg;
  cfg.timeout_s = 1.0;
  auto comms = Communicator::create_local_group({0, 0}, cfg);
  std::vector<Communicator*> cp{&comms[0], &comms[1]};
  Problem p = problem(11);
  RankData r0 = make_rank(p, 2, 0, Layout::kFusedOutOfPlace);
  RankData r1 = make_rank(p, 2, 1, Layout::kFusedOutOfPlace);
  cudaStream_t s = new_stream(), s1 = new_stream();
  cudaGraphExec_t before = capture_graph(s, [&] {
    launch_qk_norm_group(cp, {r0.params, r1.params}, s);
  });
  poison(r0, s);
  poison(r1, s);
  SWIFTQK_CUDA_TRY(cudaStreamSynchronize(s));

  Row a = row("late peer: the rank that waits", "rank 1 makes no call; rank 0 calls (timeout 1 s)");
  launch_qk_norm(comms[0], r0.params, s);
  std::tie(a.saw, a.seconds) = caught([&] { comms[0].synchronize(s); });
  add(a, census_rank(p, 2, 0, r0));
  a.ok = comms[0].failure().code == 1u && comms[0].failure().peer == 1 && a.nan > 0;
  rows.push_back(a);

  Row b = row("late peer: the late rank", "rank 1 calls after rank 0 has failed");
  const auto start = Clock::now();
  launch_qk_norm(comms[1], r1.params, s1);
  b.saw = caught([&] { comms[1].synchronize(s1); }).first;
  b.seconds = seconds_since(start);
  add(b, census_rank(p, 2, 1, r1));
  b.ok = comms[1].failure().code == 3u && b.correct == 0 && !b.saw.empty();
  rows.push_back(b);

  Row c = row("replay after the failure", "10 replays of a graph of both ranks captured before it");
  for (int i = 0; i < 10; ++i) {
    poison(r0, s);
    poison(r1, s);
    const auto t = Clock::now();
    const cudaError_t launched = cudaGraphLaunch(before, s);
    const cudaError_t synced = cudaStreamSynchronize(s);
    c.seconds = std::max(c.seconds, seconds_since(t));
    if (launched != cudaSuccess || synced != cudaSuccess) c.saw = "a CUDA error";
    add(c, census_rank(p, 2, 0, r0));
    add(c, census_rank(p, 2, 1, r1));
  }
  if (c.saw.empty()) c.saw = "cudaSuccess; check_error(): " + first_line(error_of(comms[0]));
  c.ok = c.correct == 0 && c.nan > 0 && !error_of(comms[0]).empty();
  rows.push_back(c);

  Row d = row("capture after the failure", "stream capture of both ranks' launch");
  SWIFTQK_CUDA_TRY(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  std::tie(d.saw, d.seconds) = caught([&] { launch_qk_norm_group(cp, {r0.params, r1.params}, s); });
  cudaGraph_t g = nullptr;
  (void)cudaStreamEndCapture(s, &g);
  if (g != nullptr) SWIFTQK_CUDA_TRY(cudaGraphDestroy(g));
  (void)cudaGetLastError();
  d.ok = !d.saw.empty();
  rows.push_back(d);

  Row e =
      row("reset, then 1000 replays", "reset() of the group, the graph captured before the fault");
  const auto t = Clock::now();
  comms[0].reset();
  e.seconds = seconds_since(t);
  poison(r0, s);
  poison(r1, s);
  SWIFTQK_CUDA_TRY(cudaGraphLaunch(before, s));
  SWIFTQK_CUDA_TRY(cudaStreamSynchronize(s));
  add(e, census_rank(p, 2, 0, r0));
  add(e, census_rank(p, 2, 1, r1));
  const int mismatched =
      replays_unlike(before, s, {&r0, &r1}, {output_bytes(r0), output_bytes(r1)}, 1000);
  e.saw = std::to_string(1000 - mismatched) + " of 1000 replays equal to the checked call";
  e.wrong += mismatched;
  e.ok = e.wrong == 0 && e.nan == 0 && error_of(comms[0]).empty();
  rows.push_back(e);
  SWIFTQK_CUDA_TRY(cudaGraphExecDestroy(before));
  SWIFTQK_CUDA_TRY(cudaStreamDestroy(s));
  SWIFTQK_CUDA_TRY(cudaStreamDestroy(s1));
}

// Two graphs of one communicator pair replayed at once on two streams, each within half the SMs,
// on different inputs; five attempts, a reset after each.
void two_replays_at_once(std::vector<Row>& rows) {
  ConcurrentReplays x(21, 22);
  Row r = row("two replays at once", "graphs of the same communicators on two streams, 5 attempts");
  int caught_second = 0;
  bool consistent = true;
  for (int it = 0; it < 5; ++it) {
    x.poison_all();
    const Together run = x.replay();
    SWIFTQK_CUDA_TRY(run.a);
    SWIFTQK_CUDA_TRY(run.b);
    const int64_t nan_before = r.nan;
    add(r, census_rank(x.pa, 2, 0, x.a0));
    add(r, census_rank(x.pa, 2, 1, x.a1));
    add(r, census_rank(x.pb, 2, 0, x.b0));
    add(r, census_rank(x.pb, 2, 1, x.b1));
    bool failed = false;
    for (Communicator& c : x.comms) {
      if (c.failure().code == 0u) continue;
      failed = true;
      if (c.failure().code == 2u) {
        ++caught_second;
        r.seconds = std::max(r.seconds, run.seconds);
        if (r.saw.empty()) r.saw = first_line(error_of(c));
        break;
      }
    }
    // NaN exactly when a failure was recorded: neither a silent stop nor an error with every
    // output correct.
    consistent = consistent && (r.nan > nan_before) == failed;
    x.comms[0].reset();
  }
  // Whether the two replays overlap is up to the GPU's scheduler; what must hold is that no
  // output is wrong and every attempt's outputs agree with what was recorded.
  r.saw = std::to_string(caught_second) + " of 5 caught" +
          (caught_second == 0 ? " (the replays did not overlap)" : ": " + r.saw);
  r.ok = r.wrong == 0 && consistent;
  rows.push_back(r);
}

// Two in-process ranks that meet through IpcBootstrap, as threads of an engine would.
std::vector<Communicator> ipc_pair(const CommConfig& cfg) {
  IpcBootstrap b0(0, 2, 0, cfg), b1(1, 2, 0, cfg);
  const std::vector<std::vector<uint8_t>> h{b0.local_handle(), b1.local_handle()};
  std::vector<Communicator> comms;
  comms.push_back(b0.connect(h));
  comms.push_back(b1.connect(h));
  return comms;
}

// Teardown while a peer is late: rank 1's kernel still waits for rank 0 when rank 0 closes; and
// a peer that never comes to the close barrier.
void teardown(std::vector<Row>& rows) {
  CommConfig cfg;
  cfg.timeout_s = 0.5;
  {
    std::vector<Communicator> pair = ipc_pair(cfg);
    Problem p = problem(31);
    RankData r1 = make_rank(p, 2, 1, Layout::kSeparate);
    poison(r1, nullptr);
    cudaStream_t s1 = new_stream();
    Row r =
        row("close while a peer is late", "rank 1's call waits for rank 0; rank 0 calls close()");
    launch_qk_norm(pair[1], r1.params, s1);
    std::string late_error;
    std::thread late([&] {
      late_error = caught([&] { pair[1].synchronize(s1); }).first;
      pair[1].close();
    });
    const auto start = Clock::now();
    std::string closed_error = caught([&] { pair[0].close(); }).first;
    r.seconds = seconds_since(start);
    late.join();
    add(r, census_rank(p, 2, 1, r1));
    r.saw = "rank 0's close() returned after the late rank's kernel ended (" +
            (closed_error.empty() ? std::string("no error") : closed_error) +
            "); rank 1: " + late_error;
    r.ok = closed_error.empty() && !late_error.empty() && r.seconds >= 0.8 * cfg.timeout_s &&
           pair[0].closed() && pair[1].closed();
    rows.push_back(r);
    SWIFTQK_CUDA_TRY(cudaStreamDestroy(s1));
  }
  {
    std::vector<Communicator> pair = ipc_pair(cfg);
    Row r = row("close with a peer that never comes", "rank 1 does not call close()");
    std::tie(r.saw, r.seconds) = caught([&] { pair[0].close(); });
    r.ok = !r.saw.empty() && pair[0].closed();
    rows.push_back(r);
    pair[1].close();  // rank 0's barrier word is there: it passes
  }
}

// Beside a kernel that holds SMs on another stream: with CommConfig.sm_budget leaving them
// alone, a TP-4 group launch completes while that kernel still runs; without a budget, with
// half the SMs held, the launch completes or fails loudly (NaN and an error), never wrong.
void beside_a_kernel_that_holds_sms(std::vector<Row>& rows) {
  int sms = 0;
  SWIFTQK_CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  for (const bool budget : {true, false}) {
    CommConfig cfg;
    const int free_sms = 12;
    if (budget) cfg.sm_budget = free_sms / 2;  // head-room: blocks land on any free SM
    cfg.timeout_s = budget ? 10.0 : 0.2;
    const int world = budget ? 4 : 2;
    auto comms = Communicator::create_local_group(std::vector<int>(world, 0), cfg);
    std::vector<Communicator*> cp;
    for (auto& c : comms) cp.push_back(&c);
    Problem p = Problem::random(budget ? 512 : 8192, kQ, kK, DType::kBF16, NormOrder::kOlmo2, 1e-6f,
                                budget ? 61 : 62);
    std::vector<RankData> ranks;
    std::vector<QkNormParams> params;
    for (int r = 0; r < world; ++r) {
      ranks.push_back(make_rank(p, world, r, Layout::kSeparate));
      poison(ranks.back(), nullptr);
      params.push_back(ranks.back().params);
    }
    cudaStream_t hog = new_stream(), s = new_stream();
    cudaEvent_t hog_done;
    SWIFTQK_CUDA_TRY(cudaEventCreate(&hog_done));
    SWIFTQK_CUDA_TRY(cudaDeviceSynchronize());
    Row r = budget ? row("beside a kernel holding SMs, with a budget",
                         "SMs - 12 held for 2 s; TP 4, sm_budget 6")
                   : row("beside a kernel holding SMs, no budget",
                         "half the SMs held for 1.5 s; TP 2 of 8192 tokens, timeout 0.2 s");
    launch_sm_hog(budget ? sms - free_sms : sms / 2, budget ? 2'000'000'000 : 1'500'000'000, hog);
    SWIFTQK_CUDA_TRY(cudaEventRecord(hog_done, hog));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the hog is resident first
    const auto start = Clock::now();
    launch_qk_norm_group(cp, params, s);
    SWIFTQK_CUDA_TRY(cudaStreamSynchronize(s));
    r.seconds = seconds_since(start);
    const bool hog_running = cudaEventQuery(hog_done) == cudaErrorNotReady;
    SWIFTQK_CUDA_TRY(cudaEventSynchronize(hog_done));
    (void)cudaGetLastError();  // the query's not-ready
    bool failed = false;
    for (int i = 0; i < world; ++i) {
      add(r, census_rank(p, world, i, ranks[i]));
      failed = failed || comms[i].failure().code != 0;
    }
    if (failed) {
      r.saw = "failed loudly: " +
              first_line(error_of(comms[0]).empty() ? error_of(comms[1]) : error_of(comms[0]));
    } else {
      r.saw = std::string("completed") + (hog_running ? " while the SMs were held" : " after");
    }
    // With a budget the call must complete beside the hog; without, complete or fail loudly,
    // NaN exactly when a failure was recorded.
    r.ok = r.wrong == 0 && (r.nan > 0) == failed && (budget ? !failed && hog_running : true);
    rows.push_back(r);
    SWIFTQK_CUDA_TRY(cudaEventDestroy(hog_done));
    SWIFTQK_CUDA_TRY(cudaStreamDestroy(hog));
    SWIFTQK_CUDA_TRY(cudaStreamDestroy(s));
  }
}

void unbounded_timeout(std::vector<Row>& rows) {
  CommConfig cfg;
  cfg.timeout_s = std::numeric_limits<double>::infinity();
  Row r = row("unbounded timeout", "CommConfig.timeout_s = inf");
  std::tie(r.saw, r.seconds) = caught([&] { (void)Communicator::create_local_group({0, 0}, cfg); });
  r.ok = !r.saw.empty();
  rows.push_back(r);
}

// The fused epilogue: a bad position and a bad slot found on the device (TP 2), and a late peer.
// Correct and NaN count Q's elements; wrong counts every wrong element of Q, k_out, K and V in
// the cache, and every cache byte changed outside the call's slots.
void epilogue(std::vector<Row>& rows) {
  for (int kind = 0; kind < 3; ++kind) {
    CommConfig cfg;
    cfg.timeout_s = 1.0;
    auto comms = Communicator::create_local_group({0, 0}, cfg);
    std::vector<Communicator*> cp{&comms[0], &comms[1]};
    EpilogueSetup st;
    st.tokens = 48;
    st.q_heads = 40;
    st.kv_heads = 8;
    st.seed = 41 + kind;
    EpilogueHost h = EpilogueHost::random(st);
    const int64_t bad = 17;
    Row r;
    if (kind == 0) {
      h.ref.positions[bad] = st.max_position;
      r = row("epilogue: position out of range (Q elements counted)",
              "token 17's position = max_position");
    } else if (kind == 1) {
      h.slots[bad] = h.cache_slots() + 5;
      r = row("epilogue: slot out of range (Q elements counted)",
              "token 17's slot = the cache's slots + 5");
    } else {
      r = row("epilogue: late peer (Q elements counted)",
              "rank 1 makes no call; rank 0 calls (timeout 1 s)");
    }
    std::vector<EpilogueRank> d;
    std::vector<CacheSnapshot> before;
    for (int i = 0; i < 2; ++i) {
      d.push_back(make_epilogue_rank(h, 2, i));
      poison_epilogue(d.back(), 50 + i, nullptr);
      before.push_back(snapshot_caches(d.back()));
    }
    cudaStream_t s = new_stream();
    const auto start = Clock::now();
    if (kind < 2) {
      launch_qk_epilogue_group(cp, {d[0].params, d[1].params}, s);
      SWIFTQK_CUDA_TRY(cudaStreamSynchronize(s));
      r.saw = caught([&] { comms[0].check_error(); }).first;
    } else {
      launch_qk_epilogue(comms[0], d[0].params, s);
      r.saw = caught([&] { comms[0].synchronize(s); }).first;
    }
    r.seconds = seconds_since(start);
    const ref::EpilogueExpected gold = ref::epilogue_fp64(h.ref);
    const int ranks = kind < 2 ? 2 : 1;
    for (int i = 0; i < ranks; ++i) {
      const EpilogueCheck c = kind < 2 ? check_epilogue_rank(h, gold, 2, i, d[i], before[i], {bad})
                                       : check_epilogue_rank(h, gold, 2, i, d[i], before[i], {},
                                                             1.0, EpilogueExpect::kCorrectOrFailed);
      const int64_t q_elems = st.tokens * st.q_heads / 2 * st.head_dim;
      const int64_t bad_q = kind < 2 ? st.q_heads / 2 * st.head_dim : c.q_nan;
      r.nan += bad_q;
      r.wrong += c.q_wrong + c.k_wrong + c.v_wrong + c.k_out_wrong + c.cache_changed;
      r.correct += q_elems - bad_q - c.q_wrong;
    }
    r.ok = !r.saw.empty() && r.wrong == 0 && r.nan > 0;
    rows.push_back(r);
    SWIFTQK_CUDA_TRY(cudaStreamDestroy(s));
  }
}

void print(const std::vector<Row>& rows) {
  std::printf(
      "| scenario | how it was injected | what the caller saw | time to the error (s) | "
      "outputs correct / NaN / wrong | as designed |\n|---|---|---|---:|---|---|\n");
  for (const Row& r : rows) {
    std::string saw = r.saw;
    for (char& ch : saw) {
      if (ch == '|') ch = '/';
    }
    std::printf("| %s | %s | %s | %.3f | %lld / %lld / %lld | %s |\n", r.scenario.c_str(),
                r.injected.c_str(), saw.c_str(), r.seconds, static_cast<long long>(r.correct),
                static_cast<long long>(r.nan), static_cast<long long>(r.wrong),
                r.ok ? "yes" : "NO");
  }
}

}  // namespace
}  // namespace swiftqk::bench

int main(int argc, char** argv) {
  using namespace swiftqk;
  using namespace swiftqk::bench;
  CLI::App app{"The failure scenarios on one GPU: what the caller sees, how fast, and the outputs"};
  std::string json_path;
  app.add_option("--json", json_path, "write the rows here");
  CLI11_PARSE(app, argc, argv);
  if (!testing::has_gpu()) {
    std::printf("swiftqk_fault_report: no CUDA GPU on this machine: no scenario can run here\n");
    return 0;
  }
  std::vector<Row> rows;
  try {
    late_peer_and_recovery(rows);
    two_replays_at_once(rows);
    teardown(rows);
    beside_a_kernel_that_holds_sms(rows);
    unbounded_timeout(rows);
    epilogue(rows);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "swiftqk_fault_report: a scenario threw where it must not: %s\n",
                 e.what());
    print(rows);
    return 1;
  }
  print(rows);
  bool all_ok = true;
  int64_t wrong = 0;
  nlohmann::json j = nlohmann::json::array();
  for (const Row& r : rows) {
    all_ok = all_ok && r.ok;
    wrong += r.wrong;
    j.push_back({{"scenario", r.scenario},
                 {"injected", r.injected},
                 {"saw", r.saw},
                 {"seconds", r.seconds},
                 {"correct", r.correct},
                 {"nan", r.nan},
                 {"wrong", r.wrong},
                 {"ok", r.ok}});
  }
  if (!json_path.empty()) std::ofstream(json_path) << j.dump(1) << "\n";
  std::printf("%zu scenarios, %lld wrong output elements, %s\n", rows.size(),
              static_cast<long long>(wrong), all_ok ? "all as designed" : "NOT all as designed");
  return all_ok && wrong == 0 ? 0 : 1;
}
