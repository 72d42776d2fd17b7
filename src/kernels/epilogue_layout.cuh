// The fused QK epilogue's shared memory as host and kernel agree on it: the ring of staged
// tokens, the weights and the per-head sums, and the kernel's block and ring limits.
#pragma once

#include <cstddef>
#include <cstdint>

namespace swiftqk::detail {

constexpr int kEpilogueMaxThreads = 512;
/// Two blocks of the largest size per SM: caps the registers at 64 a thread (at 83-106 uncapped,
/// a 256-thread block left room for two per SM, a quarter of the SM's warps).
constexpr int kEpilogueMinBlocks = 2;
constexpr int kEpilogueMaxStages = 6;

/// What the host and the kernel agree on about one stage of the ring: the Q|K|V row, the cos/sin
/// row and the token's position and slot, each part 16-byte aligned.
struct EpilogueStageLayout {
  std::size_t row_bytes;  // (q + 2 kv heads) x head_dim elements of the model dtype, padded
  std::size_t cs_bytes;   // rotary_dim elements of the cos/sin cache's dtype, padded
  __host__ __device__ constexpr std::size_t meta_offset() const { return row_bytes + cs_bytes; }
  /// The meta: position, slot (copied), the slot's element offset in the cache (computed once per
  /// token; -1 if nothing is written), padding.
  __host__ __device__ constexpr std::size_t bytes() const { return row_bytes + cs_bytes + 32; }
};
__host__ __device__ constexpr std::size_t pad16(std::size_t b) { return (b + 15) / 16 * 16; }
__host__ __device__ constexpr EpilogueStageLayout epilogue_stage_layout(int64_t row_elems,
                                                                        std::size_t elem_bytes,
                                                                        int64_t rotary_dim,
                                                                        std::size_t cs_elem_bytes) {
  return {pad16(static_cast<std::size_t>(row_elems) * elem_bytes),
          pad16(static_cast<std::size_t>(rotary_dim) * cs_elem_bytes)};
}
/// Dynamic shared memory of a launch: the stages, then the weights (layerwise: the rank's Q and
/// K slices; headwise: head_dim of each), then one float per Q and K head (headwise sums).
constexpr std::size_t epilogue_smem_bytes(const EpilogueStageLayout& l, int stages,
                                          int64_t weight_elems, std::size_t elem_bytes,
                                          int64_t heads) {
  return static_cast<std::size_t>(stages) * l.bytes() +
         pad16(static_cast<std::size_t>(weight_elems) * elem_bytes) +
         static_cast<std::size_t>(heads) * sizeof(float);
}

}  // namespace swiftqk::detail
