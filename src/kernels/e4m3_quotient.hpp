// value / scale for an fp8-e4m3 store without a division per element: the same e4m3 bits as the
// correctly rounded quotient (vLLM's scaled conversion divides), from the scale's reciprocal,
// taken once, and two fused multiply-adds. Plain C++ as well as CUDA, so the CPU tests check the
// code the kernels run.
#pragma once

#include <cfloat>
#include <cmath>

#if defined(__CUDACC__)
#define SWIFTQK_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define SWIFTQK_HOST_DEVICE inline
#endif

namespace swiftqk::detail {

/// Scales in this range take e4m3_quotient; the others (zero, negative, subnormal, huge,
/// infinite, NaN) divide. Inside it the reciprocal is a normal float and the remainder below
/// cannot underflow for a quotient at or above kE4m3QuotientFloor.
constexpr float kE4m3FastScaleMin = 0x1p-64f;
constexpr float kE4m3FastScaleMax = 0x1p64f;
/// Below this magnitude a quotient is returned unrefined: e4m3's smallest subnormal is 2^-9, so
/// anything under 2^-10 (and so the quotient's neighbours) stores as a zero of the same sign.
constexpr float kE4m3QuotientFloor = 0x1p-20f;

/// The correctly rounded 1 / scale where e4m3_quotient applies, else 0 (divide instead).
SWIFTQK_HOST_DEVICE float e4m3_reciprocal(float scale) {
  if (!(scale >= kE4m3FastScaleMin && scale <= kE4m3FastScaleMax)) return 0.f;
#if defined(__CUDA_ARCH__)
  return __frcp_rn(scale);
#else
  return 1.f / scale;
#endif
}

SWIFTQK_HOST_DEVICE float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);  // never contracted into an FMA
#else
  return a * b;
#endif
}

SWIFTQK_HOST_DEVICE float fma_rn(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}

/// value / scale rounded to nearest where e4m3 can tell (inv = e4m3_reciprocal(scale), not 0).
/// q = value * inv is within one ulp of the quotient, the remainder value - q * scale is exact in
/// one FMA, and q + remainder * inv rounds to the correctly rounded quotient (Markstein's
/// theorem, for a reciprocal correctly rounded). Outside [kE4m3QuotientFloor, FLT_MAX] q itself
/// is kept: a tiny q stores as the zero the quotient stores as, an infinite one saturates as the
/// quotient does, and NaN stays NaN (the refinement would turn an infinite q into NaN).
SWIFTQK_HOST_DEVICE float e4m3_quotient(float value, float scale, float inv) {
  const float q = mul_rn(value, inv);
  const float a = std::fabs(q);
  if (!(a >= kE4m3QuotientFloor && a <= FLT_MAX)) return q;
  const float r = fma_rn(-q, scale, value);
  return fma_rn(r, inv, q);
}

}  // namespace swiftqk::detail
