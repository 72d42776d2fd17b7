// swiftqk_epilogue_bench: verifies, then times, the fused QK epilogue (norm + RoPE + KV-cache
// write, one launch) against the unfused chain (SwiftQK's norm, then a RoPE kernel, then a
// cache-write kernel) and against the plain fused norm alone, side by side on the same inputs,
// with the plain copy kernel moving the epilogue's bytes as the bandwidth floor. On one GPU, TP
// > 1 runs as virtual ranks in one launch. Every timed configuration is first checked against
// the float64 gold (fused and unfused); a wrong one makes the tool exit non-zero.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench_common.hpp"
#include "copy_kernel.hpp"
#include "epilogue_problem.hpp"
#include "unfused_epilogue.hpp"

using namespace swiftqk;
using namespace swiftqk::testing;
using namespace swiftqk::bench;

namespace {

constexpr int64_t kHeadDim = 128;  // every DESIGN shape
constexpr int64_t kMaxPosition = 8192;

// Inputs rotate over enough copies that the timed rows are not the ones L2 kept from the last
// launch (the H200's L2 is 50 MB).
int rotation_sets_for(std::size_t bytes_per_call) {
  const std::size_t want = (std::size_t(120) << 20) / std::max<std::size_t>(1, bytes_per_call);
  return static_cast<int>(std::clamp<std::size_t>(want, 1, 16));
}

struct Point {
  const Model* model;
  int64_t tokens;
  int tp;
  DType cache;
};

struct RankSet {
  std::vector<EpilogueRank> d;
  std::vector<QkEpilogueParams> epilogue;
  std::vector<QkNormParams> norm;
  std::vector<RopeRank> rope;
  std::vector<CacheRank> cache;
};

RankSet make_set(const EpilogueHost& h, int tp, int64_t full_q, int64_t full_k) {
  RankSet r;
  for (int i = 0; i < tp; ++i) r.d.push_back(make_epilogue_rank(h, tp, i));
  for (auto& d : r.d) {
    const QkEpilogueParams& e = d.params;
    r.epilogue.push_back(e);
    QkNormParams n;
    n.q = {
        e.q, const_cast<void*>(e.q), e.q_weight, e.num_q_heads * e.head_dim, e.q_stride, e.q_stride,
        1.f};
    n.k = {e.k,        const_cast<void*>(e.k),
           e.k_weight, e.num_kv_heads * e.head_dim,
           e.k_stride, e.k_stride,
           1.f};
    n.tokens = e.tokens;
    n.q_full_width = full_q;
    n.k_full_width = full_k;
    n.in_dtype = e.dtype;
    n.eps = e.eps;
    n.order = e.order;
    r.norm.push_back(n);
    r.rope.push_back({const_cast<void*>(e.q), const_cast<void*>(e.k), e.q_stride, e.k_stride,
                      e.rope.positions, static_cast<const float*>(e.rope.cos_sin_cache)});
    r.cache.push_back({e.k, e.v, e.k_stride, e.v_stride, e.cache.k, e.cache.v, e.cache.slot_mapping,
                       e.cache.k_scale, e.cache.v_scale});
  }
  return r;
}

void run_unfused(const std::vector<Communicator*>& comms, const RankSet& r, const RopeShape& rs,
                 const CacheShape& cs, cudaStream_t s) {
  launch_qk_norm_group(comms, r.norm, s);
  launch_rope(r.rope, rs, s);
  launch_cache_write(r.cache, cs, s);
}

// Checks every rank of set 0 after `body` ran once on poisoned outputs; returns wrong elements.
template <typename Body>
int64_t verify(const EpilogueHost& h, const ref::EpilogueExpected& gold, int tp, RankSet& r,
               std::vector<Communicator>& comms, double roundings, Body body, std::string& first) {
  std::vector<CacheSnapshot> before;
  for (int i = 0; i < tp; ++i) {
    upload_epilogue_inputs(h, tp, i, r.d[i], nullptr);
    poison_epilogue(r.d[i], 77 + i, nullptr);
    before.push_back(snapshot_caches(r.d[i]));
  }
  body();
  SWIFTQK_CUDA_TRY(cudaDeviceSynchronize());
  for (auto& c : comms) c.check_error();
  int64_t wrong = 0;
  for (int i = 0; i < tp; ++i) {
    const EpilogueCheck c = check_epilogue_rank(h, gold, tp, i, r.d[i], before[i], {}, roundings);
    wrong += c.q_wrong + c.k_wrong + c.v_wrong + c.cache_changed;
    if (first.empty() && !c.first_error.empty()) first = c.first_error;
  }
  return wrong;
}

// What the epilogue runs beside the common options: its launch-shape overrides, and whether to
// time the fused launch and the copy only (tuning sweeps).
struct EpilogueOptions {
  EpilogueTuning tuning;
  bool fused_only = false;
  bool out_of_place = false;  // Q to its own buffer (a split launch needs it)
};

json run_point(const Options& o, const EpilogueOptions& eo, const Point& pt, const EpilogueHost& h,
               const ref::EpilogueExpected& gold, cudaStream_t s) {
  const Model& m = *pt.model;
  const int tp = pt.tp;
  CommConfig cfg;
  cfg.token_capacity = std::max<int64_t>(16384, pt.tokens);
  auto comms = Communicator::create_local_group(std::vector<int>(tp, 0), cfg);
  std::vector<Communicator*> cp;
  for (auto& c : comms) cp.push_back(&c);
  const int64_t qh = m.q / kHeadDim / tp, kh = m.k / kHeadDim / tp;
  const std::size_t es = dtype_size(h.s.dtype), ce = dtype_size(pt.cache);
  // What the epilogue must move, all ranks: read Q, K, V; write Q, and K and V into the cache.
  const std::size_t moved = static_cast<std::size_t>(pt.tokens) * tp * kHeadDim *
                            ((qh + 2 * kh) * es + qh * es + 2 * kh * ce);
  const int sets = rotation_sets_for(moved);
  std::vector<RankSet> data;
  for (int i = 0; i < sets; ++i) {
    data.push_back(make_set(h, tp, m.q, m.k));
    for (QkEpilogueParams& e : data.back().epilogue) e.tuning = eo.tuning;
  }
  const RopeShape rs{pt.tokens,
                     static_cast<int>(qh),
                     static_cast<int>(kh),
                     kHeadDim,
                     static_cast<int>(h.s.rotary_dim),
                     h.s.style == RopeStyle::kNeox,
                     h.s.dtype};
  const EpilogueRank& d0 = data[0].d[0];
  const CacheShape cs{pt.tokens,
                      static_cast<int>(kh),
                      kHeadDim,
                      d0.params.cache.block_size,
                      d0.params.cache.block_stride,
                      d0.params.cache.slot_stride,
                      d0.params.cache.head_stride,
                      h.s.dtype,
                      pt.cache};

  std::string first;
  const int64_t wrong_fused = verify(
      h, gold, tp, data[0], comms, 1.0,
      [&] { launch_qk_epilogue_group(cp, data[0].epilogue, nullptr); }, first);
  // The chain rounds Q and K after the norm and again after the rotation.
  const int64_t wrong_unfused =
      eo.fused_only ? 0
                    : verify(
                          h, gold, tp, data[0], comms, 2.0,
                          [&] { run_unfused(cp, data[0], rs, cs, nullptr); }, first);

  const Stats fused =
      time_it(o, s, [&](int i) { launch_qk_epilogue_group(cp, data[i % sets].epilogue, s); });
  const Stats none{};
  const Stats unfused =
      eo.fused_only ? none
                    : time_it(o, s, [&](int i) { run_unfused(cp, data[i % sets], rs, cs, s); });
  const Stats norm = eo.fused_only ? none : time_it(o, s, [&](int i) {
    launch_qk_norm_group(cp, data[i % sets].norm, s);
  });
  for (auto& c : comms) c.check_error();  // no timed launch may have failed

  const std::size_t half = (moved / 2 + 15) / 16 * 16;
  DeviceBuffer src(half * sets), dst(half * sets);
  SWIFTQK_CUDA_TRY(cudaMemset(src.get(), 1, half * sets));
  const Stats copy = time_it(o, s, [&](int i) {
    const std::size_t off = static_cast<std::size_t>(i % sets) * half;
    launch_copy(src.get() + off, dst.get() + off, half, s);
  });

  json j;
  j["model"] = m.name;
  j["tp"] = tp;
  j["tokens"] = pt.tokens;
  j["dtype"] = to_string(h.s.dtype);
  j["cache"] = to_string(pt.cache);
  j["rotary_dim"] = h.s.rotary_dim;
  j["fused_us"] = fused.median;
  j["fused_p90_us"] = fused.p90;
  j["unfused_us"] = unfused.median;
  j["norm_us"] = norm.median;
  j["copy_us"] = copy.median;
  j["speedup"] = unfused.median / fused.median;
  j["over_norm_us"] = fused.median - norm.median;
  j["pct_copy"] = 100.0 * copy.median / fused.median;
  j["bytes_moved"] = moved;
  j["wrong_fused"] = wrong_fused;
  j["wrong_unfused"] = wrong_unfused;
  if (!first.empty()) j["first_error"] = first;
  j["block_threads"] = eo.tuning.block_threads;
  j["stages"] = eo.tuning.stages;
  j["defer"] = eo.tuning.defer;
  j["split"] = eo.tuning.split;
  j["weights"] = eo.tuning.weights;
  j["out_of_place"] = eo.out_of_place;
  j["fused_only"] = eo.fused_only;
  j["mode"] = o.mode;
  j["commit"] = o.commit;
  j["device"] = device_name();
  return j;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Verify, then time, the fused QK epilogue against the unfused chain"};
  std::string models = "olmoe,olmo2-13b,olmo3-32b,minimax-m2", tokens = "1,64,2048,4096,16384",
              tps = "1,2,4,8", caches = "bf16,fp8", json_path;
  Options o;
  EpilogueOptions eo;
  app.add_option("--block-threads", eo.tuning.block_threads, "threads a block (0 = tuned)");
  app.add_option("--stages", eo.tuning.stages, "tokens staged per block (0 = tuned)");
  app.add_option("--defer", eo.tuning.defer,
                 "tokens a block writes behind the one it reduces (-1 = tuned)");
  app.add_option("--split", eo.tuning.split,
                 "blocks sharing a token, TP 1 only: 1, 2, 4 or 8 (0 = tuned)");
  app.add_option("--weights", eo.tuning.weights,
                 "where the kernel reads the norm weights: 1 shared memory, 2 global (0 = tuned)");
  app.add_flag("--out-of-place", eo.out_of_place,
               "write Q to its own buffer instead of over the input (only such launches split)");
  app.add_flag("--fused-only", eo.fused_only,
               "verify and time the fused launch and the copy only (no unfused chain or norm)");
  app.add_option("--models", models, "model shapes (bench/models.json)")->capture_default_str();
  app.add_option("--tokens", tokens, "token counts")->capture_default_str();
  app.add_option("--tp", tps, "TP degrees (virtual ranks on one GPU)")->capture_default_str();
  app.add_option("--cache", caches, "KV-cache dtypes: bf16, fp8")->capture_default_str();
  app.add_option("--iters", o.iters, "timed graph replays")->capture_default_str();
  app.add_option("--warmup", o.warmup, "untimed replays first")->capture_default_str();
  app.add_option("--mode", o.mode, "graph or eager")->check(CLI::IsMember({"graph", "eager"}));
  app.add_option("--commit", o.commit, "commit recorded in each row")->capture_default_str();
  app.add_option("--json", json_path, "write the rows here (rewritten after every point)");
  CLI11_PARSE(app, argc, argv);

  std::vector<const Model*> ms;
  for (const std::string& name : split(models)) {
    const auto& known = known_models();
    auto it =
        std::find_if(known.begin(), known.end(), [&](const Model& m) { return m.name == name; });
    if (it == known.end()) {
      std::fprintf(stderr, "--models: unknown model %s\n", name.c_str());
      return 2;
    }
    ms.push_back(&*it);
  }
  std::vector<int64_t> ts;
  for (const std::string& t : split(tokens)) ts.push_back(std::stoll(t));
  std::vector<int> tp_list;
  for (const std::string& t : split(tps)) tp_list.push_back(std::stoi(t));
  std::vector<DType> cache_list;
  for (const std::string& c : split(caches)) cache_list.push_back(parse_dtype(c));
  if (!testing::has_gpu()) {
    std::printf("no CUDA GPU on this machine: nothing to time\n");
    return 0;
  }
  cudaStream_t s;
  SWIFTQK_CUDA_TRY(cudaStreamCreate(&s));
  json all = json::array();
  int64_t total_wrong = 0;
  std::printf("%-11s %3s %6s %5s %10s %10s %8s %8s %10s %8s %6s\n", "model", "tp", "tokens",
              "cache", "fused_us", "unfused_us", "speedup", "norm_us", "+norm_us", "%copy",
              "wrong");
  for (const Model* m : ms) {
    for (DType cache : cache_list) {
      for (int64_t t : ts) {
        EpilogueSetup st;
        st.tokens = t;
        st.q_heads = m->q / kHeadDim;
        st.kv_heads = m->k / kHeadDim;
        st.rotary_dim = m->name == "minimax-m2" ? 64 : kHeadDim;  // MiniMax-M2: partial
        st.order = m->order;
        st.eps = m->eps;
        st.cache_dtype = cache;
        st.max_position = kMaxPosition;
        st.padding = 0.0;
        st.seed = 4242 + t;
        st.in_place = !eo.out_of_place;
        const EpilogueHost h = EpilogueHost::random(st);
        const ref::EpilogueExpected gold = ref::epilogue_fp64(h.ref);
        for (int tp : tp_list) {
          if (st.q_heads % tp != 0 || st.kv_heads % tp != 0) continue;
          const json j = run_point(o, eo, {m, t, tp, cache}, h, gold, s);
          const int64_t wrong = j["wrong_fused"].get<int64_t>() + j["wrong_unfused"].get<int64_t>();
          total_wrong += wrong;
          std::printf("%-11s %3d %6lld %5s %10.2f %10.2f %8.2f %8.2f %10.2f %8.1f %6lld\n",
                      m->name.c_str(), tp, static_cast<long long>(t), to_string(cache).c_str(),
                      j["fused_us"].get<double>(), j["unfused_us"].get<double>(),
                      j["speedup"].get<double>(), j["norm_us"].get<double>(),
                      j["over_norm_us"].get<double>(), j["pct_copy"].get<double>(),
                      static_cast<long long>(wrong));
          std::fflush(stdout);
          all.push_back(j);
          if (!json_path.empty()) write_atomically(json_path, all.dump(1));
        }
      }
    }
  }
  SWIFTQK_CUDA_TRY(cudaStreamDestroy(s));
  if (total_wrong != 0) {
    std::printf("%lld wrong elements: FAILED\n", static_cast<long long>(total_wrong));
    return 1;
  }
  std::printf("all %zu configurations verified\n", all.size());
  return 0;
}
