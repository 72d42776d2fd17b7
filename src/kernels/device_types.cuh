// Element conversions and aligned vectors for the kernels.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

namespace swiftqk::detail {

/// Every lane of a warp, for its shuffles.
constexpr unsigned kFullMask = 0xffffffffu;

/// VEC elements moved as one access; aligned to the access width (at most 16 bytes).
template <typename T, int VEC>
struct alignas(sizeof(T) * VEC >= 16 ? 16 : sizeof(T) * VEC) Vec {
  T v[VEC];
};

/// Raw word types of 1..32 bytes: Vec loads and stores go through them, because a plain copy of a
/// struct of __nv_bfloat16 is split into 2-byte accesses.
template <int kBytes>
using Word = std::conditional_t<
    kBytes == 1, uint8_t,
    std::conditional_t<
        kBytes == 2, uint16_t,
        std::conditional_t<kBytes == 4, uint32_t, std::conditional_t<kBytes == 8, uint2, uint4>>>>;

/// One access per 16 bytes (two for a 32-byte vector), whatever the element type.
template <typename T, int VEC>
__device__ __forceinline__ Vec<T, VEC> load_vec(const Vec<T, VEC>* p) {
  constexpr int kBytes = sizeof(Vec<T, VEC>);
  constexpr int kWord = kBytes > 16 ? 16 : kBytes;
  using W = Word<kWord>;
  Vec<T, VEC> r;
  const W* src = reinterpret_cast<const W*>(p);
  W* dst = reinterpret_cast<W*>(&r);
#pragma unroll
  for (int i = 0; i < kBytes / kWord; ++i) dst[i] = src[i];
  return r;
}

template <typename T, int VEC>
__device__ __forceinline__ void store_vec(Vec<T, VEC>* p, const Vec<T, VEC>& v) {
  constexpr int kBytes = sizeof(Vec<T, VEC>);
  constexpr int kWord = kBytes > 16 ? 16 : kBytes;
  using W = Word<kWord>;
  const W* src = reinterpret_cast<const W*>(&v);
  W* dst = reinterpret_cast<W*>(p);
#pragma unroll
  for (int i = 0; i < kBytes / kWord; ++i) dst[i] = src[i];
}

/// One vector from src to dst, word by word with no local copy between: a store of a local Vec
/// (store_vec) of a value just loaded was split into 4-byte stores (the epilogue's V copy).
template <typename T, int VEC>
__device__ __forceinline__ void copy_vec(Vec<T, VEC>* dst, const Vec<T, VEC>* src) {
  constexpr int kBytes = sizeof(Vec<T, VEC>);
  constexpr int kWord = kBytes > 16 ? 16 : kBytes;
  using W = Word<kWord>;
#pragma unroll
  for (int i = 0; i < kBytes / kWord; ++i) {
    reinterpret_cast<W*>(dst)[i] = reinterpret_cast<const W*>(src)[i];
  }
}

template <typename T>
struct OutputOf {
  using type = T;
};
template <>
struct OutputOf<__nv_fp8_e4m3> {
  using type = __nv_bfloat16;
};

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_float(__nv_fp8_e4m3 x) { return static_cast<float>(x); }

template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __half from_float<__half>(float x) {
  return __float2half_rn(x);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

/// The packed pair type of a 2-byte float type (one conversion instruction rounds two floats).
template <typename T>
struct PairOf;
template <>
struct PairOf<__nv_bfloat16> {
  using type = __nv_bfloat162;
  static __device__ __forceinline__ type pack(float a, float b) {
    return __floats2bfloat162_rn(a, b);
  }
  // bf16 is the top half of a float: one shift and one mask (the compiler's conversion spends
  // a byte permute and a multiply on the upper element).
  static __device__ __forceinline__ float2 unpack(type p) {
    uint32_t u;
    memcpy(&u, &p, sizeof(u));
    return make_float2(__uint_as_float(u << 16), __uint_as_float(u & 0xffff0000u));
  }
  // Correctly rounded packed product (mul.rn.bf16x2 on sm_90, an fma with -0 before).
  static __device__ __forceinline__ type mul(type a, type b) { return __hmul2_rn(a, b); }
};
template <>
struct PairOf<__half> {
  using type = __half2;
  static __device__ __forceinline__ type pack(float a, float b) { return __floats2half2_rn(a, b); }
  static __device__ __forceinline__ float2 unpack(type p) { return __half22float2(p); }
  static __device__ __forceinline__ type mul(type a, type b) { return __hmul2_rn(a, b); }
};

/// x rounded to T and back: the intermediate rounding of the Llama order.
template <typename T>
__device__ __forceinline__ float round_through(float x) {
  return to_float(from_float<T>(x));
}

}  // namespace swiftqk::detail
