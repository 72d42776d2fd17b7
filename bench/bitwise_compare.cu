// The comparison kernel of the soak (bitwise_compare.hpp): outputs against their expected bytes,
// element by element, then refilled with 0xFF.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>

#include "bitwise_compare.hpp"
#include "cuda_check.hpp"
#include "swiftqk/error.hpp"

namespace swiftqk::bench {

namespace {

constexpr int kThreads = 256;

// The elements of `elem_bytes` bytes in a 32-bit word that are not zero: x is the xor of a word
// of the output with the same word of the expected bytes, so these are the elements that differ.
__device__ __forceinline__ unsigned differing(uint32_t x, int elem_bytes) {
  if (elem_bytes == 4) return x != 0u;
  if (elem_bytes == 2) return ((x & 0xffffu) != 0u) + ((x >> 16) != 0u);
  return ((x & 0xffu) != 0u) + ((x & 0xff00u) != 0u) + ((x & 0xff0000u) != 0u) +
         ((x & 0xff000000u) != 0u);
}

// Block row y of the grid takes region y; its blocks stride over the region's 16-byte words (when
// its rows start 16-byte aligned: then every word holds whole elements, since the element size
// divides 16), then over the elements after each row's last whole word.
__global__ void compare_and_poison_kernel(const CompareRegion* __restrict__ regions, int count,
                                          CompareCounts* counts) {
  unsigned long long wrong = 0;
  if (static_cast<int>(blockIdx.y) < count) {
    const CompareRegion r = regions[blockIdx.y];
    const int eb = r.elem_bytes;
    const int64_t first = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
    const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
    const bool aligned = reinterpret_cast<uintptr_t>(r.out) % 16 == 0 && r.stride_bytes % 16 == 0;
    const int64_t words = aligned ? r.row_bytes / 16 : 0;
    for (int64_t u = first; u < r.rows * words; u += step) {
      const int64_t row = u / words, w = u - row * words;
      uint4* o = reinterpret_cast<uint4*>(r.out + row * r.stride_bytes) + w;
      const uint4 e = reinterpret_cast<const uint4*>(r.expected + row * r.expected_pitch)[w];
      const uint4 g = *o;
      wrong += differing(g.x ^ e.x, eb) + differing(g.y ^ e.y, eb) + differing(g.z ^ e.z, eb) +
               differing(g.w ^ e.w, eb);
      *o = make_uint4(~0u, ~0u, ~0u, ~0u);
    }
    const int64_t done = words * 16, loose = (r.row_bytes - done) / eb;
    for (int64_t u = first; u < r.rows * loose; u += step) {
      const int64_t row = u / loose, j = u - row * loose;
      uint8_t* o = r.out + row * r.stride_bytes + done + j * eb;
      const uint8_t* e = r.expected + row * r.expected_pitch + done + j * eb;
      bool differs = false;
      for (int b = 0; b < eb; ++b) {
        differs |= o[b] != e[b];
        o[b] = 0xff;
      }
      wrong += differs ? 1 : 0;
    }
  }
  // Every thread of the block gets here: the warp's sum, then one atomic a warp that found any.
  for (int off = 16; off > 0; off >>= 1) wrong += __shfl_down_sync(0xffffffffu, wrong, off);
  if (threadIdx.x % 32 == 0 && wrong != 0) atomicAdd(&counts->mismatches, wrong);
  if (blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0) atomicAdd(&counts->compares, 1ull);
}

}  // namespace

void launch_compare_and_poison(const CompareRegion* regions, int count, int64_t max_region_bytes,
                               CompareCounts* counts, cudaStream_t stream) {
  SWIFTQK_EXPECTS(count >= 0 && count <= 65535 && (count == 0 || regions != nullptr),
                  "launch_compare_and_poison: 0 to 65535 regions in a device table");
  SWIFTQK_EXPECTS(counts != nullptr, "launch_compare_and_poison: no counters");
  // About four words a thread in the largest region; smaller regions leave some blocks idle.
  const int64_t per_block = 16 * kThreads * 4;
  const int64_t blocks =
      std::clamp<int64_t>((max_region_bytes + per_block - 1) / per_block, 1, 1024);
  const dim3 grid(static_cast<unsigned>(blocks), static_cast<unsigned>(std::max(count, 1)));
  compare_and_poison_kernel<<<grid, kThreads, 0, stream>>>(regions, count, counts);
  SWIFTQK_CUDA_TRY(cudaGetLastError());
}

}  // namespace swiftqk::bench
