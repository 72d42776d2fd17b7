// swiftqk_bench: verifies and times QK-norm methods over model shapes, token counts, TP degrees
// and dtypes. Every timed configuration is first checked against the float64 reference (the
// `wrong` column); any wrong result makes the tool exit non-zero. On one GPU, TP > 1 runs as
// virtual ranks in one launch.
#include <spawn.h>
#include <sys/wait.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "bench_common.hpp"
#include "copy_kernel.hpp"
#include "fuzz_shapes.hpp"
#include "problem.hpp"

extern char** environ;

using namespace swiftqk;
using namespace swiftqk::testing;
using json = nlohmann::json;
using namespace swiftqk::bench;

// Device copy bandwidth, bytes read plus written, from a large copy by a plain SM kernel.
double swiftqk::bench::copy_gbps(const Options& o, cudaStream_t s) {
  const std::size_t bytes = std::size_t(1) << 30;
  DeviceBuffer src(bytes), dst(bytes);
  SWIFTQK_CUDA_TRY(cudaMemset(src.get(), 1, bytes));
  Options c = o;
  c.launches_per_graph = 4;
  c.iters = 20;
  const Stats st = time_it(c, s, [&](int) { bench::launch_copy(src.get(), dst.get(), bytes, s); });
  return 2.0 * bytes / (st.median * 1e3);
}

namespace {

// The plain copy kernel moving the bytes of one TP-1 call (half read, half written), with the
// same input rotation and timing: what any single kernel moving that much takes, launch and
// ramp included. It splits a shortfall against the 1 GiB copy bandwidth into what the size
// costs every kernel and what the QK-norm kernel itself adds.
double same_size_copy_us(const Options& o, const Model& m, int64_t tokens, DType dt,
                         cudaStream_t s) {
  const std::size_t moved =
      tokens * (m.q + m.k) * (dtype_size(dt) + dtype_size(output_dtype_for(dt)));
  const std::size_t half = (moved / 2 + 15) / 16 * 16;
  if (half == 0) return 0.0;
  const int sets = rotation_sets(tokens, m, dt);
  DeviceBuffer src(half * sets), dst(half * sets);
  SWIFTQK_CUDA_TRY(cudaMemset(src.get(), 1, half * sets));
  const Stats st = time_it(o, s, [&](int i) {
    const std::size_t off = static_cast<std::size_t>(i % sets) * half;
    bench::launch_copy(src.get() + off, dst.get() + off, half, s);
  });
  return st.median;
}

json run_method(const Options& o, Method method, const Model& m, int tp, Problem& p, double copy_bw,
                cudaStream_t s) {
  const int64_t tokens = p.tokens;
  const DType dt = p.in;
  const NormOrder order = p.order;
  CommConfig cfg;
  cfg.token_capacity = std::max<int64_t>(16384, tokens);
  auto comms = Communicator::create_local_group(std::vector<int>(tp, 0), cfg);
  std::vector<Communicator*> cp;
  for (auto& c : comms) cp.push_back(&c);
  const int sets = rotation_sets(tokens, m, dt);
  std::vector<std::vector<RankData>> data(sets);
  for (auto& ranks : data) {
    for (int r = 0; r < tp; ++r) {
      ranks.push_back(make_rank(p, tp, r, Layout::kSeparate));
      ranks.back().params.method = method;
      apply_options(o, ranks.back().params);
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
  return make_row(method, m, tp, tokens, dt, order, o, st, copy_bw, chk,
                  chk.wrong + (chk.rstd_identical ? 0 : 1), 1);
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

// Virtual ranks (TP > 1) or TP 1 in this one process, on GPU 0.
int run_single_process(const Sweep& sw, const std::vector<int>& tps) {
  const Options& o = sw.options;
  cudaStream_t s;
  SWIFTQK_CUDA_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const double copy_bw = copy_gbps(o, s);
  std::printf("device %s, copy bandwidth %.0f GB/s (read + write)\n", device_name().c_str(),
              copy_bw);
  json all = json::array();
  int64_t total_wrong = 0;
  print_header();
  for (const Model& m : sw.models) {
    for (DType dt : sw.dtypes) {
      const NormOrder order = sw.order_for(m);
      for (int64_t t : sw.tokens) {
        // One problem per shape and token count: every TP and method gets the same inputs.
        Problem p = Problem::random(t, m.q, m.k, dt, order, m.eps, 2024 + t);
        for (const int tp : tps) {
          for (Method method : sw.methods) {
            if (uses_nccl(method) && tp > 1) {
              // One process here: NCCL refuses several ranks on one GPU.
              std::printf(
                  "%-13s %-11s tp %d tokens %lld: not runnable in one process (NCCL "
                  "needs one GPU per rank: use --procs)\n",
                  to_string(method).c_str(), m.name.c_str(), tp, (long long)t);
              continue;
            }
            json j = run_method(o, method, m, tp, p, copy_bw, s);
            if (tp == 1 && method == Method::kSwiftQK && t >= 4096) {
              const double c = same_size_copy_us(o, m, t, dt, s);
              j["same_size_copy_us"] = c;
              j["frac_of_same_size_copy"] = c / j["median_us"].get<double>();
            }
            total_wrong += j["wrong"].get<int64_t>();
            print_row(j);
            if (j.contains("same_size_copy_us")) {
              std::printf("  the copy kernel moving the same bytes: %.2f us (%.1f%% of its time)\n",
                          j["same_size_copy_us"].get<double>(),
                          100 * j["frac_of_same_size_copy"].get<double>());
            }
            record(sw, all, std::move(j));
          }
        }
      }
    }
  }
  return finish(sw, all, total_wrong);
}

// --fuzz-shapes: each random point at TP 1 and at its TP degree on the same problem, verified
// then timed; then the worst points three ways: TP N against its own TP 1 (from 4096 tokens, and
// in microseconds at 64 tokens or fewer) and TP 1 against the copy bandwidth (from 4096 tokens).
// Points before `first` are skipped (--fuzz-first), so a long fuzz runs in parts whose JSON
// bench/fuzz_table.py merges; so are points whose token count lies outside `tokens`
// (--fuzz-tokens), so that one target's points (64 tokens or fewer, or 4096 or more) are measured
// again without the rest. Every point is drawn either way: the list stays the seed's.
int run_fuzz(const Sweep& sw, const std::vector<FuzzPoint>& points, uint64_t seed, int first,
             const TokenRange& tokens) {
  const Options& o = sw.options;
  cudaStream_t s;
  SWIFTQK_CUDA_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const double copy_bw = copy_gbps(o, s);
  std::printf(
      "device %s, copy bandwidth %.0f GB/s (read + write); fuzz points %d..%zu of seed %llu\n",
      device_name().c_str(), copy_bw, first, points.size() - 1,
      static_cast<unsigned long long>(seed));
  json all = json::array();
  int64_t total_wrong = 0;
  struct Pair {
    int index;
    double tp1_us, tpn_us, tp1_frac;
  };
  std::vector<Pair> pairs;
  print_header();
  for (std::size_t i = static_cast<std::size_t>(first); i < points.size(); ++i) {
    const FuzzPoint& f = points[i];
    if (!tokens.holds(f.tokens)) continue;
    const Model m{"fuzz-" + std::to_string(i), f.q_width, f.k_width, 1e-6f, f.order};
    Problem p = Problem::random(f.tokens, f.q_width, f.k_width, f.dtype, f.order, m.eps,
                                seed * 1000003 + i);
    double us[2] = {0, 0}, frac = 0;
    for (int pass = 0; pass < 2; ++pass) {
      const int tp = pass == 0 ? 1 : f.tp;
      json j = run_method(o, Method::kSwiftQK, m, tp, p, copy_bw, s);
      j["fuzz_point"] = static_cast<int>(i);
      j["fuzz_seed"] = seed;
      us[pass] = j["median_us"].get<double>();
      if (pass == 0) frac = j["frac_of_copy"].get<double>();
      total_wrong += j["wrong"].get<int64_t>();
      print_row(j);
      record(sw, all, std::move(j));
    }
    pairs.push_back({static_cast<int>(i), us[0], us[1], frac});
  }
  auto table = [&](const char* title, auto keep, auto worse, auto value, const char* unit) {
    std::vector<Pair> v;
    for (const Pair& x : pairs) {
      if (keep(points[x.index])) v.push_back(x);
    }
    std::sort(v.begin(), v.end(), worse);
    std::printf("\nworst 10, %s (%zu points):\n", title, v.size());
    for (std::size_t r = 0; r < v.size() && r < 10; ++r) {
      std::printf("  %8.3f %s  TP1 %8.2f us  TPN %8.2f us  %s\n", value(v[r]), unit, v[r].tp1_us,
                  v[r].tpn_us, describe(points[v[r].index]).c_str());
    }
  };
  table(
      "TP N / TP 1 from 4096 tokens", [](const FuzzPoint& f) { return f.tokens >= 4096; },
      [](const Pair& a, const Pair& b) { return a.tpn_us / a.tp1_us > b.tpn_us / b.tp1_us; },
      [](const Pair& x) { return x.tpn_us / x.tp1_us; }, "x   ");
  table(
      "TP N - TP 1 at 64 tokens or fewer", [](const FuzzPoint& f) { return f.tokens <= 64; },
      [](const Pair& a, const Pair& b) { return a.tpn_us - a.tp1_us > b.tpn_us - b.tp1_us; },
      [](const Pair& x) { return x.tpn_us - x.tp1_us; }, "us  ");
  table(
      "TP 1 share of copy bandwidth from 4096 tokens",
      [](const FuzzPoint& f) { return f.tokens >= 4096; },
      [](const Pair& a, const Pair& b) { return a.tp1_frac < b.tp1_frac; },
      [](const Pair& x) { return 100.0 * x.tp1_frac; }, "%   ");
  SWIFTQK_CUDA_TRY(cudaStreamDestroy(s));
  return finish(sw, all, total_wrong);
}

// Runs this same program once per rank (TP = procs) and waits for all of them.
int spawn_ranks(int argc, char** argv, int procs) {
  char tmpl[] = "/tmp/swiftqk_bench_XXXXXX";
  SWIFTQK_EXPECTS(mkdtemp(tmpl) != nullptr, "cannot create a rendezvous directory");
  std::vector<pid_t> pids;
  for (int r = 0; r < procs; ++r) {
    std::vector<std::string> args(argv, argv + argc);
    args.insert(args.end(), {"--rank", std::to_string(r), "--world", std::to_string(procs),
                             "--rendezvous", tmpl});
    std::vector<char*> cargs;
    for (auto& a : args) cargs.push_back(a.data());
    cargs.push_back(nullptr);
    pid_t pid;
    SWIFTQK_EXPECTS(
        posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, cargs.data(), environ) == 0,
        "cannot start rank " + std::to_string(r));
    pids.push_back(pid);
  }
  int rc = 0;
  for (pid_t pid : pids) {
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) rc = 1;
  }
  std::filesystem::remove_all(tmpl);
  return rc;
}

// Command-line checks. Each returns "" for a good value, else the sentence CLI11 prints after
// the flag's name ("--tp: 3 is not a power of two from 1 to 32"), so a bad value fails at parse
// time, GPU or not.

bool parse_whole(const std::string& s, int64_t& v) {
  const char* end = s.data() + s.size();
  const auto r = std::from_chars(s.data(), end, v);
  return r.ec == std::errc() && r.ptr == end;
}

CLI::Validator whole_number(int64_t lo, const std::string& name) {
  return CLI::Validator(
      [lo](std::string& s) -> std::string {
        int64_t v = 0;
        if (parse_whole(s, v) && v >= lo) return "";
        return "'" + s + "' is not a whole number >= " + std::to_string(lo);
      },
      name);
}

// "LO:HI" (whole numbers, 1 <= LO <= HI) into *r; false, with *r untouched, otherwise.
bool parse_token_range(const std::string& s, TokenRange* r) {
  const std::size_t colon = s.find(':');
  int64_t lo = 0, hi = 0;
  if (colon == std::string::npos || !parse_whole(s.substr(0, colon), lo) ||
      !parse_whole(s.substr(colon + 1), hi) || lo < 1 || hi < lo) {
    return false;
  }
  *r = TokenRange{lo, hi};
  return true;
}

CLI::Validator token_range() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        TokenRange r;
        if (parse_token_range(s, &r)) return "";
        return "'" + s + "' is not LO:HI with whole numbers 1 <= LO <= HI";
      },
      "LO:HI");
}

// A TP degree the kernel takes: a power of two up to 32 (the polling warp has a lane per rank:
// kMaxWorld).
constexpr int kMaxTp = 32;
CLI::Validator tp_degree() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        int64_t v = 0;
        if (parse_whole(s, v) && v >= 1 && v <= kMaxTp && (v & (v - 1)) == 0) return "";
        return "'" + s + "' is not a power of two from 1 to " + std::to_string(kMaxTp);
      },
      "{1,2,4,8,16,32}");
}

// A tuning value: 0 (the tuned policy's choice) or one that `ok` takes (LaunchTuning's ranges,
// which LaunchTuning::validate checks too), which `what` describes.
template <typename Ok>
CLI::Validator tuning_value(Ok ok, const std::string& what, const std::string& shown) {
  return CLI::Validator(
      [ok, what](std::string& s) -> std::string {
        int64_t v = 0;
        if (parse_whole(s, v) && (v == 0 || ok(v))) return "";
        return "'" + s + "' is not 0 (tuned) nor " + what;
      },
      "0|" + shown);
}

CLI::Validator tuning_range(int64_t lo, int64_t hi) {
  return tuning_value([lo, hi](int64_t v) { return v >= lo && v <= hi; },
                      "a whole number from " + std::to_string(lo) + " to " + std::to_string(hi),
                      std::to_string(lo) + ".." + std::to_string(hi));
}

// One of `names`, or anything `parse` accepts (the dtype and method aliases).
template <typename Parse>
CLI::Validator one_of(const std::string& what, const std::vector<std::string>& names, Parse parse) {
  std::string shown, listed;
  for (const auto& n : names) {
    shown += (shown.empty() ? "" : ",") + n;
    listed += (listed.empty() ? "" : ", ") + n;
  }
  return CLI::Validator(
      [what, listed, parse](std::string& s) -> std::string {
        try {
          if (parse(s)) return "";
        } catch (const std::exception&) {
        }
        return "unknown " + what + " '" + s + "' (one of " + listed + ")";
      },
      "{" + shown + "}");
}

CLI::Validator custom_shape() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        const auto c = s.find(':');
        int64_t q = 0, k = 0;
        if (c != std::string::npos && parse_whole(s.substr(0, c), q) &&
            parse_whole(s.substr(c + 1), k) && q > 0 && k > 0) {
          return "";
        }
        return "'" + s + "' is not Q:K with two positive whole widths";
      },
      "Q:K");
}

// An output file: its directory must exist now, so a long run never ends unable to write.
CLI::Validator output_path() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        namespace fs = std::filesystem;
        if (s.empty()) return "the path is empty";
        const fs::path dir = fs::path(s).has_parent_path() ? fs::path(s).parent_path() : ".";
        std::error_code ec;
        if (!fs::is_directory(dir, ec)) return "the directory of " + s + " does not exist";
        if (fs::is_directory(s, ec)) return s + " is a directory, not a file";
        return "";
      },
      "PATH");
}

std::string describe_models() {
  std::string out;
  char line[160];
  for (const Model& m : known_models()) {
    std::snprintf(line, sizeof line, "  %-11s Q %5lld  K %5lld  %-5s order  eps %g\n",
                  m.name.c_str(), static_cast<long long>(m.q), static_cast<long long>(m.k),
                  to_string(m.order).c_str(), m.eps);
    out += line;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"SwiftQK benchmark: verify and time tensor-parallel QK-RMSNorm"};
  app.option_defaults()->always_capture_default();
  app.footer("Models (--models; --list-models prints this):\n" + describe_models());
  Sweep sw;
  Options& o = sw.options;
  std::vector<std::string> model_names;
  for (const Model& m : known_models()) model_names.push_back(m.name);
  std::vector<std::string> models = model_names, shapes, dtypes = {"bf16"};
  std::vector<std::string> methods = {"swiftqk"};
  std::vector<int64_t> tokens = {1, 16, 64, 256, 1024, 4096, 16384};
  std::vector<int> tps = {1, 2, 4, 8};
  std::string rendezvous;
  int procs = 1, rank = -1, world = 1;
  int64_t soak = 0;
  bool list_models = false;
  // A scalar given twice takes the last value, so arguments passed after a script's own
  // (main.sh's --json) override them.
  auto last = [](CLI::Option* opt) {
    return opt->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  };
  const auto known_model = [](const std::string& n) {
    return std::any_of(known_models().begin(), known_models().end(),
                       [&](const Model& m) { return m.name == n; });
  };
  app.add_flag("--list-models", list_models, "print the model shapes and exit");
  int fuzz_shapes = 0;
  uint64_t fuzz_seed = 1;
  bool fuzz_list = false;
  last(app.add_option("--fuzz-shapes", fuzz_shapes,
                      "shape fuzz: N random (widths, dtype, order, TP, tokens) points, each at TP "
                      "1 and at its TP, verified then timed; prints the worst ones (0: off)")
           ->check(CLI::Range(0, 100000)));
  last(app.add_option("--seed", fuzz_seed, "the shape fuzz's seed")->capture_default_str());
  app.add_flag("--fuzz-list", fuzz_list, "print the shape fuzz's points and exit");
  int fuzz_first = 0;
  last(app.add_option("--fuzz-first", fuzz_first,
                      "run the shape fuzz from this point on (the earlier ones are drawn, not "
                      "run), to split a long fuzz over several runs")
           ->check(CLI::Range(0, 100000)));
  TokenRange fuzz_token_range;
  last(
      app.add_option_function<std::string>(
             "--fuzz-tokens",
             [&fuzz_token_range](const std::string& s) { parse_token_range(s, &fuzz_token_range); },
             "run (and list) only the fuzz points of LO..HI tokens, e.g. 1:64 or 4096:20000 (the "
             "others are drawn, not run)")
          ->check(token_range()));
  app.add_option("--models", models, "model shapes by name (comma separated)")
      ->delimiter(',')
      ->check(one_of("model", model_names, known_model));
  app.add_option("--shapes", shapes, "extra custom shapes Q:K[,Q:K...]")
      ->delimiter(',')
      ->check(custom_shape());
  app.add_option("--tokens", tokens, "token counts")
      ->delimiter(',')
      ->check(whole_number(0, "NONNEGATIVE"));
  app.add_option("--tp", tps,
                 "TP degrees, as virtual ranks on one GPU (single process); each must divide "
                 "every chosen model's widths")
      ->delimiter(',')
      ->check(tp_degree());
  last(app.add_option("--procs", procs,
                      "one process per rank, TP = procs, rank r on GPU r mod #GPUs (NCCL and all "
                      "methods when there are enough GPUs; else CUDA IPC, checks only); 1 runs "
                      "in this process")
           ->check(tp_degree()));
  last(app.add_option("--soak", soak,
                      "soak: this many graph-replayed calls (whole windows of 1000) of the first "
                      "model at the first --tp, the token count changing every window, 4 input "
                      "sets each, every call compared bitwise on the GPU with the first call's "
                      "verified output; every 10th window of a token count is 1000 more calls "
                      "alone, not compared, for the op's latency; reports mismatches and latency "
                      "drift (0: no soak)")
           ->check(whole_number(0, "NONNEGATIVE")));
  app.add_option("--dtype", dtypes, "input dtypes")
      ->delimiter(',')
      ->check(one_of("dtype", {"bf16", "f16", "f32", "fp8"}, [](const std::string& d) {
        parse_dtype(d);
        return true;
      }));
  app.add_option("--methods", methods,
                 "methods (the NCCL ones, all_gather, comm_overlap and minimax_eager, need "
                 "--procs with one GPU per rank, or TP 1)")
      ->delimiter(',')
      ->check(one_of("method",
                     {"swiftqk", "minimax_fused", "all_gather", "comm_overlap", "minimax_eager"},
                     [](const std::string& m) {
                       parse_method(m);
                       return true;
                     }));
  last(app.add_option("--order", sw.order, "norm order: model (each model's own), olmo2 or llama")
           ->check(one_of("norm order", {"model", "olmo2", "llama"}, [](const std::string& n) {
             return n == "model" || (parse_norm_order(n), true);
           })));
  last(app.add_option("--mode", o.mode, "graph or eager")
           ->check(one_of("mode", {"graph", "eager"},
                          [](const std::string& m) { return m == "graph" || m == "eager"; })));
  last(app.add_option("--iters", o.iters, "timed repetitions (median and percentiles over these)")
           ->check(whole_number(1, "POSITIVE")));
  last(app.add_option("--warmup", o.warmup, "untimed repetitions first")
           ->check(whole_number(1, "POSITIVE")));
  last(app.add_option("--graph-launches", o.launches_per_graph, "launches captured per graph")
           ->check(whole_number(1, "POSITIVE")));
  app.add_flag("--pdl", o.pdl,
               "launch the fused methods with programmatic dependent launch (sm_90+): each "
               "launch may be scheduled while the one before it finishes");
  app.add_flag("--deterministic", o.deterministic,
               "run SwiftQK in the deterministic (TP-invariant) mode; the other methods as usual");
  last(app.add_option("--commit", o.commit, "commit recorded in the JSON"));
  last(app.add_option("--json", sw.json_path,
                      "write results as a JSON array here (rewritten after every configuration)")
           ->check(output_path()));
  last(app.add_option("--csv", sw.csv_path, "write results as CSV here, one row a configuration")
           ->check(output_path()));
  last(app.add_option("--markdown", sw.markdown_path, "write results as a Markdown table here")
           ->check(output_path()));
  // The launch tuning (LaunchTuning), for scripts/tune_stages.sh: each flag overrides one choice
  // of the tuned policy; 0 (or "tuned") leaves it to the policy.
  const std::string tuning_group = "Launch tuning (0 / tuned: the tuned policy decides)";
  std::string block_order = "tuned";
  last(app.add_option("--stages", o.tuning.stages, "rows each token group stages")
           ->group(tuning_group)
           ->check(tuning_range(kMinStages, kMaxStages)));
  last(app.add_option("--defer", o.tuning.defer,
                      "with peers, tokens a group writes behind the one it reduces (below "
                      "--stages when both are given)")
           ->group(tuning_group)
           ->check(tuning_range(1, kMaxStages - 1)));
  last(app.add_option("--vpt", o.tuning.vectors_per_thread,
                      "vectors each thread stages of a row (the row then takes the fewest "
                      "lanes)")
           ->group(tuning_group)
           ->check(tuning_value([](int64_t v) { return v == 1 || v == 2 || v == 4 || v == 8; },
                                "1, 2, 4 or 8", "1,2,4,8")));
  last(app.add_option("--vector-bytes", o.tuning.vector_bytes,
                      "the widest vector access a launch may take: 16, 8, 4 or 1 (scalar)")
           ->group(tuning_group)
           ->check(tuning_value([](int64_t v) { return v == 1 || v == 4 || v == 8 || v == 16; },
                                "16, 8, 4 or 1", "16,8,4,1")));
  last(app.add_option("--block-threads", o.tuning.block_threads, "threads a block aims at")
           ->group(tuning_group)
           ->check(tuning_range(32, 1024)));
  last(app.add_option("--block-order", block_order,
                      "how a launch of several virtual ranks orders its blocks")
           ->group(tuning_group)
           ->check(one_of("block order", {"tuned", "rank_major", "interleaved"},
                          [](const std::string& b) {
                            parse_block_order(b);
                            return true;
                          })));
  // Set by --procs for the processes it starts; hidden from --help.
  last(app.add_option("--rank", rank, "this process's rank")
           ->group("")
           ->check(whole_number(0, "NONNEGATIVE")));
  last(app.add_option("--world", world, "number of rank processes")->group("")->check(tp_degree()));
  last(app.add_option("--rendezvous", rendezvous, "directory shared by the rank processes")
           ->group(""));
  try {
    app.parse(argc, argv);
    // What depends on several flags: every TP must split every chosen model's widths.
    for (const auto& name : models) {
      sw.models.push_back(*std::find_if(known_models().begin(), known_models().end(),
                                        [&](const Model& m) { return m.name == name; }));
    }
    for (const auto& sh : shapes) {
      const auto c = sh.find(':');
      sw.models.push_back({"custom-" + sh, std::stoll(sh.substr(0, c)),
                           std::stoll(sh.substr(c + 1)), 1e-6f, NormOrder::kOlmo2});
    }
    const auto check_divides = [&](const char* flag, int tp) {
      for (const Model& m : sw.models) {
        if (m.q % tp != 0 || m.k % tp != 0) {
          throw CLI::ValidationError(flag, std::to_string(tp) + " does not divide the widths of " +
                                               m.name + " (Q " + std::to_string(m.q) + ", K " +
                                               std::to_string(m.k) + ")");
        }
      }
    };
    for (int tp : tps) check_divides("--tp", tp);
    check_divides("--procs", procs);
    if (rank >= world) {
      throw CLI::ValidationError(
          "--rank", std::to_string(rank) + " is not below --world " + std::to_string(world));
    }
    if (fuzz_first > 0 && fuzz_first >= fuzz_shapes) {
      throw CLI::ValidationError("--fuzz-first", std::to_string(fuzz_first) +
                                                     " is not below --fuzz-shapes " +
                                                     std::to_string(fuzz_shapes));
    }
    o.tuning.block_order = parse_block_order(block_order);
    if (o.tuning.stages != 0 && o.tuning.defer > o.tuning.stages - 1) {
      throw CLI::ValidationError("--defer", std::to_string(o.tuning.defer) +
                                                " is not below --stages " +
                                                std::to_string(o.tuning.stages));
    }
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (list_models) {
    std::printf("%s", describe_models().c_str());
    return 0;
  }
  const std::vector<FuzzPoint> fuzz = fuzz_points(fuzz_shapes, fuzz_seed);
  if (fuzz_list) {
    for (std::size_t i = 0; i < fuzz.size(); ++i) {
      if (!fuzz_token_range.holds(fuzz[i].tokens)) continue;
      std::printf("%zu %s\n", i, describe(fuzz[i]).c_str());
    }
    return 0;
  }
  for (const auto& d : dtypes) sw.dtypes.push_back(parse_dtype(d));
  for (const auto& m : methods) sw.methods.push_back(parse_method(m));
  sw.tokens = tokens;
  if (sw.order != "model") sw.order = to_string(parse_norm_order(sw.order));

  if (!has_gpu()) {
    if (soak > 0) {
      std::printf(
          "swiftqk_bench --soak: no CUDA GPU on this machine: the soak needs one; not run.\n");
    }
    std::printf(
        "swiftqk_bench: no CUDA GPU on this machine: nothing can be timed or run on a "
        "GPU here. Running the float64 reference self-check instead.\n");
    return reference_self_check() ? 0 : 1;
  }
  try {
    if (rank >= 0) return run_rank(sw, rank, world, rendezvous);
    if (procs > 1) return spawn_ranks(argc, argv, procs);
    if (soak > 0) return run_soak(sw, tps.at(0), soak);
    if (!fuzz.empty()) return run_fuzz(sw, fuzz, fuzz_seed, fuzz_first, fuzz_token_range);
    return run_single_process(sw, tps);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "swiftqk_bench: %s\n", e.what());
    return 3;
  }
}
