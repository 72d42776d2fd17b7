// Device and kernel properties a launch asks for, each asked of CUDA once and cached (launches
// are on the hot path): attributes, residency, whether PDL may be used.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

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

}  // namespace swiftqk::detail
