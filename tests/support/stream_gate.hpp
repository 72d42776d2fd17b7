// A host-side gate for starting work on several streams together: a host function enqueued on
// one stream blocks it until release(), and the others wait on an event recorded behind it.
#pragma once

#include <cuda_runtime_api.h>

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "cuda_check.hpp"

namespace swiftqk::testing {

struct Gate {
  std::mutex mu;
  std::condition_variable cv;
  bool open = false;
  static void CUDART_CB wait(void* self) {
    Gate* g = static_cast<Gate*>(self);
    std::unique_lock<std::mutex> lock(g->mu);
    g->cv.wait(lock, [g] { return g->open; });
  }
  void release() {
    std::lock_guard<std::mutex> lock(mu);
    open = true;
    cv.notify_all();
  }
};

/// What replay_together saw: each stream's synchronisation, and the seconds from the gate's
/// release until both streams had finished.
struct Together {
  cudaError_t a = cudaSuccess, b = cudaSuccess;
  double seconds = 0;
};

/// Replays ga on sa and gb on sb so that they start together: both streams wait on `opened`,
/// recorded on sg behind a gate that opens once both graphs are enqueued; then waits for both.
/// The gate lives until they are done (the event behind it has fired by then).
inline Together replay_together(cudaGraphExec_t ga, cudaStream_t sa, cudaGraphExec_t gb,
                                cudaStream_t sb, cudaStream_t sg, cudaEvent_t opened) {
  Gate gate;
  SWIFTQK_CUDA_TRY(cudaLaunchHostFunc(sg, &Gate::wait, &gate));
  SWIFTQK_CUDA_TRY(cudaEventRecord(opened, sg));
  SWIFTQK_CUDA_TRY(cudaStreamWaitEvent(sa, opened, 0));
  SWIFTQK_CUDA_TRY(cudaStreamWaitEvent(sb, opened, 0));
  SWIFTQK_CUDA_TRY(cudaGraphLaunch(ga, sa));
  SWIFTQK_CUDA_TRY(cudaGraphLaunch(gb, sb));
  const auto start = std::chrono::steady_clock::now();
  gate.release();
  Together t;
  t.a = cudaStreamSynchronize(sa);
  t.b = cudaStreamSynchronize(sb);
  t.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return t;
}

}  // namespace swiftqk::testing
