// Checks for every CUDA runtime and NCCL call the library, its tests and the benchmark make
// (internal: a user checks the user's own calls). Kept apart from error.hpp so CPU-only code
// (planning, validation, the reference) builds without CUDA headers.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "swiftqk/error.hpp"

/// @brief Throws swiftqk::Error with the CUDA error's name and text when call fails.
#define SWIFTQK_CUDA_TRY(call)                                                             \
  do {                                                                                     \
    cudaError_t swiftqk_status_ = (call);                                                  \
    if (swiftqk_status_ != cudaSuccess) {                                                  \
      ::swiftqk::detail::fail(std::string(#call) +                                         \
                                  " failed: " + cudaGetErrorName(swiftqk_status_) + " (" + \
                                  cudaGetErrorString(swiftqk_status_) + ")",               \
                              __FILE__, __LINE__);                                         \
    }                                                                                      \
  } while (0)

/// @brief Throws swiftqk::Error with NCCL's error text when call fails (needs <nccl.h>).
#define SWIFTQK_NCCL_TRY(call)                                                                   \
  do {                                                                                           \
    ncclResult_t swiftqk_nccl_status_ = (call);                                                  \
    if (swiftqk_nccl_status_ != ncclSuccess) {                                                   \
      ::swiftqk::detail::fail(                                                                   \
          std::string(#call) + " failed: " + ncclGetErrorString(swiftqk_nccl_status_), __FILE__, \
          __LINE__);                                                                             \
    }                                                                                            \
  } while (0)
