// A kernel that holds SMs, as a long GEMM or an NCCL kernel on another stream would: the
// co-residency tests and swiftqk_fault_report's scenarios run SwiftQK beside it.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace swiftqk::testing {

/// Launches `blocks` blocks on `stream`, each taking a whole SM (the most shared memory a block
/// may have) and spinning for `ns` nanoseconds of the device timer.
void launch_sm_hog(int blocks, uint64_t ns, cudaStream_t stream);

}  // namespace swiftqk::testing
