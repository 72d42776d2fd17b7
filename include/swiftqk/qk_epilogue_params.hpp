// What one rank passes to a fused QK epilogue launch: QK-norm, then RoPE, then the write of K and
// V into a paged KV cache (with FP8 quantisation where the cache or the attention is FP8).
#pragma once

#include <cstdint>

#include "swiftqk/types.hpp"

namespace swiftqk {

/// @brief Which elements of a head a rotation pairs.
enum class RopeStyle : int {
  kNeox = 0,  ///< (i, i + rotary_dim / 2) for i < rotary_dim / 2 (HF rotate_half, vLLM is_neox)
  kGptj = 1,  ///< (2i, 2i + 1) for i < rotary_dim / 2 (interleaved)
};

/// @brief Over what the RMS of the norm is taken.
enum class NormScope : int {
  /// One RMS over the whole projected Q (all heads of all ranks), one over the whole K
  /// (OLMo 2/3, OLMoE, MiniMax-M2): under TP the ranks exchange partial sums of squares.
  kLayerwise = 0,
  /// One RMS per head over head_dim (Qwen3, Gemma-3): nothing is exchanged.
  kHeadwise = 1,
};

/// @brief The rotary embedding: y[i] = x[i] cos - x[j] sin, y[j] = x[j] cos + x[i] sin for each
/// pair (i, j) of the style, with cos and sin of the token's position; elements at and past
/// rotary_dim pass through unrotated.
struct RopeParams {
  const int64_t* positions = nullptr;   ///< device [tokens]; each in [0, max_position)
  const void* cos_sin_cache = nullptr;  ///< device [max_position, rotary_dim]: cos half, sin half
  DType cache_dtype = DType::kF32;      ///< kF32 or the model dtype
  int64_t max_position = 0;             ///< rows of cos_sin_cache
  int64_t rotary_dim = 0;               ///< even, 2 <= rotary_dim <= head_dim
  RopeStyle style = RopeStyle::kNeox;
};

/// @brief A paged KV cache, K and V with the same geometry, described by strides so that the
/// FlashAttention layout (NHD: [num_blocks, block_size, heads, head_dim]) and the HND layout
/// ([num_blocks, heads, block_size, head_dim]) both fit. Element d of local KV head h of slot s
/// (block s / block_size, offset s % block_size) lives at
/// (s / block_size) * block_stride + (s % block_size) * slot_stride + h * head_stride + d.
struct PagedKvCache {
  void* k = nullptr;
  void* v = nullptr;
  DType dtype = DType::kBF16;  ///< the model dtype, or kF8E4M3 (quantised with k_scale, v_scale)
  int64_t num_blocks = 0;
  int64_t block_size = 0;
  int64_t block_stride = 0;  ///< elements between consecutive blocks
  int64_t slot_stride = 0;   ///< elements between consecutive slots of a block
  int64_t head_stride = 0;   ///< elements between consecutive heads of a slot
  /// fp8 caches only: device scalars, stored = value / scale (vLLM's convention), saturated to
  /// +-448. Pointers, so that a captured CUDA graph stays valid when the scales change.
  const float* k_scale = nullptr;
  const float* v_scale = nullptr;
  /// device [tokens]: the slot of each token's K and V; -1 writes nothing (padding tokens); any
  /// other value must be in [0, num_blocks * block_size).
  const int64_t* slot_mapping = nullptr;
};

/// @brief Overrides of the epilogue's tuned launch shape (epilogue_shape in src/epilogue_plan.hpp),
/// for tuning runs and for engines that have measured their own shapes. The defaults leave every
/// choice to the policy. It changes how the work is spread, not what is computed: the ring's depth,
/// the deferral and the split leave every output bit as it is; another block size sums a row's
/// squares in another order, within the same tolerance.
struct EpilogueTuning {
  /// Threads a block: a multiple of 32 in [32, 512]; 0 = tuned (the row's vectors, 4 a thread).
  int block_threads = 0;
  /// Tokens staged per block (the ring): 2..6; 0 = tuned.
  int stages = 0;
  /// With peers, tokens a block writes behind the one it reduces (the exchange's lag): 0..4 and
  /// at most stages - 2; -1 = tuned. A launch that exchanges nothing defers nothing: it takes
  /// 0 or -1 only.
  int defer = -1;
  /// Blocks that share one token, each writing its own part of the token's heads and V (every
  /// one sums the whole row's squares, in the same order): 1, 2, 4 or 8; 0 = tuned (more than one
  /// only while the launch leaves SMs idle). A launch that exchanges, takes the element path,
  /// runs the deterministic mode or writes Q or K in place takes 0 or 1 only.
  int split = 0;
  /// Where the kernel reads the norm weights: 1 staged in shared memory once per block, 2 from
  /// global memory through L1 (each block prefetches its rank's weights into L1 at entry), which
  /// leaves the block's shared memory to the ring; 0 = the policy, which stages them (2 was 4-9%
  /// faster for some shapes with peers from 64 tokens and slower for others, and slower at one
  /// token: docs/performance.md). Only a launch that exchanges partial sums outside the
  /// deterministic mode takes 2.
  int weights = 0;

  /// @brief Throws swiftqk::Error naming the first field no launch can take, and its value.
  void validate() const;

  bool operator==(const EpilogueTuning& o) const {
    return block_threads == o.block_threads && stages == o.stages && defer == o.defer &&
           split == o.split && weights == o.weights;
  }
  bool operator!=(const EpilogueTuning& o) const { return !(*this == o); }
};

/// @brief Everything one rank's epilogue launch needs besides the communicator and the stream.
/// Shards are head-aligned: this rank holds num_q_heads whole Q heads and num_kv_heads whole K
/// and V heads, as strided views (each row of `width` contiguous elements), for example column
/// slices of the fused QKV projection. Per token, in order:
///   1. the QK-norm of the rows (layerwise: the full row's RMS, the ranks' partial sums
///      exchanged as for launch_qk_norm; headwise: each head's RMS), with the weight,
///   2. RoPE on every Q and K head,
///   3. Q written to q_out (model dtype, or fp8 with q_out_scale), K (optionally also to k_out)
///      and V written to the token's cache slot, quantised when the cache is fp8.
/// Rounding points (docs/design.md, "The fused QK epilogue"): in the Olmo2 order the rotation
/// takes the fp32 products x * w and the 1/rms scale is applied last, rounded once; in the Llama
/// order the normalised value is rounded to the model dtype, times the weight, rounded (as
/// launch_qk_norm does), then rotated in fp32 and rounded. The rotation is always in fp32.
struct QkEpilogueParams {
  const void* q = nullptr;  ///< [tokens, num_q_heads * head_dim], row stride q_stride
  const void* k = nullptr;  ///< [tokens, num_kv_heads * head_dim], row stride k_stride
  const void* v = nullptr;  ///< [tokens, num_kv_heads * head_dim], row stride v_stride
  int64_t q_stride = 0;     ///< elements between consecutive rows
  int64_t k_stride = 0;
  int64_t v_stride = 0;
  /// [tokens, num_q_heads * head_dim]; may be q itself (in place) when q_out_dtype == dtype.
  void* q_out = nullptr;
  int64_t q_out_stride = 0;
  DType q_out_dtype = DType::kBF16;    ///< the model dtype, or kF8E4M3 (stored = value / scale)
  const float* q_out_scale = nullptr;  ///< device scalar; fp8 q_out only
  /// Optional [tokens, num_kv_heads * head_dim] in the model dtype: the normalised, rotated K
  /// (for attention backends that read this step's K from a tensor); may be k itself.
  void* k_out = nullptr;
  int64_t k_out_stride = 0;
  /// Layerwise: the local slices [num_q_heads * head_dim] and [num_kv_heads * head_dim];
  /// headwise: [head_dim] each. In the model dtype.
  const void* q_weight = nullptr;
  const void* k_weight = nullptr;
  /// Headwise only: the weight is 1 + w (Gemma-3's RMSNorm), computed in fp32.
  bool weight_plus_one = false;
  DType dtype = DType::kBF16;  ///< bf16 or f16: q, k, v, the weights, k_out, non-fp8 q_out
  int64_t tokens = 0;          ///< rows T; 0 is a valid no-op
  int64_t num_q_heads = 0;     ///< this rank's Q heads
  int64_t num_kv_heads = 0;    ///< this rank's K (and V) heads
  int64_t head_dim = 0;
  NormScope scope = NormScope::kLayerwise;
  NormOrder order = NormOrder::kOlmo2;
  float eps = 1e-6f;  ///< added to mean(x^2) over the full row (layerwise) or the head
  RopeParams rope;
  PagedKvCache cache;
  /// Programmatic dependent launch, as QkNormParams::pdl. All ranks must agree on it.
  bool pdl = false;
  /// The launch shape, where the caller overrides the policy. All ranks must give the same.
  EpilogueTuning tuning;
  /// The TP-invariant mode (as QkNormParams::deterministic): a layerwise norm sums each row's
  /// squares in the canonical order (docs/design.md, "Deterministic mode"), so the outputs are
  /// the same bits at every TP degree in {1, 2, 4, 8, 16} and for every token count and launch
  /// shape. It needs a power-of-two TP degree up to 16 and full Q and K widths that are multiples
  /// of 16 segments of 16-byte vectors (128 elements); all ranks must agree on it. A headwise
  /// norm's sums never depend on the split, so there it changes nothing.
  bool deterministic = false;
};

/// @brief Throws swiftqk::Error naming the first problem with p for a group of world_size ranks
/// (1 to 32): null or misaligned pointers, shapes, strides, dtypes, head alignment, rotary_dim,
/// the cache geometry (no two (block, slot, head, element) share an address), the fp8 scales,
/// eps, and overlaps between what is written (q_out, k_out, the extents of the two caches) and
/// what is read or written elsewhere; K and V may interleave in one buffer (FlashInfer's [blocks,
/// 2, block_size, heads, head_dim]) when no element of one is an element of the other. Values
/// only the device sees (positions, slots) are checked
/// by the kernel, which records a bad one as a failure and writes nothing of that token (its Q
/// output row is NaN): the host raises it, naming the token and the value.
void validate_epilogue_params(const QkEpilogueParams& p, int world_size);

}  // namespace swiftqk
