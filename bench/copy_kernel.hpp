#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>

namespace swiftqk::bench {
/// Copies bytes (a multiple of 16, 16-byte aligned) from src to dst on the device's SMs.
void launch_copy(const void* src, void* dst, std::size_t bytes, cudaStream_t stream);
}  // namespace swiftqk::bench
