// What the failure-path tests share: a wall clock for bounds on how fast an error comes, a
// non-blocking stream, and the text a communicator's check_error() raises.
#pragma once

#include <cuda_runtime_api.h>

#include <chrono>
#include <string>

#include "cuda_check.hpp"
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

}  // namespace swiftqk::testing
