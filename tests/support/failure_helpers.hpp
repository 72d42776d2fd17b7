// What the failure-path tests share: a wall clock for bounds on how fast an error comes, a
// non-blocking stream, the text a communicator's check_error() raises, and a rank's outputs as
// bytes for bitwise comparisons.
#pragma once

#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "cuda_check.hpp"
#include "problem.hpp"
#include "swiftqk/communicator.hpp"
#include "swiftqk/error.hpp"

namespace swiftqk::testing {

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

inline cudaStream_t new_stream() {
  cudaStream_t s;
  SWIFTQK_CUDA_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  return s;
}

/// What check_error() raised, or "" if it raised nothing.
inline std::string error_of(const Communicator& c) {
  try {
    c.check_error();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

/// The whole output buffer (both shards and rstd) as bytes, after the device has finished.
inline std::vector<uint8_t> output_bytes(const RankData& d) {
  SWIFTQK_CUDA_TRY(cudaDeviceSynchronize());
  std::vector<uint8_t> b(d.out.bytes() + d.rstd.bytes());
  SWIFTQK_CUDA_TRY(cudaMemcpy(b.data(), d.out.get(), d.out.bytes(), cudaMemcpyDeviceToHost));
  SWIFTQK_CUDA_TRY(
      cudaMemcpy(b.data() + d.out.bytes(), d.rstd.get(), d.rstd.bytes(), cudaMemcpyDeviceToHost));
  return b;
}

/// Replays `graph` n times on s, each rank's outputs poisoned before each replay, and counts the
/// replays whose outputs differ in any byte from `want` (each rank's output_bytes of a checked
/// call).
inline int replays_unlike(cudaGraphExec_t graph, cudaStream_t s,
                          const std::vector<RankData*>& ranks,
                          const std::vector<std::vector<uint8_t>>& want, int n) {
  int unlike = 0;
  for (int i = 0; i < n; ++i) {
    for (RankData* d : ranks) poison(*d, s);
    SWIFTQK_CUDA_TRY(cudaGraphLaunch(graph, s));
    bool same = true;
    for (std::size_t r = 0; r < ranks.size(); ++r)
      same = same && output_bytes(*ranks[r]) == want[r];
    if (!same) ++unlike;
  }
  return unlike;
}

}  // namespace swiftqk::testing
