// The exchange of a group without P2P: each rank's fp32 partial sums of squares, one
// ncclAllReduce, and the scale applied by a second kernel (kMiniMaxEager's scheme). In the
// deterministic mode the partials follow the canonical order and are all-gathered, then summed
// in the fused kernel's rank tree, so the outputs are the fused path's bits. Launches of
// the fused methods take it when from_nccl found no working P2P; the MiniMax-eager baseline runs
// it as its method.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/launch_args.hpp"
#include "swiftqk/communicator.hpp"

namespace swiftqk::detail {

/// @brief Normalises one rank's rows of p through the NCCL all-reduce, in chunks of the
/// communicator's token capacity; its scratch ([capacity] fp32 pairs) grows outside capture
/// only. p is validated and the caller holds the launch lock.
void launch_nccl_allreduce_fallback(Communicator& comm, const QkNormParams& p, cudaStream_t stream);

/// @brief Writes each of `tokens` rows' (q, k) fp32 sums of squares of one rank's shards into
/// sums[tokens]; `vec`: 16-byte accesses (vector_bytes_for). With `check`, also the per-call
/// check floats of `hash` there (config_check_value).
void launch_partial_sums(DType in, const RankArgs& ra, int64_t tokens, int64_t q_width,
                         int64_t k_width, bool vec, float2* sums, cudaStream_t s,
                         float* check = nullptr, uint32_t hash = 0);

/// @brief The deterministic mode's per-rank partials: partial[t] = this rank's (Q, K) subtrees
/// of the canonical order over its `segments` (16 / world) segments of each tensor, the bits of
/// the fused kernel's lower levels (docs/design.md, "Deterministic mode"). Rows of 16-byte
/// vectors. With `check`, also the per-call check floats of `hash` there.
void launch_canonical_partials(DType in, const RankArgs& ra, int64_t tokens, int64_t q_width,
                               int64_t k_width, int segments, float2* partial, cudaStream_t s,
                               float* check = nullptr, uint32_t hash = 0);

/// @brief The canonical order's rank level: sums[t] = the pairwise tree, in rank order, of
/// gathered[r * stride + t] over the `world` ranks (ncclAllGather's layout, `stride` float2s a
/// rank). With `check`, the ranks' check floats (after each rank's `tokens` partials) summed.
void launch_canonical_ranks(const float2* gathered, int world, int64_t tokens, int64_t stride,
                            float2* sums, float* check, cudaStream_t s);

/// @brief Scales the rows and writes the outputs: with `is_rstd`, stat holds each row's (q, k)
/// 1/rms; else the full rows' sums of squares, turned into 1/rms with q_inv_full, k_inv_full
/// (1 / full width) and eps, with the fused kernel's rsqrtf. `abort_flag` (or nullptr): a
/// host-mapped word; where it reads non-zero the kernel writes NaN instead (the all-reduce
/// before it was aborted, so stat holds no sums). `check` (or nullptr): the all-reduced check
/// floats; unless they say all `world` ranks sent `hash`, the outputs are NaN and code 7 is
/// recorded.
void launch_apply_scale(DType in, const RankArgs& ra, int64_t tokens, int64_t q_width,
                        int64_t k_width, bool vec, NormOrder order, const float2* stat,
                        bool is_rstd, float q_inv_full, float k_inv_full, float eps, cudaStream_t s,
                        const int* abort_flag = nullptr, const float* check = nullptr,
                        uint32_t hash = 0, int world = 1);

}  // namespace swiftqk::detail
