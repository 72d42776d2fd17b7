// The unfused epilogue chain the fused kernel is measured against: after the QK-norm
// (launch_qk_norm), a RoPE kernel in place on Q and K, then a KV-cache write kernel, each in one
// launch for all virtual ranks of a GPU and with 16-byte accesses (vLLM's rotary_embedding and
// reshape_and_cache_flash, written for this comparison).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "swiftqk/types.hpp"

namespace swiftqk::bench {

/// One rank's views for the RoPE kernel: Q and K rows (in place), the rank's positions and the
/// fp32 [max_position, rotary_dim] cos/sin table.
struct RopeRank {
  void* q;
  void* k;
  int64_t q_stride, k_stride;
  const int64_t* positions;
  const float* cos_sin;
};

struct RopeShape {
  int64_t tokens;
  int q_heads, kv_heads, head_dim, rotary_dim;
  bool neox;
  DType dtype;  // bf16 or f16
};

/// Rotates every Q and K head of every rank in place (at most 16 ranks). rotary_dim / 2 (NeoX) or
/// rotary_dim (GPT-J) must be a multiple of 8, the rows 16-byte aligned.
void launch_rope(const std::vector<RopeRank>& ranks, const RopeShape& s, cudaStream_t stream);

/// One rank's views for the cache write: K and V rows, the caches, the slots, the fp8 scales.
struct CacheRank {
  const void* k;
  const void* v;
  int64_t k_stride, v_stride;
  void* k_cache;
  void* v_cache;
  const int64_t* slots;
  const float* k_scale;
  const float* v_scale;
};

struct CacheShape {
  int64_t tokens;
  int kv_heads, head_dim;
  int64_t block_size, block_stride, slot_stride, head_stride;
  DType dtype;        // of K and V
  DType cache_dtype;  // the model dtype or fp8
};

/// Writes every rank's K and V rows to their slots (slot -1: skipped; the slots are trusted).
void launch_cache_write(const std::vector<CacheRank>& ranks, const CacheShape& s,
                        cudaStream_t stream);

}  // namespace swiftqk::bench
