// The SM-holding kernel of sm_hog.hpp.
#include "cuda_check.hpp"
#include "sm_hog.hpp"

namespace swiftqk::testing {

namespace {

__global__ void sm_hog_kernel(uint64_t ns) {
  extern __shared__ char smem[];
  uint64_t start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    if (threadIdx.x == 0) smem[0] = static_cast<char>(now);
  } while (now - start < ns);
}

}  // namespace

void launch_sm_hog(int blocks, uint64_t ns, cudaStream_t stream) {
  int device = 0, smem = 0;
  SWIFTQK_CUDA_TRY(cudaGetDevice(&device));
  SWIFTQK_CUDA_TRY(cudaDeviceGetAttribute(&smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  SWIFTQK_CUDA_TRY(
      cudaFuncSetAttribute(sm_hog_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  sm_hog_kernel<<<blocks, 32, smem, stream>>>(ns);
  SWIFTQK_CUDA_TRY(cudaGetLastError());
}

}  // namespace swiftqk::testing
