// The by-value argument block of one fused QK epilogue launch, shared by host dispatch and the
// kernel.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/launch_args.hpp"

namespace swiftqk::detail {

/// One rank's share of an epilogue launch. `x` carries what the plain norm's ranks carry (the Q
/// and K rows and weights, q_out, the optional k_out, the exchange and failure state), so the
/// exchange and the failure path are the plain kernel's.
struct EpilogueRankArgs {
  RankArgs x;
  const void* v_in;
  int64_t v_stride;
  void* k_cache;
  void* v_cache;
  const float* q_scale;  // fp8 q_out: stored = value / *q_scale
  const float* k_scale;  // fp8 caches
  const float* v_scale;
  const int64_t* positions;  // [tokens] of this chunk
  const int64_t* slots;      // [tokens] of this chunk
  const void* cos_sin;       // [max_position, rotary_dim]
};

struct EpilogueArgs {
  EpilogueRankArgs r[kMaxRanksPerLaunch];
  int world;
  int blocks_per_rank;
  int stages;  // rows staged per block (2..kEpilogueMaxStages)
  int defer;   // with peers: tokens a collect lags its publish (stages - 2 at most)
  int q_heads, kv_heads, head_dim, rotary_dim;
  int neox;               // RopeStyle::kNeox
  int headwise;           // NormScope::kHeadwise
  int weight_plus_one;    // headwise: weight 1 + w
  int cs_f32;             // cos_sin_cache is fp32 (else the model dtype)
  int cs_copy_bytes;      // unit in which a cos/sin row is staged: 16, 4 or 2 (plain copies)
  uint32_t hd_magic;      // epilogue_div_magic(head_dim)
  uint32_t pair_magic;    // epilogue_div_magic(rotated pair items per head, at least 1)
  uint32_t single_magic;  // epilogue_div_magic(single-vector items per head, at least 1)
  int single_shift;       // (heads x pair items) mod block threads: where the singles' loop starts
  int split_log2;         // alone: log2 of the blocks sharing a token (epilogue_token_split)
  int det_segments;       // deterministic mode: this rank's segments of Q and of K each, 16 / world
  int det_q_vecs, det_k_vecs;  // 16-byte vectors a segment
  int64_t tokens;              // rows in this launch (one chunk)
  int64_t first_token;         // of the chunk in the call: errors name tokens of the call
  int64_t capacity;            // token slots per bank
  int64_t max_position;
  int64_t cache_slots;  // num_blocks * block_size
  int64_t block_size, block_stride, slot_stride, head_stride;
  float q_inv_full, k_inv_full;  // layerwise: 1 / full width
  float eps;
  uint32_t config_hash;
  uint64_t timeout_ns;
  int pdl;
};

}  // namespace swiftqk::detail
