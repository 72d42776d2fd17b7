// The fused QK epilogue's per-vector math: the normalised inputs the rotation takes in either
// norm order, the staged cos/sin values, and the stores in the model dtype or quantised to fp8.
#pragma once

#include <cstdint>
#include <type_traits>

#include "kernels/device_types.cuh"
#include "kernels/e4m3_quotient.hpp"
#include "kernels/norm_vectors.cuh"

namespace swiftqk::detail {

/// n / d for n * d < 2^32 with magic = ceil(2^32 / d) (epilogue_div_magic; 0 for d = 1): one
/// multiply instead of a division in the loops over a token's items.
__device__ __forceinline__ int div_by(int n, uint32_t magic) {
  return magic == 0u ? n : static_cast<int>(__umulhi(static_cast<uint32_t>(n), magic));
}

/// An fp8 store's scale and its reciprocal (e4m3_reciprocal: 0 where the store divides).
struct E4m3Scale {
  float scale;
  float inv;
};

__device__ __forceinline__ E4m3Scale e4m3_scale(float scale) {
  return E4m3Scale{scale, e4m3_reciprocal(scale)};
}

/// fp8 e4m3 of a quotient, saturated to +-448; NaN stays NaN.
__device__ __forceinline__ __nv_fp8_e4m3 to_e4m3(float quotient) {
  __nv_fp8_e4m3 r;
  r.__x = __nv_cvt_float_to_fp8(quotient, __NV_SATFINITE, __NV_E4M3);
  return r;
}

/// Stores VEC floats as VEC elements of D (one access: 16 bytes of a 2-byte type, 8 of fp8):
/// rounded to the model dtype, or quantised to fp8 with the bits of the correctly rounded
/// value / scale (as vLLM's scaled conversion), the branch taken once a vector.
template <typename D, int VEC>
__device__ __forceinline__ void store_floats(D* dst, const float (&y)[VEC], E4m3Scale s) {
  Vec<D, VEC> o;
  if constexpr (std::is_same_v<D, __nv_fp8_e4m3>) {
    float q[VEC];
    if (s.inv != 0.f) {
#pragma unroll
      for (int e = 0; e < VEC; ++e) q[e] = e4m3_quotient(y[e], s.scale, s.inv);
    } else {
#pragma unroll
      for (int e = 0; e < VEC; ++e) q[e] = __fdiv_rn(y[e], s.scale);
    }
    if constexpr (VEC % 2 == 0) {
      // Two elements a conversion (the same rounding and saturation as one at a time; the first
      // element is the low byte).
#pragma unroll
      for (int e = 0; e < VEC; e += 2) {
        const __nv_fp8x2_storage_t p =
            __nv_cvt_float2_to_fp8x2(make_float2(q[e], q[e + 1]), __NV_SATFINITE, __NV_E4M3);
        o.v[e].__x = static_cast<__nv_fp8_storage_t>(p & 0xffu);
        o.v[e + 1].__x = static_cast<__nv_fp8_storage_t>(p >> 8);
      }
    } else {
#pragma unroll
      for (int e = 0; e < VEC; ++e) o.v[e] = to_e4m3(q[e]);
    }
  } else {
#pragma unroll
    for (int e = 0; e < VEC; ++e) o.v[e] = from_float<D>(y[e]);
  }
  store_vec(reinterpret_cast<Vec<D, VEC>*>(dst), o);
}

/// The normalised values of VEC elements x with weights w (rs: the row's or head's 1/rms), as
/// the rotation takes them: in the Olmo2 order the fp32 products x * w, to which rs is applied
/// after the rotation (rope is linear); in the Llama order round(round(x * rs) * w).
template <typename T, int VEC, bool kOlmo2>
__device__ __forceinline__ void normalized(const T* x, const T* w, float rs, int plus_one,
                                           float (&u)[VEC]);

/// cos and sin for VEC consecutive elements of a rotary pair set, from the staged row cs: NeoX
/// (and the element path's GPT-J pairs) indices i .. i + VEC - 1, or with `pairs` the GPT-J
/// vector's VEC / 2 pairs, indices i .. i + VEC / 2 - 1, each twice.
template <typename T, int VEC>
__device__ __forceinline__ void cos_sin(const uint8_t* cs, int f32, int i, int half,
                                        float (&c)[VEC], float (&s)[VEC], bool pairs = false);

template <typename T, int VEC>
__device__ __forceinline__ void load_floats(const T* p, float (&f)[VEC]) {
  vec_to_floats(load_vec(reinterpret_cast<const Vec<T, VEC>*>(p)), f);
}

template <typename T, int VEC, bool kOlmo2>
__device__ __forceinline__ void normalized(const T* x, const T* w, float rs, int plus_one,
                                           float (&u)[VEC]) {
  float xf[VEC];
  load_floats<T, VEC>(x, xf);
  if constexpr (!kOlmo2 && VEC % 2 == 0) {
    if (!plus_one) {
      // The weight product in pairs: the product of two 2-byte floats is exact in fp32, so one
      // packed multiply rounds it as the element-wise round(round(x * rs) * w) does
      // (normalize_vec's argument).
      using P = PairOf<T>;
      const Vec<T, VEC> wv = load_vec(reinterpret_cast<const Vec<T, VEC>*>(w));
      const auto* w2 = reinterpret_cast<const typename P::type*>(wv.v);
#pragma unroll
      for (int e = 0; e < VEC / 2; ++e) {
        const float2 y = P::unpack(P::mul(P::pack(xf[2 * e] * rs, xf[2 * e + 1] * rs), w2[e]));
        u[2 * e] = y.x;
        u[2 * e + 1] = y.y;
      }
      return;
    }
  }
  float wf[VEC];
  load_floats<T, VEC>(w, wf);
#pragma unroll
  for (int e = 0; e < VEC; ++e) {
    const float we = plus_one ? wf[e] + 1.f : wf[e];
    if constexpr (kOlmo2) {
      u[e] = xf[e] * we;
    } else {
      u[e] = round_through<T>(round_through<T>(xf[e] * rs) * we);
    }
  }
}

template <typename T, int VEC>
__device__ __forceinline__ void cos_sin(const uint8_t* cs, int f32, int i, int half,
                                        float (&c)[VEC], float (&s)[VEC], bool pairs) {
  if (pairs) {
    if constexpr (VEC > 1) {
      float ch[VEC / 2], sh[VEC / 2];
      if (f32) {
        load_floats<float, VEC / 2>(reinterpret_cast<const float*>(cs) + i, ch);
        load_floats<float, VEC / 2>(reinterpret_cast<const float*>(cs) + half + i, sh);
      } else {
        load_floats<T, VEC / 2>(reinterpret_cast<const T*>(cs) + i, ch);
        load_floats<T, VEC / 2>(reinterpret_cast<const T*>(cs) + half + i, sh);
      }
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        c[e] = ch[e >> 1];
        s[e] = sh[e >> 1];
      }
    }
    return;
  }
  if (f32) {
    load_floats<float, VEC>(reinterpret_cast<const float*>(cs) + i, c);
    load_floats<float, VEC>(reinterpret_cast<const float*>(cs) + half + i, s);
  } else {
    load_floats<T, VEC>(reinterpret_cast<const T*>(cs) + i, c);
    load_floats<T, VEC>(reinterpret_cast<const T*>(cs) + half + i, s);
  }
}

}  // namespace swiftqk::detail
