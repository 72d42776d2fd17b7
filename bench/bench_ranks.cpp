// One process per rank: TP = the number of processes, rank r on GPU r mod #GPUs. With a GPU per
// rank the group comes from NCCL (from_nccl) and every method runs; with fewer GPUs (processes
// time-slicing one GPU) the group comes from CUDA IPC, only the fused methods run, and results
// are checked but not timed. Each rank checks its own slice against the float64 reference; rank
// 0 merges the ranks' figures (the slowest rank's times) and writes the table and JSON.
#include <nccl.h>

#include <limits>
#include <memory>
#include <optional>

#include "bench_common.hpp"
#include "rendezvous.hpp"
#include "signal_kernel.hpp"

namespace swiftqk::bench {

namespace {

using testing::Problem;
using testing::RankData;
using testing::Rendezvous;

std::vector<uint8_t> to_bytes(const json& j) {
  const std::string s = j.dump();
  return std::vector<uint8_t>(s.begin(), s.end());
}
json from_bytes(const std::vector<uint8_t>& b) { return json::parse(b.begin(), b.end()); }

json metrics_json(const ref::ErrorMetrics& m) {
  return json{{"max", m.max_abs}, {"mean", m.mean_abs}, {"rmse", m.rmse}, {"n", m.count}};
}

ref::ErrorMetrics metrics_of(const json& j) {
  ref::ErrorMetrics m;
  // JSON has no infinity: a nonfinite mismatch's max_abs travels as null.
  m.max_abs =
      j.at("max").is_null() ? std::numeric_limits<double>::infinity() : j.at("max").get<double>();
  m.mean_abs = j.at("mean").get<double>();
  m.rmse = j.at("rmse").get<double>();
  m.count = j.at("n").get<int64_t>();
  return m;
}

// What one rank measured for one configuration.
json rank_result(const Stats& st, const Check& c) {
  json r{{"median", st.median}, {"p10", st.p10},          {"p90", st.p90},         {"p99", st.p99},
         {"wrong", c.wrong},    {"q", metrics_json(c.q)}, {"k", metrics_json(c.k)}};
  if (c.has_e2e) {
    r["q_e2e"] = metrics_json(c.q_e2e);
    r["k_e2e"] = metrics_json(c.k_e2e);
  }
  return r;
}

// The slowest rank's times; errors pooled over all ranks' slices.
std::pair<Stats, Check> merge(const std::vector<json>& rs, int64_t& wrong) {
  Stats st{0, 0, 0, 0};
  Check c;
  wrong = 0;
  for (const json& r : rs) {
    st.median = std::max(st.median, r["median"].get<double>());
    st.p10 = std::max(st.p10, r["p10"].get<double>());
    st.p90 = std::max(st.p90, r["p90"].get<double>());
    st.p99 = std::max(st.p99, r["p99"].get<double>());
    wrong += r["wrong"].get<int64_t>();
  }
  auto pooled = [&rs](const char* key) {
    std::vector<ref::ErrorMetrics> parts;
    for (const json& r : rs) parts.push_back(metrics_of(r.at(key)));
    return ref::pool(parts);
  };
  c.q = pooled("q");
  c.k = pooled("k");
  c.has_e2e = !rs.empty() && rs[0].contains("q_e2e");  // every rank has the same inputs' dtype
  if (c.has_e2e) {
    c.q_e2e = pooled("q_e2e");
    c.k_e2e = pooled("k_e2e");
  }
  return {st, c};
}

// The NVLink signal round trip between ranks 0 and 1 (median of 3 runs of 20000 rounds): each
// opens the other's flag word through CUDA IPC. Other ranks take part in the rendezvous only.
double measure_round_trip_us(const Rendezvous& rv, int rank, cudaStream_t s) {
  uint32_t* flag = nullptr;
  SWIFTQK_CUDA_TRY(cudaMalloc(&flag, 256));
  cudaIpcMemHandle_t h;
  SWIFTQK_CUDA_TRY(cudaIpcGetMemHandle(&h, flag));
  const auto* hb = reinterpret_cast<const uint8_t*>(&h);
  const auto all = rv.all_gather("flag", std::vector<uint8_t>(hb, hb + sizeof h));
  void* peer = nullptr;
  std::vector<double> runs;
  if (rank < 2) {
    cudaIpcMemHandle_t ph;
    std::copy(all[1 - rank].begin(), all[1 - rank].end(), reinterpret_cast<uint8_t*>(&ph));
    SWIFTQK_CUDA_TRY(cudaIpcOpenMemHandle(&peer, ph, cudaIpcMemLazyEnablePeerAccess));
  }
  for (int run = 0; run < 3; ++run) {
    SWIFTQK_CUDA_TRY(cudaMemset(flag, 0, 256));
    SWIFTQK_CUDA_TRY(cudaDeviceSynchronize());
    rv.barrier("pingpong" + std::to_string(run));
    if (rank < 2) {
      runs.push_back(
          ping_pong_us(flag, static_cast<uint32_t*>(peer), rank == 0, 2000, 20000, 30.0, s));
    }
  }
  rv.barrier("pingpong_done");  // the partner no longer writes into this flag
  if (peer != nullptr) SWIFTQK_CUDA_TRY(cudaIpcCloseMemHandle(peer));
  SWIFTQK_CUDA_TRY(cudaFree(flag));
  if (rank != 0) return 0.0;
  std::sort(runs.begin(), runs.end());
  return runs[1];
}

// The same shard normalised on this GPU alone (TP 1 over widths q/world and k/world): the work
// SwiftQK cannot avoid, with no exchange.
double local_only_us(const Options& o, Communicator& local, const Model& m, int world, int64_t t,
                     DType dt, NormOrder order, cudaStream_t s) {
  const Model shard{m.name, m.q / world, m.k / world, m.eps, order};
  Problem p = Problem::random(t, shard.q, shard.k, dt, order, m.eps, 4048 + t);
  std::vector<RankData> data;
  const int sets = rotation_sets(t, shard, dt);
  for (int i = 0; i < sets; ++i) {
    data.push_back(testing::make_rank(p, 1, 0, testing::Layout::kSeparate));
    apply_options(o, data.back().params);  // the floor launches as SwiftQK does
  }
  const Stats st = time_it(o, s, [&](int i) { launch_qk_norm(local, data[i % sets].params, s); });
  local.synchronize(s);
  return st.median;
}

}  // namespace

int run_rank(const Sweep& sw, int rank, int world, const std::string& dir) {
  const Options& o = sw.options;
  int devices = 0;
  SWIFTQK_CUDA_TRY(cudaGetDeviceCount(&devices));
  const int device = rank % devices;
  SWIFTQK_CUDA_TRY(cudaSetDevice(device));
  const bool own_gpu = world <= devices;
  const Rendezvous rv(dir, rank, world, 600.0);
  cudaStream_t s;
  SWIFTQK_CUDA_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));

  CommConfig cfg;
  int64_t max_tokens = 1;
  for (int64_t t : sw.tokens) max_tokens = std::max(max_tokens, t);
  cfg.token_capacity = std::max<int64_t>(16384, max_tokens);
  cfg.timeout_s = own_gpu ? 10.0 : 60.0;  // time-sliced processes make round trips slow
  ncclComm_t nccl = nullptr;
  std::optional<Communicator> comm;
  if (own_gpu) {
    ncclUniqueId id;
    if (rank == 0) {
      SWIFTQK_NCCL_TRY(ncclGetUniqueId(&id));
      rv.publish("nccl_id", std::vector<uint8_t>(id.internal, id.internal + sizeof id.internal));
    }
    const std::vector<uint8_t> b = rv.fetch("nccl_id", 0);
    std::copy(b.begin(), b.end(), id.internal);
    SWIFTQK_NCCL_TRY(ncclCommInitRank(&nccl, world, id, rank));
    comm.emplace(Communicator::from_nccl(nccl, cfg, s));
  } else {
    IpcBootstrap boot(rank, world, device, cfg);
    comm.emplace(boot.connect(rv.all_gather("handle", boot.local_handle())));
    rv.barrier("opened");
    SWIFTQK_EXPECTS(comm->probe_peers(s), "P2P write test failed between rank processes");
  }
  const double copy_bw = copy_gbps(o, s);
  // The floor of issue 6: one NVLink round trip plus the local-only time of the same shard.
  double rtt_us = 0.0;
  std::optional<Communicator> local;
  if (own_gpu && world > 1) {
    rtt_us = measure_round_trip_us(rv, rank, s);
    if (rank == 0) local.emplace(std::move(Communicator::create_local_group({device}, cfg)[0]));
  }
  if (rank == 0) {
    std::printf("%d rank processes on %d GPU(s) (%s), %s; copy bandwidth %.0f GB/s\n", world,
                std::min(world, devices), device_name().c_str(),
                own_gpu ? "NCCL bootstrap, every method, timed"
                        : "CUDA IPC, GPUs time-sliced: checked, not timed",
                copy_bw);
    if (rtt_us > 0) std::printf("NVLink signal round trip GPU 0 <-> GPU 1: %.2f us\n", rtt_us);
    print_header();
  }

  json all = json::array();
  int64_t total_wrong = 0;
  int step = 0;
  for (const Model& m : sw.models) {
    if (m.q % world != 0 || m.k % world != 0) continue;
    for (DType dt : sw.dtypes) {
      const NormOrder order = sw.order_for(m);
      for (int64_t t : sw.tokens) {
        // Every rank draws the same full problem and keeps its own shard; all methods get the
        // same inputs.
        Problem p = Problem::random(t, m.q, m.k, dt, order, m.eps, 2024 + t);
        for (Method method : sw.methods) {
          const std::string tag = std::to_string(step++);
          if (uses_nccl(method) && nccl == nullptr) {
            if (rank == 0) {
              std::printf("%-13s %-11s tp %d tokens %lld: not runnable (needs one GPU per rank)\n",
                          to_string(method).c_str(), m.name.c_str(), world, (long long)t);
            }
            continue;
          }
          const int sets = rotation_sets(t, m, dt);
          std::vector<RankData> data;
          for (int i = 0; i < sets; ++i) {
            data.push_back(testing::make_rank(p, world, rank, testing::Layout::kSeparate));
            data.back().params.method = method;
            apply_options(o, data.back().params);
          }
          p.refill(31337);
          testing::upload_inputs(p, world, rank, data[0], s);
          testing::poison(data[0], s);
          auto launch = [&](int i) { launch_qk_norm(*comm, data[i % sets].params, s); };
          launch(0);
          comm->synchronize(s);
          const Check chk = testing::check_rank(p, world, rank, data[0]);
          Stats st{0, 0, 0, 0};
          if (own_gpu) {
            rv.barrier("start" + tag);
            st = time_it(o, s, launch);
            comm->synchronize(s);
          }
          const auto results = rv.all_gather("result" + tag, to_bytes(rank_result(st, chk)));
          if (rank == 0) {
            std::vector<json> rs;
            for (const auto& b : results) rs.push_back(from_bytes(b));
            int64_t wrong = 0;
            const auto [merged, errors] = merge(rs, wrong);
            json j = make_row(method, m, world, t, dt, order, o, merged, copy_bw, errors, wrong,
                              std::min(world, devices));
            j["timed"] = own_gpu;
            total_wrong += wrong;
            print_row(j);
            if (local && method == Method::kSwiftQK) {
              const double lus = local_only_us(o, *local, m, world, t, dt, order, s);
              j["local_us"] = lus;
              j["rtt_us"] = rtt_us;
              j["floor_ratio"] = merged.median / (lus + rtt_us);
              std::printf(
                  "%-13s floor: local-only %.2f us + round trip %.2f us; SwiftQK / floor "
                  "= %.2f\n",
                  "", lus, rtt_us, j["floor_ratio"].get<double>());
            }
            record(sw, all, std::move(j));
          }
        }
      }
    }
  }
  rv.barrier("done");  // no rank unmaps its workspace while a peer may still write into it
  local.reset();
  comm.reset();
  if (nccl != nullptr) SWIFTQK_NCCL_TRY(ncclCommDestroy(nccl));
  if (rank != 0) return 0;
  return finish(sw, all, total_wrong);
}

}  // namespace swiftqk::bench
