// Device and kernel properties a launch asks for, each asked of CUDA once and cached (launches
// are on the hot path): attributes, residency, whether PDL may be used; and the launch itself.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "cuda_check.hpp"

namespace swiftqk::detail {

/// @brief A device attribute, asked once per attribute and device.
int device_attribute(cudaDeviceAttr what, int device);
/// @brief SMs of `device`.
int sm_count(int device);
/// @brief A kernel's attributes on a device (the caller has made it current).
cudaFuncAttributes func_attributes(const void* fn, int device);
/// @brief Whether `fn` may be launched with programmatic dependent launch on `device`.
bool can_launch_pdl(const void* fn, int device);
/// @brief Blocks of `fn` resident per SM with this block size and dynamic shared memory; the
/// first call for a kernel and device raises its dynamic shared-memory limit to the device's
/// maximum. Throws if smem exceeds that maximum.
int max_blocks_per_sm(const void* fn, int block, std::size_t smem, int device);

/// @brief One launch of kernel fn(a), with the programmatic-serialization attribute when `pdl`
/// (the kernel's griddepcontrol.wait then orders it after the previous kernel's memory
/// operations).
template <typename Args>
void launch_kernel(void (*fn)(Args), dim3 grid, int block, std::size_t smem, cudaStream_t stream,
                   const Args& a, bool pdl) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = dim3(block);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl ? 1 : 0;
  SWIFTQK_CUDA_TRY(cudaLaunchKernelEx(&cfg, fn, a));
}

}  // namespace swiftqk::detail
