// Asynchronous global-to-shared copies (cp.async) and their waits: how the kernels stage rows.
#pragma once

#include <cstdint>

#include "swiftqk/launch_tuning.hpp"

namespace swiftqk::detail {

/// Asynchronous 16-byte global-to-shared copy (completes per thread at cp_async_wait) to the
/// shared-window address s (converted once per block, not per copy).
__device__ __forceinline__ void cp_async16(uint32_t s, const void* gmem) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(gmem) : "memory");
}
/// The same for 8 or 4 bytes (rows of 8- or 4-byte vectors); .cg, which skips L1, takes 16
/// bytes only.
template <int kBytes>
__device__ __forceinline__ void cp_async_narrow(uint32_t s, const void* gmem) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], %2;" ::"r"(s), "l"(gmem), "n"(kBytes)
               : "memory");
}
template <int kBytes>
__device__ __forceinline__ void cp_async_vec(uint32_t s, const void* gmem) {
  static_assert(kBytes == 16 || kBytes == 8 || kBytes == 4,
                "rows are staged in 16-, 8- or 4-byte vectors");
  if constexpr (kBytes == 16) {
    cp_async16(s, gmem);
  } else {
    cp_async_narrow<kBytes>(s, gmem);
  }
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

/// Waits until at most n of this thread's cp.async groups are pending (n is an immediate in PTX).
__device__ __forceinline__ void cp_async_wait_pending(int n) {
  if (n == 1) {  // the default depths (2 alone, 3 with peers and deferral) come here
    cp_async_wait<1>();
  } else if (n == 0) {
    cp_async_wait<0>();
  } else if (n == 2) {
    cp_async_wait<2>();
  } else if (n == 3) {
    cp_async_wait<3>();
  } else {
    cp_async_wait<kMaxStages - 1>();
  }
}

/// A copy of 16, 8 or 4 bytes chosen at run time (the epilogue's weights, rows, positions and
/// cos/sin rows).
__device__ __forceinline__ void cp_async_bytes(uint32_t s, const void* g, int bytes) {
  if (bytes == 16) {
    cp_async16(s, g);
  } else if (bytes == 8) {
    cp_async_narrow<8>(s, g);
  } else {
    cp_async_narrow<4>(s, g);
  }
}

}  // namespace swiftqk::detail
