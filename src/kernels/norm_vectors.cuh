// The element-wise QK-norm on vectors, shared by the fused kernel, the epilogue and the eager
// baselines: conversions to fp32, sums of squares, the scale, the normalised outputs in either
// norm order, and the addresses of a rank's Q and K row vectors.
#pragma once

#include <cstdint>

#include "kernels/device_types.cuh"
#include "kernels/launch_args.hpp"

namespace swiftqk::detail {

/// Element-wise output for either norm order; rs already folds in the input's dequant scale.
template <typename Tout, bool kOlmo2>
__device__ __forceinline__ Tout norm_element(float x, float w, float rs) {
  if constexpr (kOlmo2) {
    return from_float<Tout>(w * (x * rs));  // HF Olmo2: weight times fp32 product, one rounding
  } else {
    return from_float<Tout>(w * round_through<Tout>(x * rs));  // Llama: round, then weight
  }
}

template <typename Tin, int VEC>
__device__ __forceinline__ const Vec<Tin, VEC>* row_vec(const RankArgs& ra, int64_t t, int64_t i,
                                                        int64_t nq) {
  const Tin* p = i < nq ? static_cast<const Tin*>(ra.q_in) + t * ra.q_in_stride + i * VEC
                        : static_cast<const Tin*>(ra.k_in) + t * ra.k_in_stride + (i - nq) * VEC;
  return reinterpret_cast<const Vec<Tin, VEC>*>(p);
}

template <typename Tout, int VEC>
__device__ __forceinline__ const Vec<Tout, VEC>* weight_vec(const RankArgs& ra, int64_t i,
                                                            int64_t nq) {
  const Tout* p = i < nq ? static_cast<const Tout*>(ra.q_w) + i * VEC
                         : static_cast<const Tout*>(ra.k_w) + (i - nq) * VEC;
  return reinterpret_cast<const Vec<Tout, VEC>*>(p);
}

template <typename Tout, int VEC>
__device__ __forceinline__ Vec<Tout, VEC>* out_vec(const RankArgs& ra, int64_t t, int64_t i,
                                                   int64_t nq) {
  Tout* p = i < nq ? static_cast<Tout*>(ra.q_out) + t * ra.q_out_stride + i * VEC
                   : static_cast<Tout*>(ra.k_out) + t * ra.k_out_stride + (i - nq) * VEC;
  return reinterpret_cast<Vec<Tout, VEC>*>(p);
}

/// Element pairs of a 2-byte vector as floats (one packed unpack per pair); else element-wise.
template <typename T, int VEC>
__device__ __forceinline__ void vec_to_floats(const Vec<T, VEC>& x, float (&f)[VEC]) {
  if constexpr (sizeof(T) == 2 && VEC % 2 == 0) {
    using P = PairOf<T>;
    const auto* x2 = reinterpret_cast<const typename P::type*>(x.v);
#pragma unroll
    for (int e = 0; e < VEC / 2; ++e) {
      const float2 p = P::unpack(x2[e]);
      f[2 * e] = p.x;
      f[2 * e + 1] = p.y;
    }
  } else {
#pragma unroll
    for (int e = 0; e < VEC; ++e) f[e] = to_float(x.v[e]);
  }
}

/// A vector's sum of squares: one fused multiply-add chain over its elements in order, from 0.
template <typename Tin, int VEC>
__device__ __forceinline__ float vector_sum_sq(const Vec<Tin, VEC>& x) {
  float f[VEC];
  vec_to_floats(x, f);
  float s = 0.f;
#pragma unroll
  for (int e = 0; e < VEC; ++e) s = fmaf(f[e], f[e], s);
  return s;
}

template <typename Tin, int VEC>
__device__ __forceinline__ void accumulate(const Vec<Tin, VEC>& x, bool is_q, float& sq,
                                           float& sk) {
  const float s = vector_sum_sq<Tin, VEC>(x);
  if (is_q) {
    sq += s;
  } else {
    sk += s;
  }
}

/// The normalised output vector of input x and weights w for scale r. For 2-byte outputs the
/// roundings go two at a time (one packed conversion each), and the Llama order's weight product
/// is one packed multiply: the product of two 2-byte floats is exact in fp32, so rounding it once
/// gives what the packed multiply gives (outside fp32's subnormal range, which these products
/// do not reach in practice). Every value matches element-wise norm_element.
template <typename Tin, typename Tout, int VEC, bool kOlmo2>
__device__ __forceinline__ Vec<Tout, VEC> normalize_vec(const Vec<Tin, VEC>& x,
                                                        const Vec<Tout, VEC>& w, float r) {
  Vec<Tout, VEC> y;
  if constexpr (sizeof(Tout) == 2 && VEC % 2 == 0) {
    using P = PairOf<Tout>;
    using T2 = typename P::type;
    const T2* w2 = reinterpret_cast<const T2*>(w.v);
    T2* y2 = reinterpret_cast<T2*>(y.v);
    float xf[VEC];
    vec_to_floats(x, xf);
#pragma unroll
    for (int e = 0; e < VEC / 2; ++e) {
      const float a = xf[2 * e] * r;
      const float b = xf[2 * e + 1] * r;
      if constexpr (kOlmo2) {
        const float2 wf = P::unpack(w2[e]);
        y2[e] = P::pack(wf.x * a, wf.y * b);
      } else {  // Llama: the normalised value is rounded, then multiplied by the weight
        y2[e] = P::mul(P::pack(a, b), w2[e]);
      }
    }
  } else {
#pragma unroll
    for (int e = 0; e < VEC; ++e) {
      y.v[e] = norm_element<Tout, kOlmo2>(to_float(x.v[e]), to_float(w.v[e]), r);
    }
  }
  return y;
}

template <typename Tin, typename Tout, int VEC, bool kOlmo2>
__device__ __forceinline__ void write_output(const RankArgs& ra, int64_t t, int64_t i, int64_t nq,
                                             const Vec<Tin, VEC>& x, const Vec<Tout, VEC>& w,
                                             float2 rs) {
  store_vec(out_vec<Tout, VEC>(ra, t, i, nq),
            normalize_vec<Tin, Tout, VEC, kOlmo2>(x, w, i < nq ? rs.x : rs.y));
}

/// 1 / rms of a row from its full sum of squares (the same instruction on every rank, so every
/// rank's scale is bitwise the same).
__device__ __forceinline__ float inv_rms(float sum_sq, float inv_full, float eps) {
  return rsqrtf(sum_sq * inv_full + eps);
}

}  // namespace swiftqk::detail
