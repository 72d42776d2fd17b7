// Device and kernel properties, asked of CUDA once per key and cached behind a mutex.
#include <map>
#include <mutex>
#include <string>
#include <tuple>

#include "cuda_check.hpp"
#include "device_query.hpp"
#include "swiftqk/error.hpp"

namespace swiftqk::detail {

// Asked once per attribute and device (launches are on the hot path).
int device_attribute(cudaDeviceAttr what, int device) {
  static std::mutex mu;
  static std::map<std::pair<int, int>, int> cache;
  std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_pair(static_cast<int>(what), device);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  int v = 0;
  SWIFTQK_CUDA_TRY(cudaDeviceGetAttribute(&v, what, device));
  cache[key] = v;
  return v;
}

int sm_count(int device) { return device_attribute(cudaDevAttrMultiProcessorCount, device); }

// A kernel's attributes on a device (the caller has made it current), asked once per kernel and
// device: static shared memory and the PTX version of the code the device runs.
cudaFuncAttributes func_attributes(const void* fn, int device) {
  static std::mutex mu;
  static std::map<std::pair<const void*, int>, cudaFuncAttributes> cache;
  std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_pair(fn, device);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  cudaFuncAttributes attr;
  SWIFTQK_CUDA_TRY(cudaFuncGetAttributes(&attr, fn));
  cache[key] = attr;
  return attr;
}

// Whether `fn` may be launched with programmatic dependent launch on `device`: the device must
// be sm_90 or later AND the code it runs must have been compiled for sm_90 or later, since only
// that code holds the kernel's griddepcontrol.wait. (A build for sm_80 alone runs on an H100 or
// H200 as PTX compiled at load time, __CUDA_ARCH__ 800, without the wait: launched with PDL it
// would read its inputs before the previous kernel had written them.)
bool can_launch_pdl(const void* fn, int device) {
  return device_attribute(cudaDevAttrComputeCapabilityMajor, device) >= 9 &&
         func_attributes(fn, device).ptxVersion >= 90;
}

// Occupancy, asked once per kernel, block size, shared memory and device. The first time a
// kernel is seen on a device its dynamic shared-memory limit is raised to the device's maximum,
// once, so every later launch of it (any row length) is allowed.
int max_blocks_per_sm(const void* fn, int block, std::size_t smem, int device) {
  static std::mutex mu;
  static std::map<std::tuple<const void*, int, std::size_t, int>, int> cache;
  static std::map<std::pair<const void*, int>, std::size_t> limit;
  std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_tuple(fn, block, smem, device);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  auto lim = limit.find({fn, device});
  if (lim == limit.end()) {
    const std::size_t dynamic_max =
        device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin, device) -
        func_attributes(fn, device).sharedSizeBytes;
    SWIFTQK_CUDA_TRY(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          static_cast<int>(dynamic_max)));
    lim = limit.emplace(std::make_pair(fn, device), dynamic_max).first;
  }
  SWIFTQK_EXPECTS(smem <= lim->second, "launch: a row needs " + std::to_string(smem) +
                                           " bytes of shared memory; the device allows " +
                                           std::to_string(lim->second));
  int n = 0;
  SWIFTQK_CUDA_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, fn, block, smem));
  cache[key] = n;
  return n;
}

}  // namespace swiftqk::detail
