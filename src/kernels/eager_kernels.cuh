// Small non-persistent kernels of the NCCL baselines: per-token partial sums of squares (the
// MiniMax-eager first kernel), applying a per-token scale (its second kernel, and the last step
// of the All-Gather baselines), and [N][T][w] -> [T][N*w] interleaving of all-gathered shards.
#pragma once

#include <cstdint>

#include "kernels/swiftqk_fused.cuh"
#include "protocol.hpp"

namespace swiftqk::detail {

/// Block-wide sum of (a, b); every thread gets the totals. Uses s[32] shared float2s.
__device__ inline float2 block_sum2(float a, float b, float2* s) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    a += __shfl_xor_sync(kFullMask, a, off);
    b += __shfl_xor_sync(kFullMask, b, off);
  }
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (lane == 0) s[warp] = make_float2(a, b);
  __syncthreads();
  float2 total = make_float2(0.f, 0.f);
  for (int w = 0; w < static_cast<int>(blockDim.x >> 5); ++w) {
    total.x += s[w].x;
    total.y += s[w].y;
  }
  __syncthreads();  // s is reused by the next call
  return total;
}

/// partial[t] = (sum of q row t squared, sum of k row t squared), scaled by in_scale^2. With
/// `check` (or nullptr), block 0 also writes the per-call check floats of `hash` there
/// (config_check_value; the NCCL fallback puts them after the T partials).
template <typename Tin, int VEC>
__global__ void __launch_bounds__(256)
    partial_sums_kernel(const RankArgs ra, int64_t T, int64_t q_width, int64_t k_width,
                        float2* partial, float* check, uint32_t hash) {
  __shared__ float2 s[32];
  if (check != nullptr && blockIdx.x == 0 && threadIdx.x < kConfigCheckFloats) {
    check[threadIdx.x] = config_check_value(hash, static_cast<int>(threadIdx.x));
  }
  const int64_t nq = q_width / VEC, n = nq + k_width / VEC;
  for (int64_t t = blockIdx.x; t < T; t += gridDim.x) {
    float sq = 0.f, sk = 0.f;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      accumulate<Tin, VEC>(load_vec(row_vec<Tin, VEC>(ra, t, i, nq)), i < nq, sq, sk);
    }
    const float2 tot = block_sum2(sq, sk, s);
    if (threadIdx.x == 0) {
      partial[t] =
          make_float2(tot.x * ra.q_in_scale * ra.q_in_scale, tot.y * ra.k_in_scale * ra.k_in_scale);
    }
  }
}

/// Writes rank-local outputs from per-token statistics: stat[t] is either the full (q, k) sums
/// of squares (stat_is_rstd false) or the 1/rms itself (true). Every output is NaN where
/// `abort_flag` (host-mapped, or nullptr) reads non-zero (the all-reduce that filled stat was
/// aborted), or where `check` (the all-reduced check floats, or nullptr) says the `world` ranks
/// did not all send `hash` (then block 0 also records code 7).
template <typename Tin, int VEC, bool kOlmo2>
__global__ void __launch_bounds__(256)
    apply_scale_kernel(const RankArgs ra, int64_t T, int64_t q_width, int64_t k_width,
                       const float2* stat, bool stat_is_rstd, float q_inv_full, float k_inv_full,
                       float eps, const int* abort_flag, const float* check, uint32_t hash,
                       int world) {
  using Tout = typename OutputOf<Tin>::type;
  __shared__ int aborted;
  if (threadIdx.x == 0) {
    aborted = abort_flag != nullptr ? *reinterpret_cast<const volatile int*>(abort_flag) : 0;
    if (!aborted && check != nullptr && !config_check_agrees(hash, world, check)) {
      aborted = 1;
      if (blockIdx.x == 0) record_local_failure(ra, kFailConfigMismatch, 0, 0, 0);
    }
  }
  __syncthreads();
  const int64_t nq = q_width / VEC, n = nq + k_width / VEC;
  const float nan = __int_as_float(0x7fc00000);
  for (int64_t t = blockIdx.x; t < T; t += gridDim.x) {
    const float2 st = aborted ? make_float2(nan, nan) : stat[t];
    // The fused kernel's scale (inv_rms), so both paths round it alike. A NaN statistic gives a
    // NaN scale, hence NaN outputs (fp8 inputs: bf16 NaN out).
    const float rq = aborted ? nan : (stat_is_rstd ? st.x : inv_rms(st.x, q_inv_full, eps));
    const float rk = aborted ? nan : (stat_is_rstd ? st.y : inv_rms(st.y, k_inv_full, eps));
    const float2 rs = make_float2(rq * ra.q_in_scale, rk * ra.k_in_scale);
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      write_output<Tin, Tout, VEC, kOlmo2>(ra, t, i, nq, load_vec(row_vec<Tin, VEC>(ra, t, i, nq)),
                                           load_vec(weight_vec<Tout, VEC>(ra, i, nq)), rs);
    }
    if (threadIdx.x == 0 && ra.rstd_out != nullptr) {
      ra.rstd_out[2 * t] = rq;
      ra.rstd_out[2 * t + 1] = rk;
    }
  }
}

/// The pairwise tree of the deterministic mode over v[0..n) (n a power of two up to 16): xor
/// butterfly levels at offsets 1, 2, 4, ..., each entry becoming v[j] + v[j ^ off], and v[0]
/// at the end: what the fused kernel's group_sum and rank butterfly compute (docs/design.md,
/// "Deterministic mode"; ref::canonical_sum_of_squares_ranks on the host).
__device__ __forceinline__ float canonical_tree(float* v, int n) {
  for (int off = 1; off < n; off <<= 1) {
    float next[kCanonicalSegments];
    for (int j = 0; j < n; ++j) next[j] = v[j] + v[j ^ off];
    for (int j = 0; j < n; ++j) v[j] = next[j];
  }
  return v[0];
}

/// The deterministic mode's partial of one rank: for each token, partial[t] = (Q, K) sums of the
/// rank's own `segments` canonical segments of each tensor, each segment reduced by a warp the
/// canonical way (lane j: 16-byte vectors j, j + 32, ..., each vector's fused multiply-add chain
/// added in order; the lanes meet in an xor butterfly at offsets 16 ... 1), times the input
/// scale twice (a leaf), the leaves in the pairwise tree. Blocks of 2 x segments warps: warp w
/// takes Q's segment w, then K's. The bits are those of the fused kernel's lower levels. With
/// `check`, block 0 also writes the per-call check floats of `hash` there.
template <typename Tin, int VEC>
__global__ void __launch_bounds__(1024)
    canonical_partials_kernel(const RankArgs ra, int64_t T, int64_t q_width, int64_t k_width,
                              int segments, float2* partial, float* check, uint32_t hash) {
  __shared__ float leaf[2][kCanonicalSegments];
  if (check != nullptr && blockIdx.x == 0 && threadIdx.x < kConfigCheckFloats) {
    check[threadIdx.x] = config_check_value(hash, static_cast<int>(threadIdx.x));
  }
  const int warp = static_cast<int>(threadIdx.x >> 5), lane = static_cast<int>(threadIdx.x & 31);
  const bool is_q = warp < segments;
  const int seg = is_q ? warp : warp - segments;
  const int64_t nq = q_width / VEC;
  const int64_t seg_vectors = (is_q ? q_width : k_width) / VEC / segments;
  const int64_t first = (is_q ? 0 : nq) + seg * seg_vectors;  // row_vec's index space
  const float scale = is_q ? ra.q_in_scale : ra.k_in_scale;
  for (int64_t t = blockIdx.x; t < T; t += gridDim.x) {
    float a = 0.f;
    for (int64_t v = lane; v < seg_vectors; v += 32) {
      a += vector_sum_sq<Tin, VEC>(load_vec(row_vec<Tin, VEC>(ra, t, first + v, nq)));
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) a = a + __shfl_xor_sync(kFullMask, a, off);
    if (lane == 0) leaf[is_q ? 0 : 1][seg] = a * scale * scale;
    __syncthreads();
    if (threadIdx.x == 0) {
      partial[t] =
          make_float2(canonical_tree(leaf[0], segments), canonical_tree(leaf[1], segments));
    }
    __syncthreads();  // leaf is refilled by the next token
  }
}

/// gathered[r][t][0..w) (ranks' contiguous shards, as ncclAllGather leaves them) ->
/// full[t][r*w .. (r+1)*w): the row layout a full-width norm reads. Moves 16-byte words when
/// w_bytes allows, else bytes.
template <typename Word>
__global__ void interleave_kernel(const uint8_t* gathered, uint8_t* full, int world, int64_t T,
                                  int64_t w_bytes) {
  const int64_t words = w_bytes / sizeof(Word);
  const int64_t total = static_cast<int64_t>(world) * T * words;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t j = i % words, rt = i / words, t = rt % T, r = rt / T;
    reinterpret_cast<Word*>(full + (t * world + r) * w_bytes)[j] =
        reinterpret_cast<const Word*>(gathered + (r * T + t) * w_bytes)[j];
  }
}

}  // namespace swiftqk::detail
