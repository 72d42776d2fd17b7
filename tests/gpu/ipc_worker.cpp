// One rank of a group of separate processes sharing GPUs through CUDA IPC. Handles and a final
// barrier travel through files in a directory. Exit code 0: every checked call was correct.
//   swiftqk_ipc_worker RANK WORLD DIR [TOKENS] [CALLS] [DEVICE] [DIE_RANK DIE_CALL] [Q K]
// DEVICE -1: rank r uses GPU r mod #GPUs (one GPU per rank when there are enough). Q and K are
// the full widths (default 5120 and 1024, OLMo3-32B); DIE_RANK -1 runs without a fault.
// Fault mode (DIE_RANK >= 0): rank DIE_RANK exits abruptly at call DIE_CALL, as a killed process
// would; every other rank must then get a clear error within its timeout (exit 0), not hang and
// not return silently (exit 4).
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "problem.hpp"
#include "rendezvous.hpp"

using namespace swiftqk;
using namespace swiftqk::testing;

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s RANK WORLD DIR [TOKENS] [CALLS] [DEVICE]\n", argv[0]);
    return 2;
  }
  const int rank = std::stoi(argv[1]), world = std::stoi(argv[2]);
  const std::string dir = argv[3];
  const int64_t tokens = argc > 4 ? std::stoll(argv[4]) : 64;
  const int calls = argc > 5 ? std::stoi(argv[5]) : 6;
  int device = argc > 6 ? std::stoi(argv[6]) : 0;
  const int die_rank = argc > 8 ? std::stoi(argv[7]) : -1;
  const int die_call = argc > 8 ? std::stoi(argv[8]) : -1;
  const int64_t q_width = argc > 10 ? std::stoll(argv[9]) : 5120;
  const int64_t k_width = argc > 10 ? std::stoll(argv[10]) : 1024;
  try {
    if (device < 0) {
      int count = 0;
      SWIFTQK_CUDA_TRY(cudaGetDeviceCount(&count));
      device = rank % count;
    }
    SWIFTQK_CUDA_TRY(cudaSetDevice(device));
    CommConfig cfg;
    // Processes sharing one GPU time-slice: a round trip takes milliseconds. In fault mode a
    // shorter bound shows that survivors stop in time.
    cfg.timeout_s = die_rank >= 0 ? 3.0 : 30.0;
    const Rendezvous rv(dir, rank, world);
    IpcBootstrap boot(rank, world, device, cfg);
    Communicator comm = boot.connect(rv.all_gather("handle", boot.local_handle()));
    rv.barrier("opened");
    cudaStream_t s;
    SWIFTQK_CUDA_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    if (!comm.probe_peers(s)) SWIFTQK_FAIL("P2P write test failed");

    // Every process draws the same full problem from the seed and keeps its own shard.
    Problem p =
        Problem::random(tokens, q_width, k_width, DType::kBF16, NormOrder::kOlmo2, 1e-6f, 42);
    RankData d = make_rank(p, world, rank, Layout::kFusedOutOfPlace);
    cudaGraphExec_t ge = capture_graph(s, [&] { launch_qk_norm(comm, d.params, s); });
    int wrong_calls = 0;
    for (int call = 0; call < calls; ++call) {
      if (call == die_call && rank == die_rank) _exit(0);  // no cleanup: a killed process
      p.refill(500 + call);
      upload_inputs(p, world, rank, d, s);
      poison(d, s);
      if (call % 2 == 0) {
        launch_qk_norm(comm, d.params, s);
      } else {
        SWIFTQK_CUDA_TRY(cudaGraphLaunch(ge, s));
      }
      if (call == die_call) {
        const auto start = std::chrono::steady_clock::now();
        try {
          comm.synchronize(s);
        } catch (const Error& e) {
          const double secs =
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
          std::printf("rank %d survived a dead peer after %.1f s: %s\n", rank, secs, e.what());
          return secs < 3.0 * cfg.timeout_s ? 0 : 5;
        }
        std::fprintf(stderr, "rank %d: the call with a dead peer returned without an error\n",
                     rank);
        return 4;
      }
      comm.synchronize(s);
      const int64_t wrong = check_rank(p, world, rank, d).wrong;
      if (wrong > 0) {
        std::fprintf(stderr, "rank %d call %d: %lld wrong elements\n", rank, call,
                     static_cast<long long>(wrong));
        ++wrong_calls;
      }
    }
    rv.barrier("done");  // no rank unmaps while a peer may still write
    SWIFTQK_CUDA_TRY(cudaGraphExecDestroy(ge));
    std::printf("rank %d/%d: %d calls of %lld tokens (Q %lld, K %lld), %d wrong\n", rank, world,
                calls, static_cast<long long>(tokens), static_cast<long long>(q_width),
                static_cast<long long>(k_width), wrong_calls);
    return wrong_calls == 0 ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
    return 3;
  }
}
