// The launch shape of a fused QK epilogue: its access width, block size, ring depth and chunks.
// Host-only and CPU-tested; the kernel's shared-memory layout is epilogue_layout.cuh's.
#pragma once

#include <cstdint>

#include "swiftqk/qk_epilogue_params.hpp"

namespace swiftqk {

/// Vectors a thread handles per token at most before the block grows (up to the largest block).
constexpr int kEpilogueUnitsPerThread = 4;
/// With peers, launches of at most kEpilogueFewTokensMax tokens take half as many a thread (twice
/// the threads a block): such a launch is one latency chain, which more threads a row shorten. On
/// one H100, virtual TP 2-8, four models at 1-64 tokens: 0.05-0.52 us faster at every point
/// (docs/performance.md, "Few tokens with peers: 2 vectors a thread").
constexpr int kEpilogueFewTokenUnitsPerThread = 2;
constexpr int64_t kEpilogueFewTokensMax = 64;
/// A short row (high TP) gets a block of one warp: its barriers are then the warp's own, and up to
/// 32 such blocks, each with its own tokens in flight, share an SM.
constexpr int kEpilogueMinThreads = 32;
constexpr int kEpilogueBlockCap = 512;  // epilogue_layout.cuh's kEpilogueMaxThreads
constexpr int kEpilogueStageCap = 6;    // epilogue_layout.cuh's kEpilogueMaxStages
/// Rows loading ahead of the one reduced: alone, two while a stage is small, else one; with
/// peers always one, since the wait for the partners' partials, not the loads, bounds a block
/// there. One H100, four models at virtual TP 2-8, against two rows ahead: 0.08-0.18 us faster
/// at one token and 0.14-0.44 us at 64, -7.9% to +2.0% at 4096 (docs/performance.md, "The ring
/// with peers: one row ahead").
constexpr std::size_t kEpilogueDeepStageBytes = 16 * 1024;
/// With peers, a token's collect lags its publish by ceil(log2(TP)) tokens, at most this many
/// (the plain kernel's deferral): a peer a few tokens behind then costs no wait.
constexpr int kEpilogueMaxDefer = 2;
/// With peers, a launch of at most kEpilogueFewTokensMax tokens defers at most this many: its
/// blocks hold a token or two each, so a deeper ring only adds stages to fill.
constexpr int kEpilogueFewTokensMaxDefer = 1;
/// Alone (TP 1, or headwise), a launch of few tokens leaves SMs idle while each busy one issues a
/// whole token's rotation: blocks then share a token, each writing a part of its heads and V, and
/// each staging and summing the whole Q and K rows. The policy splits tokens of at least
/// kEpilogueMinSplitPairs rotated pairs in two or four, while the blocks take at most a quarter
/// of the SMs. One H100, TP 1, against
/// the unsplit kernel at 1-16 tokens (docs/performance.md, "Few tokens alone: a token split
/// between blocks"): OLMo2-13B (640 pairs) and OLMo3-32B (384) gained 0.10-0.69 us, while
/// OLMoE (256) and MiniMax-M2 (224, and 448 unrotated vectors) lost up to 0.16 and 0.27 us at
/// 8-16 tokens, and a split past a quarter of the SMs cost more than it saved. A forced split
/// may take up to kEpilogueMaxSplit.
constexpr int kEpilogueMaxSplit = 8;
constexpr int kEpiloguePolicySplit = 4;
constexpr int kEpilogueSplitSmShare = 4;  // the policy's blocks stay within SMs / this
constexpr int64_t kEpilogueMinSplitPairs = 384;
/// The largest deferral a ring holds: a deferred token and the one loading ahead need a stage each
/// beside the one reduced.
constexpr int kEpilogueDeferCap = kEpilogueStageCap - 2;

/// @brief Elements per access: 16 bytes of the model dtype when every pointer, stride and width
/// the kernel touches with vectors allows it (and a rotation pairs whole vectors: NeoX needs
/// rotary_dim / 2, GPT-J rotary_dim, to be a multiple of it), else 1.
int epilogue_vector_elems(const QkEpilogueParams& p);

struct EpilogueShape {
  int vec = 1;                  ///< elements per access
  int threads = 0;              ///< per block (one token at a time)
  int stages = 2;               ///< ring depth: defer + 1 + the rows loading ahead
  int defer = 0;                ///< tokens a collect lags its publish (0 alone)
  int cs_copy_bytes = 2;        ///< unit in which a cos/sin row is staged: 16, 4 or 2
  bool weights_global = false;  ///< the norm weights are read from global memory, not staged
};

/// @brief The shape for p on a group of `world` ranks, with access width vec and a ring stage of
/// stage_bytes: the policy, with p.tuning's overrides (a forced ring shortens the policy's
/// deferral to fit, leaving at least one row loading ahead). Throws swiftqk::Error for a forced
/// deferral on a launch that exchanges nothing (TP 1, or headwise), which defers nothing.
EpilogueShape epilogue_shape(const QkEpilogueParams& p, int world, int vec,
                             std::size_t stage_bytes);

/// @brief Blocks that share each token of a launch that exchanges nothing, on the vector path
/// (vec > 1), outside the deterministic mode and writing neither Q nor K in place (a part would
/// overwrite a row the others still stage): p.tuning.split when forced, else 1 for a token
/// of fewer than kEpilogueMinSplitPairs rotated pairs (pairs: heads x the NeoX pair items a
/// head), else the largest power of two up to kEpiloguePolicySplit with tokens x ranks x split
/// at most sms / kEpilogueSplitSmShare (sms: the SMs the launch may use). 1 for the other
/// launches, where a forced split above 1 throws swiftqk::Error naming why.
int epilogue_token_split(const QkEpilogueParams& p, int world, int vec, int64_t tokens, int ranks,
                         int64_t pairs, int sms);

/// @brief The unit a cos/sin row is staged in: 16 or 4 bytes (cp.async) when the table's pointer
/// and row allow it, else 2 (plain copies). Each rank has its own table: a launch takes the least.
int epilogue_cos_sin_copy_bytes(const QkEpilogueParams& p);

/// @brief Work items per head of the kernel's rotation loop (qk_epilogue.cuh, phase C): NeoX
/// pairs of vectors (and the element path's GPT-J pairs of elements), then single vectors.
int epilogue_items_per_head(const QkEpilogueParams& p, int vec);
/// @brief The first of them: the rotated pairs (the rest are single vectors).
int epilogue_pair_items(const QkEpilogueParams& p, int vec);

/// @brief ceil(2^32 / d) for 2 <= d, 0 for d = 1: the kernel's n / d is then the high half of
/// n * magic, exact while n * d < 2^32 (the launch checks it).
uint32_t epilogue_div_magic(uint32_t d);

/// @brief Whether the launch exchanges partial sums (layerwise with more than one rank).
constexpr bool epilogue_exchanges(const QkEpilogueParams& p, int world) {
  return p.scope == NormScope::kLayerwise && world > 1;
}

/// @brief Whether the launch takes the deterministic mode's canonical sums (layerwise only; a
/// headwise norm is the same at every TP degree without them).
constexpr bool epilogue_canonical_sums(const QkEpilogueParams& p) {
  return p.deterministic && p.scope == NormScope::kLayerwise;
}

}  // namespace swiftqk
