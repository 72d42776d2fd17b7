// One rank of a group of separate processes sharing GPUs through CUDA IPC. Handles and a final
// barrier travel through files in a directory. Exit code 0: every checked call was correct.
//   swiftqk_ipc_worker RANK WORLD DIR [TOKENS] [CALLS] [DEVICE]
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "problem.hpp"

using namespace swiftqk;
using namespace swiftqk::testing;

namespace {

void write_file(const std::string& path, const std::vector<uint8_t>& bytes) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary);
    f.write(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  }
  std::rename(tmp.c_str(), path.c_str());  // readers never see a partial file
}

std::vector<uint8_t> wait_file(const std::string& path, double timeout_s) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (std::chrono::steady_clock::now() < deadline) {
    std::ifstream f(path, std::ios::binary);
    if (f) return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), {});
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  SWIFTQK_FAIL("timed out waiting for " + path);
}

void barrier(const std::string& dir, const std::string& name, int rank, int world) {
  write_file(dir + "/" + name + "_" + std::to_string(rank), {1});
  for (int r = 0; r < world; ++r) wait_file(dir + "/" + name + "_" + std::to_string(r), 60);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s RANK WORLD DIR [TOKENS] [CALLS] [DEVICE]\n", argv[0]);
    return 2;
  }
  const int rank = std::stoi(argv[1]), world = std::stoi(argv[2]);
  const std::string dir = argv[3];
  const int64_t tokens = argc > 4 ? std::stoll(argv[4]) : 64;
  const int calls = argc > 5 ? std::stoi(argv[5]) : 6;
  const int device = argc > 6 ? std::stoi(argv[6]) : 0;
  try {
    SWIFTQK_CUDA_TRY(cudaSetDevice(device));
    CommConfig cfg;
    cfg.timeout_s = 30.0;  // processes sharing one GPU time-slice: a round trip is milliseconds
    IpcBootstrap boot(rank, world, device, cfg);
    write_file(dir + "/handle_" + std::to_string(rank), boot.local_handle());
    std::vector<std::vector<uint8_t>> handles;
    for (int r = 0; r < world; ++r)
      handles.push_back(wait_file(dir + "/handle_" + std::to_string(r), 60));
    Communicator comm = boot.connect(handles);
    barrier(dir, "opened", rank, world);
    cudaStream_t s;
    SWIFTQK_CUDA_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    if (!comm.probe_peers(s)) SWIFTQK_FAIL("P2P write test failed");

    // Every process draws the same full problem from the seed and keeps its own shard.
    Problem p = Problem::random(tokens, 5120, 1024, DType::kBF16, NormOrder::kOlmo2, 1e-6f, 42);
    RankData d = make_rank(p, world, rank, Layout::kFusedOutOfPlace);
    cudaGraph_t g;
    cudaGraphExec_t ge;
    SWIFTQK_CUDA_TRY(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    launch_qk_norm(comm, d.params, s);
    SWIFTQK_CUDA_TRY(cudaStreamEndCapture(s, &g));
    SWIFTQK_CUDA_TRY(cudaGraphInstantiate(&ge, g, 0));
    int wrong_calls = 0;
    for (int call = 0; call < calls; ++call) {
      p.refill(500 + call);
      upload_inputs(p, world, rank, d, s);
      poison(d, s);
      if (call % 2 == 0) {
        launch_qk_norm(comm, d.params, s);
      } else {
        SWIFTQK_CUDA_TRY(cudaGraphLaunch(ge, s));
      }
      comm.synchronize(s);
      // Check this rank's shard against the gold output's matching columns.
      const int64_t qs = p.q_width / world, ks = p.k_width / world;
      std::vector<double> gq = p.gold_q(), gk = p.gold_k(), got_q, got_k, ref_q, ref_k;
      std::vector<uint8_t> host_q(tokens * qs * 2), host_k(tokens * ks * 2);
      SWIFTQK_CUDA_TRY(cudaMemcpy2D(host_q.data(), qs * 2, d.params.q.out,
                                    d.params.q.out_stride * 2, qs * 2, tokens,
                                    cudaMemcpyDeviceToHost));
      SWIFTQK_CUDA_TRY(cudaMemcpy2D(host_k.data(), ks * 2, d.params.k.out,
                                    d.params.k.out_stride * 2, ks * 2, tokens,
                                    cudaMemcpyDeviceToHost));
      for (int64_t t = 0; t < tokens; ++t) {
        for (int64_t j = 0; j < qs; ++j) {
          got_q.push_back(ref::load_element(host_q.data(), DType::kBF16, t * qs + j));
          ref_q.push_back(gq[t * p.q_width + rank * qs + j]);
        }
        for (int64_t j = 0; j < ks; ++j) {
          got_k.push_back(ref::load_element(host_k.data(), DType::kBF16, t * ks + j));
          ref_k.push_back(gk[t * p.k_width + rank * ks + j]);
        }
      }
      const int64_t wrong = ref::count_out_of_tolerance(got_q, ref_q, DType::kBF16, p.order) +
                            ref::count_out_of_tolerance(got_k, ref_k, DType::kBF16, p.order);
      if (wrong > 0) {
        std::fprintf(stderr, "rank %d call %d: %lld wrong elements\n", rank, call,
                     static_cast<long long>(wrong));
        ++wrong_calls;
      }
    }
    barrier(dir, "done", rank, world);  // no rank unmaps while a peer may still write
    SWIFTQK_CUDA_TRY(cudaGraphExecDestroy(ge));
    SWIFTQK_CUDA_TRY(cudaGraphDestroy(g));
    std::printf("rank %d/%d: %d calls, %d wrong\n", rank, world, calls, wrong_calls);
    return wrong_calls == 0 ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
    return 3;
  }
}
