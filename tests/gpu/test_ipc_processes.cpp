// Real separate processes, one per rank, sharing the GPU through CUDA IPC (they time-slice, so
// this checks correctness, not speed).
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "problem.hpp"
#include "protocol.hpp"
#include "require_gpu.hpp"

extern char** environ;

namespace swiftqk::testing {
namespace {

// The worker sits beside this test binary (the build tree may have moved since it was built).
std::string worker_path() {
  if (const char* env = std::getenv("SWIFTQK_IPC_WORKER")) return env;
  return (std::filesystem::read_symlink("/proc/self/exe").parent_path() / "swiftqk_ipc_worker")
      .string();
}

// Runs `world` worker processes (ipc_worker.cpp: the arguments and the fault modes) and returns
// how many did not exit 0 within the deadline.
int run_group(int world, int64_t tokens, int calls, int fault_rank = -1, int fault_call = -1,
              int device = 0, int64_t q_width = 5120, int64_t k_width = 1024,
              const std::string& mode = "die") {
  const std::string dir = std::filesystem::temp_directory_path() /
                          ("swiftqk_ipc_" + std::to_string(getpid()) + "_" + std::to_string(world));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r) {
    std::vector<std::string> args = {worker_path(),
                                     std::to_string(r),
                                     std::to_string(world),
                                     dir,
                                     std::to_string(tokens),
                                     std::to_string(calls),
                                     std::to_string(device),
                                     std::to_string(fault_rank),
                                     std::to_string(fault_call),
                                     std::to_string(q_width),
                                     std::to_string(k_width),
                                     mode};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_t pid;
    if (posix_spawn(&pid, argv[0], nullptr, nullptr, argv.data(), environ) != 0) return -1;
    pids.push_back(pid);
  }
  int failures = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(240);
  for (pid_t pid : pids) {
    int status = 0;
    while (waitpid(pid, &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        for (pid_t q : pids) kill(q, SIGKILL);
        waitpid(pid, &status, 0);
        ++failures;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ++failures;
  }
  std::filesystem::remove_all(dir);
  return failures;
}

TEST(IpcProcesses, TwoRanks) {
  REQUIRE_GPU();
  EXPECT_EQ(run_group(2, 96, 6), 0);
}

// A peer process that dies in the middle of a run (after two good calls): the survivors fail
// with a clear error within their timeout; nothing hangs.
TEST(IpcProcesses, KilledPeerMakesSurvivorsFailInTime) {
  REQUIRE_GPU();
  EXPECT_EQ(run_group(4, 40, 6, /*fault_rank=*/2, /*fault_call=*/2), 0);
}

// A peer process 2.5 timeouts late (issue: failure semantics across processes): every rank
// raises, the late one at once; no output is finite and wrong; a graph captured before the fault
// replays as NaN; a collective reset() then gives correct eager calls and replays of that graph.
TEST(IpcProcesses, LatePeerFailsLoudlyAndResetRecovers) {
  REQUIRE_GPU();
  EXPECT_EQ(run_group(2, 64, 6, /*fault_rank=*/1, /*fault_call=*/2, 0, 4096, 1024, "late"), 0);
}

TEST(IpcProcesses, FourRanksLatePeerResetRecovers) {
  REQUIRE_GPU();
  EXPECT_EQ(run_group(4, 40, 5, /*fault_rank=*/3, /*fault_call=*/1, 0, 5120, 1024, "late"), 0);
}

// Teardown while a peer is late: the punctual processes' close() waits at its barrier for the
// late one (no peer can still write into memory that is unmapped and freed), and all succeed.
TEST(IpcProcesses, CloseWaitsForALatePeerProcess) {
  REQUIRE_GPU();
  EXPECT_EQ(run_group(3, 32, 2, /*fault_rank=*/0, /*fault_call=*/0, 0, 3072, 1536, "late_close"),
            0);
}

TEST(IpcProcesses, FourRanks) {
  REQUIRE_GPU();
  EXPECT_EQ(run_group(4, 33, 4), 0);
}

// Eight processes with rows of 512 elements a rank and 512 tokens (choose_slot_layout:
// source-major slots): they agree on the slot order without exchanging it. Device -1 puts rank r
// on GPU r mod #GPUs, so on one GPU the eight time-slice it.
TEST(IpcProcesses, EightRanksShortRowsSourceMajorSlots) {
  REQUIRE_GPU();
  ASSERT_EQ(choose_slot_layout(8, 2048, 2048, 512), SlotLayout::kSourceMajor);
  EXPECT_EQ(run_group(8, 512, 3, -1, -1, /*device=*/-1, 2048, 2048), 0);
}

int gpu_count() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

// One process per GPU (device -1: rank r on GPU r): the exchange crosses NVLink.
TEST(IpcProcesses, OneGpuPerRank) {
  if (gpu_count() < 2) {
    GTEST_SKIP() << "needs 2 GPUs, this machine has " << gpu_count() << ": multi-GPU test skipped";
  }
  EXPECT_EQ(run_group(gpu_count(), 4096, 8, -1, -1, /*device=*/-1), 0);
}

TEST(IpcProcesses, KilledPeerOnAnotherGpu) {
  if (gpu_count() < 2) {
    GTEST_SKIP() << "needs 2 GPUs, this machine has " << gpu_count() << ": multi-GPU test skipped";
  }
  EXPECT_EQ(run_group(gpu_count(), 300, 6, /*fault_rank=*/1, /*fault_call=*/3, /*device=*/-1), 0);
}

// The late-peer and late-close scenarios with one process per GPU (rank r on GPU r).
TEST(IpcProcesses, LatePeerOnAnotherGpuResetRecovers) {
  if (gpu_count() < 2) {
    GTEST_SKIP() << "needs 2 GPUs, this machine has " << gpu_count() << ": multi-GPU test skipped";
  }
  EXPECT_EQ(run_group(gpu_count(), 4096, 6, /*fault_rank=*/gpu_count() - 1, /*fault_call=*/2,
                      /*device=*/-1, 5120, 1024, "late"),
            0);
}

TEST(IpcProcesses, CloseWaitsForALatePeerOnAnotherGpu) {
  if (gpu_count() < 2) {
    GTEST_SKIP() << "needs 2 GPUs, this machine has " << gpu_count() << ": multi-GPU test skipped";
  }
  EXPECT_EQ(run_group(gpu_count(), 512, 2, /*fault_rank=*/0, /*fault_call=*/0, /*device=*/-1, 5120,
                      1024, "late_close"),
            0);
}

}  // namespace
}  // namespace swiftqk::testing
