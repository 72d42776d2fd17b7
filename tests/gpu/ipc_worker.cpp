// One rank of a group of separate processes sharing GPUs through CUDA IPC. Handles and a final
// barrier travel through files in a directory. Exit code 0: every checked call was correct and
// every fault was seen as it must be.
//   swiftqk_ipc_worker RANK WORLD DIR [TOKENS] [CALLS] [DEVICE] [FAULT_RANK FAULT_CALL] [Q K]
//                      [MODE]
// DEVICE -1: rank r uses GPU r mod #GPUs (one GPU per rank when there are enough). Q and K are
// the full widths (default 5120 and 1024, OLMo3-32B); FAULT_RANK -1 runs without a fault.
// MODE (with FAULT_RANK >= 0):
//   die         rank FAULT_RANK exits abruptly at call FAULT_CALL, as a killed process would;
//               every other rank must get a clear error within its timeout (not hang, and not
//               return silently: exit 4).
//   late        rank FAULT_RANK starts call FAULT_CALL 2.5 timeouts late. Every rank must raise
//               (the others by their timeout, the late one at once), leave no finite wrong
//               output, write NaN when replaying a graph captured before the fault, and after a
//               collective reset() make the remaining calls (eager and that graph) correctly.
//   late_close  rank FAULT_RANK calls close() 1.5 s after the others: their close() must wait
//               for it (a peer could still write into their memory), and every close succeeds.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "failure_helpers.hpp"
#include "problem.hpp"
#include "rendezvous.hpp"

using namespace swiftqk;
using namespace swiftqk::testing;

namespace {

void sleep_s(double s) { std::this_thread::sleep_for(std::chrono::duration<double>(s)); }

// A failed check: the message on stderr, the exit code returned.
int fail(int rank, int code, const std::string& what) {
  std::fprintf(stderr, "rank %d: %s\n", rank, what.c_str());
  return code;
}

struct Run {
  int rank, world;
  Communicator& comm;
  cudaStream_t s;
  Problem& p;
  RankData& d;
  cudaGraphExec_t graph;  // captured before any fault
  double timeout_s;
};

// Call `call`: fresh inputs, poisoned outputs, eager on even calls and the graph on odd ones.
void launch_call(Run& r, int call) {
  r.p.refill(500 + call);
  upload_inputs(r.p, r.world, r.rank, r.d, r.s);
  poison(r.d, r.s);
  if (call % 2 == 0) {
    launch_qk_norm(r.comm, r.d.params, r.s);
  } else {
    SWIFTQK_CUDA_TRY(cudaGraphLaunch(r.graph, r.s));
  }
}

int checked_call(Run& r, int call) {
  launch_call(r, call);
  r.comm.synchronize(r.s);
  const int64_t wrong = check_rank(r.p, r.world, r.rank, r.d).wrong;
  if (wrong == 0) return 0;
  return fail(r.rank, 1,
              "call " + std::to_string(call) + ": " + std::to_string(wrong) + " wrong elements");
}

// The late call of mode `late`, then the replay after the fault and the collective reset.
int late_call(Run& r, int call, int late_rank) {
  const bool late = r.rank == late_rank;
  if (late) sleep_s(2.5 * r.timeout_s);
  r.p.refill(500 + call);
  upload_inputs(r.p, r.world, r.rank, r.d, r.s);
  poison(r.d, r.s);
  auto start = Clock::now();
  std::string error;
  try {
    launch_qk_norm(r.comm, r.d.params, r.s);
    r.comm.synchronize(r.s);
  } catch (const Error& e) {
    error = e.what();
  }
  const double secs = seconds_since(start);
  if (error.empty()) return fail(r.rank, 4, "the call with a late peer returned without an error");
  std::printf("rank %d: the call with late rank %d raised after %.2f s: %s\n", r.rank, late_rank,
              secs, error.c_str());
  // The late rank finds the group failed and stops at once; the others by their timeout.
  if (secs > (late ? 0.5 : 3.0) * r.timeout_s) return fail(r.rank, 5, "the error came too late");
  const DeviceFailure f = r.comm.failure();
  if (late ? f.code != 3u : f.code != 1u && f.code != 3u) {
    return fail(r.rank, 6, "failure code " + std::to_string(f.code));
  }
  if (f.code == 1u && f.peer != late_rank) {
    return fail(r.rank, 6, "timed out on rank " + std::to_string(f.peer) + ", not the late one");
  }
  const Census c = census_rank(r.p, r.world, r.rank, r.d);
  if (c.wrong != 0 || c.nan == 0 || (late && !c.all_nan())) {
    return fail(r.rank, 7,
                "after the fault: " + std::to_string(c.correct) + " correct, " +
                    std::to_string(c.nan) + " NaN, " + std::to_string(c.wrong) + " wrong");
  }

  // A graph captured before the fault has no host step: its replay writes NaN, at once.
  poison(r.d, r.s);
  start = Clock::now();
  SWIFTQK_CUDA_TRY(cudaGraphLaunch(r.graph, r.s));
  SWIFTQK_CUDA_TRY(cudaStreamSynchronize(r.s));
  if (seconds_since(start) > 0.5 * r.timeout_s) return fail(r.rank, 8, "a replay waited");
  if (!census_rank(r.p, r.world, r.rank, r.d).all_nan()) {
    return fail(r.rank, 8, "a replay after the fault left a plausible output");
  }
  bool raised = false;
  try {
    r.comm.check_error();
  } catch (const Error&) {
    raised = true;
  }
  if (!raised) return fail(r.rank, 8, "check_error() was clean after the fault");

  // Collective recovery: every rank resets (the late one last); the peers' late writes of the
  // failed call cannot land after it.
  start = Clock::now();
  r.comm.reset();
  std::printf("rank %d: reset in %.2f s\n", r.rank, seconds_since(start));
  if (r.comm.failure().code != 0u) return fail(r.rank, 9, "the reset left a failure");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr,
                 "usage: %s RANK WORLD DIR [TOKENS] [CALLS] [DEVICE] [FAULT_RANK FAULT_CALL] "
                 "[Q K] [die|late|late_close]\n",
                 argv[0]);
    return 2;
  }
  const int rank = std::stoi(argv[1]), world = std::stoi(argv[2]);
  const std::string dir = argv[3];
  const int64_t tokens = argc > 4 ? std::stoll(argv[4]) : 64;
  const int calls = argc > 5 ? std::stoi(argv[5]) : 6;
  int device = argc > 6 ? std::stoi(argv[6]) : 0;
  const int fault_rank = argc > 8 ? std::stoi(argv[7]) : -1;
  const int fault_call = argc > 8 ? std::stoi(argv[8]) : -1;
  const int64_t q_width = argc > 10 ? std::stoll(argv[9]) : 5120;
  const int64_t k_width = argc > 10 ? std::stoll(argv[10]) : 1024;
  const std::string mode = fault_rank < 0 ? "none" : (argc > 11 ? argv[11] : "die");
  if (mode != "none" && mode != "die" && mode != "late" && mode != "late_close") {
    std::fprintf(stderr, "rank %d: unknown mode %s\n", rank, mode.c_str());
    return 2;
  }
  try {
    if (device < 0) {
      int count = 0;
      SWIFTQK_CUDA_TRY(cudaGetDeviceCount(&count));
      device = rank % count;
    }
    SWIFTQK_CUDA_TRY(cudaSetDevice(device));
    CommConfig cfg;
    // Processes sharing one GPU time-slice: a round trip takes milliseconds. In the fault modes
    // a shorter bound shows that the ranks stop in time.
    cfg.timeout_s = mode == "none" ? 30.0 : (mode == "die" ? 3.0 : 2.0);
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
    Run r{rank, world, comm, s, p, d, ge, cfg.timeout_s};
    int wrong_calls = 0;
    for (int call = 0; call < calls; ++call) {
      if (mode == "die" && call == fault_call) {
        if (rank == fault_rank) _exit(0);  // no cleanup: a killed process
        launch_call(r, call);
        const auto start = Clock::now();
        try {
          comm.synchronize(s);
        } catch (const Error& e) {
          const double secs = seconds_since(start);
          std::printf("rank %d survived a dead peer after %.1f s: %s\n", rank, secs, e.what());
          return secs < 3.0 * cfg.timeout_s ? 0 : 5;
        }
        return fail(rank, 4, "the call with a dead peer returned without an error");
      }
      if (mode == "late" && call == fault_call) {
        const int rc = late_call(r, call, fault_rank);
        if (rc != 0) return rc;
        continue;
      }
      if (checked_call(r, call) != 0) ++wrong_calls;
    }
    SWIFTQK_CUDA_TRY(cudaGraphExecDestroy(ge));
    if (mode == "late_close") {
      // close() meets every peer at a bounded barrier before it unmaps and frees: the punctual
      // ranks wait there for the late one.
      if (rank == fault_rank) sleep_s(1.5);
      const auto start = Clock::now();
      comm.close();
      const double secs = seconds_since(start);
      std::printf("rank %d: close() returned after %.2f s\n", rank, secs);
      if (rank != fault_rank && secs < 0.5) {
        return fail(rank, 10, "close() did not wait for the late peer");
      }
    } else {
      rv.barrier("done");  // no rank unmaps while a peer may still write
    }
    std::printf("rank %d/%d: %d calls of %lld tokens (Q %lld, K %lld), mode %s, %d wrong\n", rank,
                world, calls, static_cast<long long>(tokens), static_cast<long long>(q_width),
                static_cast<long long>(k_width), mode.c_str(), wrong_calls);
    return wrong_calls == 0 ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
    return 3;
  }
}
