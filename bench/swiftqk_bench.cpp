// swiftqk_bench: verifies and times QK-norm methods over model shapes, token counts, TP degrees
// and dtypes. Every timed configuration is first checked against the float64 reference (the
// `wrong` column); any wrong result makes the tool exit non-zero. On one GPU, TP > 1 runs as
// virtual ranks in one launch.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "copy_kernel.hpp"
#include "problem.hpp"
#include "swiftqk/plan.hpp"

using namespace swiftqk;
using namespace swiftqk::testing;
using json = nlohmann::json;

namespace {

struct Model {
  std::string name;
  int64_t q, k;
  float eps;
  NormOrder order;  // what the model's own reference implementation does
};

const std::vector<Model>& known_models() {
  static const std::vector<Model> m = {
      {"olmoe", 2048, 2048, 1e-5f, NormOrder::kLlama},
      {"olmo2-7b", 4096, 4096, 1e-6f, NormOrder::kOlmo2},
      {"olmo2-13b", 5120, 5120, 1e-6f, NormOrder::kOlmo2},
      {"olmo3-32b", 5120, 1024, 1e-6f, NormOrder::kOlmo2},
      {"minimax-m2", 6144, 1024, 1e-6f, NormOrder::kLlama},
  };
  return m;
}

struct Stats {
  double median, p10, p90, p99;
};

Stats stats_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  auto q = [&](double f) {
    return v[std::min(v.size() - 1, static_cast<std::size_t>(f * v.size()))];
  };
  return {q(0.5), q(0.1), q(0.9), q(0.99)};
}

struct Options {
  int warmup = 10, iters = 200, launches_per_graph = 20;
  std::string mode = "graph";
  std::string commit = "unknown";
};

// Times `body` (which enqueues work on s): graph mode captures launches_per_graph bodies and
// reports replay time / launches; eager mode times each body with events.
template <typename Body>
Stats time_it(const Options& o, cudaStream_t s, Body body) {
  cudaEvent_t a, b;
  SWIFTQK_CUDA_TRY(cudaEventCreate(&a));
  SWIFTQK_CUDA_TRY(cudaEventCreate(&b));
  std::vector<double> us;
  if (o.mode == "graph") {
    cudaGraph_t g;
    cudaGraphExec_t ge;
    SWIFTQK_CUDA_TRY(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < o.launches_per_graph; ++i) body(i);
    SWIFTQK_CUDA_TRY(cudaStreamEndCapture(s, &g));
    SWIFTQK_CUDA_TRY(cudaGraphInstantiate(&ge, g, 0));
    for (int i = 0; i < o.warmup; ++i) SWIFTQK_CUDA_TRY(cudaGraphLaunch(ge, s));
    for (int i = 0; i < o.iters; ++i) {
      SWIFTQK_CUDA_TRY(cudaEventRecord(a, s));
      SWIFTQK_CUDA_TRY(cudaGraphLaunch(ge, s));
      SWIFTQK_CUDA_TRY(cudaEventRecord(b, s));
      SWIFTQK_CUDA_TRY(cudaEventSynchronize(b));
      float ms = 0;
      SWIFTQK_CUDA_TRY(cudaEventElapsedTime(&ms, a, b));
      us.push_back(ms * 1000.0 / o.launches_per_graph);
    }
    SWIFTQK_CUDA_TRY(cudaGraphExecDestroy(ge));
    SWIFTQK_CUDA_TRY(cudaGraphDestroy(g));
  } else {
    for (int i = 0; i < o.warmup; ++i) body(i);
    for (int i = 0; i < o.iters; ++i) {
      SWIFTQK_CUDA_TRY(cudaEventRecord(a, s));
      body(i);
      SWIFTQK_CUDA_TRY(cudaEventRecord(b, s));
      SWIFTQK_CUDA_TRY(cudaEventSynchronize(b));
      float ms = 0;
      SWIFTQK_CUDA_TRY(cudaEventElapsedTime(&ms, a, b));
      us.push_back(ms * 1000.0);
    }
  }
  SWIFTQK_CUDA_TRY(cudaEventDestroy(a));
  SWIFTQK_CUDA_TRY(cudaEventDestroy(b));
  return stats_of(us);
}

// Device copy bandwidth, bytes read plus written, from a large copy by a plain SM kernel.
double copy_gbps(const Options& o, cudaStream_t s) {
  const std::size_t bytes = std::size_t(1) << 30;
  DeviceBuffer src(bytes), dst(bytes);
  SWIFTQK_CUDA_TRY(cudaMemset(src.get(), 1, bytes));
  Options c = o;
  c.launches_per_graph = 4;
  c.iters = 20;
  const Stats st = time_it(c, s, [&](int) { bench::launch_copy(src.get(), dst.get(), bytes, s); });
  return 2.0 * bytes / (st.median * 1e3);
}

std::string device_name() {
  cudaDeviceProp p;
  SWIFTQK_CUDA_TRY(cudaGetDeviceProperties(&p, 0));
  return p.name;
}

json run_method(const Options& o, Method method, const Model& m, int tp, int64_t tokens, DType dt,
                NormOrder order, double copy_bw, cudaStream_t s) {
  CommConfig cfg;
  cfg.token_capacity = std::max<int64_t>(16384, tokens);
  auto comms = Communicator::create_local_group(std::vector<int>(tp, 0), cfg);
  std::vector<Communicator*> cp;
  for (auto& c : comms) cp.push_back(&c);
  Problem p = Problem::random(tokens, m.q, m.k, dt, order, m.eps, 2024 + tokens);
  // Enough input sets that the rotation exceeds twice the 60 MB L2 at large sizes.
  const std::size_t set_bytes = tokens * (m.q + m.k) * (dtype_size(dt) + dtype_size(p.out()));
  const int sets = static_cast<int>(std::clamp<std::size_t>(
      (std::size_t(120) << 20) / std::max<std::size_t>(set_bytes, 1) + 1, 1, 8));
  std::vector<std::vector<RankData>> data(sets);
  for (auto& ranks : data) {
    for (int r = 0; r < tp; ++r) {
      ranks.push_back(make_rank(p, tp, r, Layout::kSeparate));
      ranks.back().params.method = method;
    }
  }
  // Correctness first, on fresh inputs into poisoned outputs, in the mode being timed.
  p.refill(31337);
  for (int r = 0; r < tp; ++r) {
    upload_inputs(p, tp, r, data[0][r], s);
    poison(data[0][r], s);
  }
  auto launch = [&](int set) {
    std::vector<QkNormParams> pp;
    for (auto& d : data[set % sets]) pp.push_back(d.params);
    launch_qk_norm_group(cp, pp, s);
  };
  launch(0);
  for (auto& c : comms) c.synchronize(s);
  std::vector<RankData*> rp;
  for (auto& d : data[0]) rp.push_back(&d);
  const Check chk = check_ranks(p, tp, rp);

  const Stats st = time_it(o, s, launch);
  for (auto& c : comms) c.synchronize(s);
  const double hbm =
      static_cast<double>(tokens) * (m.q + m.k) * (dtype_size(dt) + dtype_size(p.out())) +
      static_cast<double>(m.q + m.k) * dtype_size(p.out());
  const double exch = tp > 1 ? static_cast<double>(tokens) * tp * tp * kSlotBytes : 0.0;
  json j;
  j["method"] = to_string(method);
  j["model"] = m.name;
  j["q_width"] = m.q;
  j["k_width"] = m.k;
  j["tp"] = tp;
  j["tokens"] = tokens;
  j["dtype"] = to_string(dt);
  j["order"] = to_string(order);
  j["mode"] = o.mode;
  j["median_us"] = st.median;
  j["p10_us"] = st.p10;
  j["p90_us"] = st.p90;
  j["p99_us"] = st.p99;
  j["hbm_bytes"] = hbm;
  j["exchange_bytes"] = exch;
  j["gbps"] = hbm / (st.median * 1e3);
  j["copy_gbps"] = copy_bw;
  j["frac_of_copy"] = hbm / (st.median * 1e3) / copy_bw;
  j["max_abs_err"] = std::max(chk.q.max_abs, chk.k.max_abs);
  j["mean_abs_err"] = (chk.q.mean_abs * chk.q.count + chk.k.mean_abs * chk.k.count) /
                      std::max<double>(1, chk.q.count + chk.k.count);
  j["rmse"] =
      std::sqrt((chk.q.rmse * chk.q.rmse * chk.q.count + chk.k.rmse * chk.k.rmse * chk.k.count) /
                std::max<double>(1, chk.q.count + chk.k.count));
  j["wrong"] = chk.wrong + (chk.rstd_identical ? 0 : 1);
  j["virtual_ranks"] = tp > 1;
  j["device"] = device_name();
  j["gpus"] = 1;
  j["commit"] = o.commit;
  return j;
}

// What runs without a GPU: the reference against the review's worked example, and sharded
// fp32 partial sums (combined in rank order, as the kernel does) against the fp64 full sum.
bool reference_self_check() {
  const std::vector<double> x = {1, 2, -1, 0.5, 3, -2, 1.5, 0.5};
  const double s = ref::sum_of_squares_sharded(x.data(), 8, 2);
  const std::vector<double> y = ref::rms_norm_fp64(x, std::vector<double>(8, 1.0), 1, 8, 1e-6);
  const double rstd = y[0] / x[0];
  bool ok = s == 21.75 && std::fabs(rstd - 0.6064783233) < 1e-9;
  std::printf(
      "worked example: x = [1, 2, -1, 0.5, 3, -2, 1.5, 0.5] over 2 ranks: S = %.4f "
      "(expect 21.75), 1/rms = %.10f (expect 0.6064783233): %s\n",
      s, rstd, ok ? "ok" : "WRONG");
  std::mt19937_64 rng(7);
  std::normal_distribution<double> normal(0.0, 1.0);
  double worst = 0;
  for (int world : {1, 2, 4, 8}) {
    for (int64_t width : {2048, 5120, 6144}) {
      std::vector<double> row(width);
      double exact = 0;
      for (auto& v : row) {
        v = static_cast<float>(normal(rng));
        exact += v * v;
      }
      const double got = ref::sum_of_squares_sharded(row.data(), width, world);
      worst = std::max(worst, std::fabs(got - exact) / exact);
    }
  }
  // fp32 accumulation of up to 6144 squares: relative error well under 1e-5.
  const bool sums_ok = worst < 1e-5;
  std::printf(
      "sharded fp32 partial sums vs float64, TP 1-8, widths 2048-6144: worst relative "
      "error %.2e: %s\n",
      worst, sums_ok ? "ok" : "WRONG");
  return ok && sums_ok;
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::size_t a = 0;
  while (a <= s.size()) {
    const std::size_t b = s.find(',', a);
    const std::string part = s.substr(a, b == std::string::npos ? std::string::npos : b - a);
    if (!part.empty()) out.push_back(part);
    if (b == std::string::npos) break;
    a = b + 1;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"SwiftQK benchmark: verify and time tensor-parallel QK-RMSNorm"};
  Options o;
  std::string models = "olmoe,olmo2-7b,olmo2-13b,olmo3-32b,minimax-m2";
  std::string shapes, tokens_s = "1,16,64,256,1024,4096,16384", tps = "1,2,4,8";
  std::string dtypes = "bf16", order_s = "model", json_path, methods = "swiftqk";
  app.add_option("--models", models, "model shapes by name (comma separated)");
  app.add_option("--shapes", shapes, "extra custom shapes Q:K[,Q:K...]");
  app.add_option("--tokens", tokens_s, "token counts");
  app.add_option("--tp", tps, "TP degrees (virtual ranks on one GPU)");
  app.add_option("--dtype", dtypes, "input dtypes: bf16,f16,f32,fp8");
  app.add_option("--methods", methods,
                 "methods: swiftqk,minimax_fused,all_gather,comm_overlap,minimax_eager (the "
                 "last three only at TP 1 in one process)");
  app.add_option("--order", order_s, "norm order: model (each model's own), olmo2 or llama");
  app.add_option("--mode", o.mode, "graph or eager")->check(CLI::IsMember({"graph", "eager"}));
  app.add_option("--iters", o.iters, "timed repetitions (median and percentiles over these)");
  app.add_option("--warmup", o.warmup, "untimed repetitions first");
  app.add_option("--graph-launches", o.launches_per_graph, "launches captured per graph");
  app.add_option("--commit", o.commit, "commit recorded in the JSON");
  app.add_option("--json", json_path, "write results as a JSON array here");
  CLI11_PARSE(app, argc, argv);
  try {  // names are checked before anything runs, GPU or not
    for (const auto& d : split(dtypes)) parse_dtype(d);
    for (const auto& m : split(methods)) parse_method(m);
    if (order_s != "model") parse_norm_order(order_s);
  } catch (const Error& e) {
    std::fprintf(stderr, "swiftqk_bench: %s\n", e.what());
    return 2;
  }

  if (!has_gpu()) {
    std::printf(
        "swiftqk_bench: no CUDA GPU on this machine: nothing can be timed or run on a "
        "GPU here. Running the float64 reference self-check instead.\n");
    return reference_self_check() ? 0 : 1;
  }
  std::vector<Model> run_models;
  for (const auto& name : split(models)) {
    auto it = std::find_if(known_models().begin(), known_models().end(),
                           [&](const Model& m) { return m.name == name; });
    if (it == known_models().end()) {
      std::fprintf(stderr, "unknown model '%s'\n", name.c_str());
      return 2;
    }
    run_models.push_back(*it);
  }
  for (const auto& sh : split(shapes)) {
    const auto c = sh.find(':');
    const int64_t q = std::stoll(sh.substr(0, c)), k = std::stoll(sh.substr(c + 1));
    run_models.push_back({"custom-" + sh, q, k, 1e-6f, NormOrder::kOlmo2});
  }
  cudaStream_t s;
  SWIFTQK_CUDA_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const double copy_bw = copy_gbps(o, s);
  std::printf("device %s, copy bandwidth %.0f GB/s (read + write)\n", device_name().c_str(),
              copy_bw);
  json all = json::array();
  int64_t total_wrong = 0;
  std::printf("%-13s %-11s %5s %5s %3s %6s %5s %6s %9s %9s %9s %7s %6s %6s %9s\n", "method",
              "model", "q", "k", "tp", "tokens", "dtype", "order", "median_us", "p10_us", "p99_us",
              "GB/s", "%copy", "wrong", "max_err");
  for (const Model& m : run_models) {
    for (const auto& dts : split(dtypes)) {
      const DType dt = parse_dtype(dts);
      const NormOrder order = order_s == "model" ? m.order : parse_norm_order(order_s);
      for (const auto& tps_one : split(tps)) {
        const int tp = std::stoi(tps_one);
        if (m.q % tp != 0 || m.k % tp != 0) continue;
        for (const auto& ts : split(tokens_s)) {
          for (const auto& ms : split(methods)) {
            const Method method = parse_method(ms);
            const int64_t t = std::stoll(ts);
            if (uses_nccl(method) && tp > 1) {
              // One process here: NCCL refuses several ranks on one GPU.
              std::printf(
                  "%-13s %-11s tp %d tokens %lld: not runnable here (NCCL needs one GPU "
                  "per rank)\n",
                  to_string(method).c_str(), m.name.c_str(), tp, (long long)t);
              continue;
            }
            json j = run_method(o, method, m, tp, t, dt, order, copy_bw, s);
            total_wrong += j["wrong"].get<int64_t>();
            std::printf(
                "%-13s %-11s %5lld %5lld %3d %6lld %5s %6s %9.2f %9.2f %9.2f %7.0f %6.1f %6lld "
                "%9.2e%s\n",
                "swiftqk", m.name.c_str(), (long long)m.q, (long long)m.k, tp, (long long)t,
                dts.c_str(), to_string(order).c_str(), j["median_us"].get<double>(),
                j["p10_us"].get<double>(), j["p99_us"].get<double>(), j["gbps"].get<double>(),
                100 * j["frac_of_copy"].get<double>(), (long long)j["wrong"].get<int64_t>(),
                j["max_abs_err"].get<double>(), j["wrong"].get<int64_t>() ? "  <-- WRONG" : "");
            std::fflush(stdout);
            all.push_back(j);
          }
        }
      }
    }
  }
  if (!json_path.empty()) std::ofstream(json_path) << all.dump(1) << "\n";
  if (total_wrong > 0) {
    std::printf("FAILED: %lld wrong results\n", (long long)total_wrong);
    return 1;
  }
  std::printf("all %zu configurations verified against the float64 reference\n", all.size());
  return 0;
}
