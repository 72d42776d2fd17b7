// A plain vectorised device copy: the bandwidth ceiling the QK-norm kernels are compared with
// (cudaMemcpy between device buffers can run on copy engines, slower than the SMs can move).
#include <cuda_runtime_api.h>

#include <cstdint>

#include "copy_kernel.hpp"
#include "cuda_check.hpp"

namespace swiftqk::bench {

namespace {
__global__ void copy_kernel(const uint4* __restrict__ src, uint4* __restrict__ dst, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += 4 * stride) {
    uint4 v[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      if (i + u * stride < n) v[u] = src[i + u * stride];
    }
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      if (i + u * stride < n) dst[i + u * stride] = v[u];
    }
  }
}
}  // namespace

void launch_copy(const void* src, void* dst, std::size_t bytes, cudaStream_t stream) {
  int sms = 0, dev = 0;
  SWIFTQK_CUDA_TRY(cudaGetDevice(&dev));
  SWIFTQK_CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  copy_kernel<<<sms * 8, 256, 0, stream>>>(static_cast<const uint4*>(src), static_cast<uint4*>(dst),
                                           static_cast<int64_t>(bytes / 16));
  SWIFTQK_CUDA_TRY(cudaGetLastError());
}

}  // namespace swiftqk::bench
