// The unfused chain's RoPE and cache-write kernels (unfused_epilogue.hpp): one thread per eight
// elements (a NeoX pair of vectors, or a GPT-J vector of four pairs), grid.y the rank.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "cuda_check.hpp"
#include "kernels/e4m3_quotient.hpp"
#include "swiftqk/error.hpp"
#include "unfused_epilogue.hpp"

namespace swiftqk::bench {

namespace {

constexpr int kMaxRanks = 16;
constexpr int kThreads = 256;

template <typename T>
struct alignas(16) Vec8 {
  T v[8];
};

__device__ __forceinline__ float f(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float f(__half x) { return __half2float(x); }
template <typename T>
__device__ __forceinline__ T to(float x);
template <>
__device__ __forceinline__ __nv_bfloat16 to<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}
template <>
__device__ __forceinline__ __half to<__half>(float x) {
  return __float2half_rn(x);
}

struct RopeArgs {
  RopeRank r[kMaxRanks];
  RopeShape s;
};

template <typename T>
__global__ void rope_kernel(const __grid_constant__ RopeArgs a) {
  const RopeRank& r = a.r[blockIdx.y];
  const RopeShape& s = a.s;
  const int half = s.rotary_dim / 2;
  const int chunks = (s.neox ? half : s.rotary_dim) / 8;  // per head
  const int heads = s.q_heads + s.kv_heads;
  const int64_t items = s.tokens * heads * chunks;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < items;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = i / (heads * chunks);
    const int rem = static_cast<int>(i - t * heads * chunks);
    const int h = rem / chunks, c = rem - h * chunks;
    T* head = h < s.q_heads ? static_cast<T*>(r.q) + t * r.q_stride + h * s.head_dim
                            : static_cast<T*>(r.k) + t * r.k_stride + (h - s.q_heads) * s.head_dim;
    const float* cs = r.cos_sin + r.positions[t] * s.rotary_dim;
    if (s.neox) {
      auto* lo = reinterpret_cast<Vec8<T>*>(head + 8 * c);
      auto* hi = reinterpret_cast<Vec8<T>*>(head + half + 8 * c);
      Vec8<T> a0 = *lo, b0 = *hi, a1, b1;
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const float co = cs[8 * c + e], si = cs[half + 8 * c + e];
        const float x = f(a0.v[e]), y = f(b0.v[e]);
        a1.v[e] = to<T>(x * co - y * si);
        b1.v[e] = to<T>(y * co + x * si);
      }
      *lo = a1;
      *hi = b1;
    } else {
      auto* p = reinterpret_cast<Vec8<T>*>(head + 8 * c);
      Vec8<T> x = *p, y;
#pragma unroll
      for (int e = 0; e < 8; e += 2) {
        const int j = 4 * c + e / 2;
        const float co = cs[j], si = cs[half + j];
        const float u = f(x.v[e]), w = f(x.v[e + 1]);
        y.v[e] = to<T>(u * co - w * si);
        y.v[e + 1] = to<T>(w * co + u * si);
      }
      *p = y;
    }
  }
}

struct CacheArgs {
  CacheRank r[kMaxRanks];
  CacheShape s;
};

// The fp8 store takes the fused kernel's quotient (the correctly rounded value / scale's e4m3
// bits from the reciprocal, e4m3_quotient.hpp; inv 0: divide), so the two quantise alike.
template <typename T, typename C>
__device__ __forceinline__ void store8(C* dst, const Vec8<T>& x, float scale, float inv) {
  if constexpr (std::is_same_v<C, __nv_fp8_e4m3>) {
    struct alignas(8) {
      __nv_fp8_e4m3 v[8];
    } o;
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const float q =
          inv != 0.f ? detail::e4m3_quotient(f(x.v[e]), scale, inv) : __fdiv_rn(f(x.v[e]), scale);
      o.v[e].__x = __nv_cvt_float_to_fp8(q, __NV_SATFINITE, __NV_E4M3);
    }
    *reinterpret_cast<decltype(o)*>(dst) = o;
  } else {
    *reinterpret_cast<Vec8<T>*>(dst) = x;
  }
}

template <typename T, typename C>
__global__ void cache_write_kernel(const __grid_constant__ CacheArgs a) {
  const CacheRank& r = a.r[blockIdx.y];
  const CacheShape& s = a.s;
  const int chunks = s.head_dim / 8;
  const int64_t items = s.tokens * s.kv_heads * chunks;
  const bool fp8 = std::is_same_v<C, __nv_fp8_e4m3>;
  const float ks = fp8 ? *r.k_scale : 1.f, vs = fp8 ? *r.v_scale : 1.f;
  const float k_inv = detail::e4m3_reciprocal(ks), v_inv = detail::e4m3_reciprocal(vs);
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < items;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = i / (s.kv_heads * chunks);
    const int rem = static_cast<int>(i - t * s.kv_heads * chunks);
    const int h = rem / chunks, c = rem - h * chunks;
    const int64_t slot = r.slots[t];
    if (slot < 0) continue;
    const int64_t b = slot / s.block_size, o = slot - b * s.block_size;
    const int64_t off = b * s.block_stride + o * s.slot_stride + h * s.head_stride + 8 * c;
    const int64_t in = h * s.head_dim + 8 * c;
    store8<T, C>(
        static_cast<C*>(r.k_cache) + off,
        *reinterpret_cast<const Vec8<T>*>(static_cast<const T*>(r.k) + t * r.k_stride + in), ks,
        k_inv);
    store8<T, C>(
        static_cast<C*>(r.v_cache) + off,
        *reinterpret_cast<const Vec8<T>*>(static_cast<const T*>(r.v) + t * r.v_stride + in), vs,
        v_inv);
  }
}

int grid_x(int64_t items) {
  int dev = 0, sms = 0;
  SWIFTQK_CUDA_TRY(cudaGetDevice(&dev));
  SWIFTQK_CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  const int64_t want = (items + kThreads - 1) / kThreads;
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(want, 8 * sms)));
}

}  // namespace

void launch_rope(const std::vector<RopeRank>& ranks, const RopeShape& s, cudaStream_t stream) {
  SWIFTQK_EXPECTS(!ranks.empty() && ranks.size() <= kMaxRanks, "launch_rope: 1 to 16 ranks");
  SWIFTQK_EXPECTS((s.neox ? s.rotary_dim / 2 : s.rotary_dim) % 8 == 0,
                  "launch_rope: the rotation must pair whole 8-element vectors");
  if (s.tokens == 0) return;
  RopeArgs a{};
  for (std::size_t i = 0; i < ranks.size(); ++i) a.r[i] = ranks[i];
  a.s = s;
  const int64_t items =
      s.tokens * (s.q_heads + s.kv_heads) * ((s.neox ? s.rotary_dim / 2 : s.rotary_dim) / 8);
  const dim3 grid(grid_x(items), static_cast<unsigned>(ranks.size()));
  if (s.dtype == DType::kBF16) {
    rope_kernel<__nv_bfloat16><<<grid, kThreads, 0, stream>>>(a);
  } else {
    SWIFTQK_EXPECTS(s.dtype == DType::kF16, "launch_rope: bf16 or f16");
    rope_kernel<__half><<<grid, kThreads, 0, stream>>>(a);
  }
  SWIFTQK_CUDA_TRY(cudaGetLastError());
}

void launch_cache_write(const std::vector<CacheRank>& ranks, const CacheShape& s,
                        cudaStream_t stream) {
  SWIFTQK_EXPECTS(!ranks.empty() && ranks.size() <= kMaxRanks, "launch_cache_write: 1 to 16 ranks");
  SWIFTQK_EXPECTS(s.head_dim % 8 == 0, "launch_cache_write: head_dim must be a multiple of 8");
  if (s.tokens == 0) return;
  CacheArgs a{};
  for (std::size_t i = 0; i < ranks.size(); ++i) a.r[i] = ranks[i];
  a.s = s;
  const dim3 grid(grid_x(s.tokens * s.kv_heads * (s.head_dim / 8)),
                  static_cast<unsigned>(ranks.size()));
  const bool fp8 = s.cache_dtype == DType::kF8E4M3;
  if (s.dtype == DType::kBF16) {
    if (fp8) {
      cache_write_kernel<__nv_bfloat16, __nv_fp8_e4m3><<<grid, kThreads, 0, stream>>>(a);
    } else {
      cache_write_kernel<__nv_bfloat16, __nv_bfloat16><<<grid, kThreads, 0, stream>>>(a);
    }
  } else {
    SWIFTQK_EXPECTS(s.dtype == DType::kF16, "launch_cache_write: bf16 or f16");
    if (fp8) {
      cache_write_kernel<__half, __nv_fp8_e4m3><<<grid, kThreads, 0, stream>>>(a);
    } else {
      cache_write_kernel<__half, __half><<<grid, kThreads, 0, stream>>>(a);
    }
  }
  SWIFTQK_CUDA_TRY(cudaGetLastError());
}

}  // namespace swiftqk::bench
