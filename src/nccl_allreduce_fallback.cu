// The NCCL all-reduce path of a group without P2P (nccl_allreduce_fallback.hpp), and the two
// eager kernels it launches.
#include <nccl.h>

#include <algorithm>

#include "comm_state.hpp"
#include "cuda_check.hpp"
#include "kernels/eager_kernels.cuh"
#include "nccl_allreduce_fallback.hpp"

namespace swiftqk::detail {

namespace {

constexpr int kEagerBlockThreads = 256;  // the eager kernels' __launch_bounds__

// One block a row, for at most this many rows at once (the kernels stride over the rest).
int eager_grid(int64_t tokens) { return static_cast<int>(std::min<int64_t>(tokens, 4096)); }

// Calls f with a value of the input element type.
template <typename F>
void with_type(DType t, F f) {
  switch (t) {
    case DType::kF32:
      return f(float{});
    case DType::kF16:
      return f(__half{});
    case DType::kBF16:
      return f(__nv_bfloat16{});
    case DType::kF8E4M3:
      return f(__nv_fp8_e4m3{});
  }
}

}  // namespace

void launch_partial_sums(DType in, const RankArgs& ra, int64_t tokens, int64_t q_width,
                         int64_t k_width, bool vec, float2* sums, cudaStream_t s) {
  const int grid = eager_grid(tokens);
  with_type(in, [&](auto tag) {
    using Tin = decltype(tag);
    constexpr int kVec = 16 / sizeof(Tin);
    if (vec) {
      partial_sums_kernel<Tin, kVec>
          <<<grid, kEagerBlockThreads, 0, s>>>(ra, tokens, q_width, k_width, sums);
    } else {
      partial_sums_kernel<Tin, 1>
          <<<grid, kEagerBlockThreads, 0, s>>>(ra, tokens, q_width, k_width, sums);
    }
  });
  SWIFTQK_CUDA_TRY(cudaGetLastError());
}

void launch_apply_scale(DType in, const RankArgs& ra, int64_t tokens, int64_t q_width,
                        int64_t k_width, bool vec, NormOrder order, const float2* stat,
                        bool is_rstd, float q_inv_full, float k_inv_full, float eps,
                        cudaStream_t s) {
  const int grid = eager_grid(tokens);
  const bool olmo2 = order == NormOrder::kOlmo2;
  with_type(in, [&](auto tag) {
    using Tin = decltype(tag);
    constexpr int kVec = 16 / sizeof(Tin);
    if (vec && olmo2) {
      apply_scale_kernel<Tin, kVec, true><<<grid, kEagerBlockThreads, 0, s>>>(
          ra, tokens, q_width, k_width, stat, is_rstd, q_inv_full, k_inv_full, eps);
    } else if (vec) {
      apply_scale_kernel<Tin, kVec, false><<<grid, kEagerBlockThreads, 0, s>>>(
          ra, tokens, q_width, k_width, stat, is_rstd, q_inv_full, k_inv_full, eps);
    } else if (olmo2) {
      apply_scale_kernel<Tin, 1, true><<<grid, kEagerBlockThreads, 0, s>>>(
          ra, tokens, q_width, k_width, stat, is_rstd, q_inv_full, k_inv_full, eps);
    } else {
      apply_scale_kernel<Tin, 1, false><<<grid, kEagerBlockThreads, 0, s>>>(
          ra, tokens, q_width, k_width, stat, is_rstd, q_inv_full, k_inv_full, eps);
    }
  });
  SWIFTQK_CUDA_TRY(cudaGetLastError());
}

void launch_nccl_allreduce_fallback(Communicator& comm, const QkNormParams& p,
                                    cudaStream_t stream) {
  CommState& st = comm.state();
  SWIFTQK_EXPECTS(st.world == 1 || st.nccl != nullptr,
                  "the NCCL all-reduce path needs a communicator made by Communicator::from_nccl "
                  "(one GPU per rank); this group of " +
                      std::to_string(st.world) + " has no NCCL");
  DeviceGuard guard(st.device);
  const int64_t cap = st.config.token_capacity;
  st.allreduce_scratch.reserve(std::min(cap, p.tokens) * sizeof(float2), stream,
                               "the NCCL all-reduce path (" + to_string(p.method) + ")");
  float2* sums = static_cast<float2*>(st.allreduce_scratch.data());
  const bool vec = vector_bytes_for(p) == 16;
  const float q_inv_full = 1.f / static_cast<float>(p.q_full_width);
  const float k_inv_full = 1.f / static_cast<float>(p.k_full_width);
  for (int64_t first = 0; first < p.tokens; first += cap) {
    const int64_t tokens = std::min(cap, p.tokens - first);
    const RankArgs ra = rank_args_for(st, p, first);
    launch_partial_sums(p.in_dtype, ra, tokens, p.q.width, p.k.width, vec, sums, stream);
    if (st.world > 1) {
      SWIFTQK_NCCL_TRY(ncclAllReduce(sums, sums, 2 * tokens, ncclFloat, ncclSum, st.nccl, stream));
    }
    launch_apply_scale(p.in_dtype, ra, tokens, p.q.width, p.k.width, vec, p.order, sums, false,
                       q_inv_full, k_inv_full, p.eps, stream);
  }
  comm.check_error();
}

}  // namespace swiftqk::detail
