// The NCCL all-reduce path of a group without P2P (nccl_allreduce_fallback.hpp), and the two
// eager kernels it launches.
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>

#include "comm_state.hpp"
#include "cuda_check.hpp"
#include "kernels/eager_kernels.cuh"
#include "nccl_allreduce_fallback.hpp"
#include "nccl_exchange.hpp"
#include "protocol.hpp"

namespace swiftqk::detail {

namespace {

constexpr int kEagerBlockThreads = 256;  // the eager kernels' __launch_bounds__
// The check floats' sums stay exact integers in fp32 (below 2^24) for the largest group.
static_assert(kMaxWorld * 256 * 256 < (1 << 24), "config check sums must stay exact in fp32");

/// The deterministic mode's rank level: sums[t] = the pairwise tree over the `world` ranks'
/// partials gathered[r * stride + t] (ncclAllGather's layout), in rank order: the fused
/// exchange's butterfly, in which lane r holds rank r's partial. With `check`, the ranks' check
/// floats (after each rank's T partials) are summed there, as an all-reduce would leave them.
__global__ void canonical_ranks_kernel(const float2* gathered, int world, int64_t T, int64_t stride,
                                       float2* sums, float* check) {
  const int64_t first = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (check != nullptr && first < kConfigCheckFloats) {
    float s = 0.f;  // integers below 2^24: exact in any order
    for (int r = 0; r < world; ++r) {
      s += reinterpret_cast<const float*>(gathered + static_cast<int64_t>(r) * stride + T)[first];
    }
    check[first] = s;
  }
  for (int64_t t = first; t < T; t += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float q[kCanonicalSegments], k[kCanonicalSegments];
    for (int r = 0; r < world; ++r) {
      const float2 p = gathered[static_cast<int64_t>(r) * stride + t];
      q[r] = p.x;
      k[r] = p.y;
    }
    sums[t] = make_float2(canonical_tree(q, world), canonical_tree(k, world));
  }
}

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
                         int64_t k_width, bool vec, float2* sums, cudaStream_t s, float* check,
                         uint32_t hash) {
  const int grid = eager_grid(tokens);
  with_type(in, [&](auto tag) {
    using Tin = decltype(tag);
    constexpr int kVec = 16 / sizeof(Tin);
    if (vec) {
      partial_sums_kernel<Tin, kVec>
          <<<grid, kEagerBlockThreads, 0, s>>>(ra, tokens, q_width, k_width, sums, check, hash);
    } else {
      partial_sums_kernel<Tin, 1>
          <<<grid, kEagerBlockThreads, 0, s>>>(ra, tokens, q_width, k_width, sums, check, hash);
    }
  });
  SWIFTQK_CUDA_TRY(cudaGetLastError());
}

void launch_canonical_partials(DType in, const RankArgs& ra, int64_t tokens, int64_t q_width,
                               int64_t k_width, int segments, float2* partial, cudaStream_t s,
                               float* check, uint32_t hash) {
  SWIFTQK_EXPECTS(
      segments >= 1 && segments <= kCanonicalSegments && (segments & (segments - 1)) == 0,
      "launch_canonical_partials: segments must be a power of two up to " +
          std::to_string(kCanonicalSegments));
  const int grid = eager_grid(tokens);
  with_type(in, [&](auto tag) {
    using Tin = decltype(tag);
    canonical_partials_kernel<Tin, 16 / sizeof(Tin)><<<grid, 64 * segments, 0, s>>>(
        ra, tokens, q_width, k_width, segments, partial, check, hash);
  });
  SWIFTQK_CUDA_TRY(cudaGetLastError());
}

void launch_canonical_ranks(const float2* gathered, int world, int64_t tokens, int64_t stride,
                            float2* sums, float* check, cudaStream_t s) {
  SWIFTQK_EXPECTS(world >= 1 && world <= kCanonicalSegments && (world & (world - 1)) == 0,
                  "launch_canonical_ranks: world must be a power of two up to " +
                      std::to_string(kCanonicalSegments));
  SWIFTQK_EXPECTS(stride >= tokens, "launch_canonical_ranks: stride must be at least tokens");
  const int grid = static_cast<int>(std::min<int64_t>(1024, (tokens + 255) / 256));
  canonical_ranks_kernel<<<std::max(grid, 1), 256, 0, s>>>(gathered, world, tokens, stride, sums,
                                                           check);
  SWIFTQK_CUDA_TRY(cudaGetLastError());
}

void launch_apply_scale(DType in, const RankArgs& ra, int64_t tokens, int64_t q_width,
                        int64_t k_width, bool vec, NormOrder order, const float2* stat,
                        bool is_rstd, float q_inv_full, float k_inv_full, float eps, cudaStream_t s,
                        const int* abort_flag, const float* check, uint32_t hash, int world) {
  const int grid = eager_grid(tokens);
  const bool olmo2 = order == NormOrder::kOlmo2;
  with_type(in, [&](auto tag) {
    using Tin = decltype(tag);
    constexpr int kVec = 16 / sizeof(Tin);
    if (vec && olmo2) {
      apply_scale_kernel<Tin, kVec, true><<<grid, kEagerBlockThreads, 0, s>>>(
          ra, tokens, q_width, k_width, stat, is_rstd, q_inv_full, k_inv_full, eps, abort_flag,
          check, hash, world);
    } else if (vec) {
      apply_scale_kernel<Tin, kVec, false><<<grid, kEagerBlockThreads, 0, s>>>(
          ra, tokens, q_width, k_width, stat, is_rstd, q_inv_full, k_inv_full, eps, abort_flag,
          check, hash, world);
    } else if (olmo2) {
      apply_scale_kernel<Tin, 1, true><<<grid, kEagerBlockThreads, 0, s>>>(
          ra, tokens, q_width, k_width, stat, is_rstd, q_inv_full, k_inv_full, eps, abort_flag,
          check, hash, world);
    } else {
      apply_scale_kernel<Tin, 1, false><<<grid, kEagerBlockThreads, 0, s>>>(
          ra, tokens, q_width, k_width, stat, is_rstd, q_inv_full, k_inv_full, eps, abort_flag,
          check, hash, world);
    }
  });
  SWIFTQK_CUDA_TRY(cudaGetLastError());
}

namespace {

// One chunk's exchange of the partial sums: an all-reduce into `recv` (sums of every rank's
// send), or with `gather` an all-gather ([world][tokens] float2, the deterministic mode's). On
// the fallback's own communicator (a group
// without P2P) the enqueue is bounded by timeout_s, and an eager all-reduce is watched: past
// timeout_s the watchdog records the failure, flags the scale kernel (NaN) and aborts the
// communicator, which ends the all-reduce's kernel. A captured all-reduce has no host step at
// replay, so nothing watches it (docs/design.md, "Failure semantics"). The MiniMax-eager
// baseline runs on the caller's communicator, unwatched.
void exchange_sums(CommState& st, const float2* send, float2* recv, bool gather, int64_t floats,
                   int64_t first_token, bool capturing, cudaStream_t stream) {
  auto collective = [&](ncclComm_t c) {
    return gather ? ncclAllGather(send, recv, floats, ncclFloat, c, stream)
                  : ncclAllReduce(send, recv, floats, ncclFloat, ncclSum, c, stream);
  };
  if (st.h_nccl_abort == nullptr) {  // the caller's communicator (MiniMax eager)
    SWIFTQK_NCCL_TRY(collective(st.nccl));
    return;
  }
  const double timeout_s = st.config.timeout_s;
  const auto timeout = std::chrono::duration_cast<std::chrono::nanoseconds>(
      std::chrono::duration<double>(timeout_s));
  // The bound counts from when the stream reaches the all-reduce (`begin`), so work queued ahead
  // of it on the stream does not count against timeout_s. Both events come from the
  // communicator's pool and go back to it, not created and destroyed a chunk; the watchdog's
  // callbacks keep a copy of give_back, and the pool outlives them (CommState::release stops the
  // watchdog first).
  cudaEvent_t begin = nullptr, end = nullptr;
  HandlePool<cudaEvent_t>* const pool = &st.nccl_events;
  auto give_back = [pool](cudaEvent_t b, cudaEvent_t e) {
    pool->give_back(b);
    pool->give_back(e);
  };
  if (!capturing) {
    begin = pool->take();
    try {
      end = pool->take();
      SWIFTQK_CUDA_TRY(cudaEventRecord(begin, stream));
    } catch (...) {
      pool->give_back(begin);
      if (end != nullptr) pool->give_back(end);
      throw;
    }
  }
  bool enqueued = false;
  {
    std::lock_guard<std::mutex> lock(st.nccl_mu);
    // No exchange communicator: aborted during this call (an earlier chunk's wait, or the
    // watchdog), which has recorded code 6, or never split (a reset() whose split threw). Either
    // way the failure is recorded (the first one stays) and the abort flag set, so the scale
    // kernel writes NaN over this chunk, not a sum of this rank's partials alone or stale
    // gathered ones, and the call throws at its end.
    if (st.nccl_exchange == nullptr) {
      record_nccl_failure(st, kFailNcclNoExchange, first_token);
    } else {
      const ncclResult_t r = collective(st.nccl_exchange);
      if (r != ncclSuccess && r != ncclInProgress) {
        if (begin != nullptr) give_back(begin, end);
        SWIFTQK_FAIL(std::string("launch: ") + (gather ? "ncclAllGather" : "ncclAllReduce") +
                     " failed: " + ncclGetErrorString(r));
      }
      try {
        wait_nccl(st.nccl_exchange, std::chrono::steady_clock::now() + timeout, timeout_s,
                  "launch: rank " + std::to_string(st.rank) + ": the NCCL " +
                      (gather ? "all-gather" : "all-reduce") + " of tokens from " +
                      std::to_string(first_token));
        enqueued = true;
      } catch (const Error&) {
        // The enqueue itself never finished (a peer never connected): wait_nccl aborted the
        // communicator. Recorded as the watchdog records it, so the outputs below are NaN.
        record_nccl_timeout(st, first_token);
      }
    }
  }
  if (begin == nullptr) return;
  if (!enqueued) {
    give_back(begin, end);
    return;
  }
  try {
    SWIFTQK_CUDA_TRY(cudaEventRecord(end, stream));
  } catch (...) {
    give_back(begin, end);
    throw;
  }
  CommState* s = &st;
  st.watchdog->watch(
      [begin, end, give_back] {
        if (cudaEventQuery(end) == cudaErrorNotReady) return false;
        give_back(begin, end);
        return true;
      },
      timeout,
      [s, begin, end, first_token, give_back] {
        abort_nccl_exchange(*s, first_token);
        // Taken again, the events are recorded anew: what the stream still owes the old
        // records no longer matters.
        give_back(begin, end);
      },
      [begin] { return cudaEventQuery(begin) != cudaErrorNotReady; });
}

}  // namespace

void launch_nccl_allreduce_fallback(Communicator& comm, const QkNormParams& p,
                                    cudaStream_t stream) {
  CommState& st = comm.state();
  SWIFTQK_EXPECTS(st.world == 1 || st.nccl != nullptr,
                  "the NCCL all-reduce path needs a communicator made by Communicator::from_nccl "
                  "(one GPU per rank); this group of " +
                      std::to_string(st.world) + " has no NCCL");
  DeviceGuard guard(st.device);
  const bool capturing = stream_capturing(stream);
  const int vector_bytes = vector_bytes_for(p);
  const bool vec = vector_bytes == 16;
  // The deterministic mode's canonical order is defined on 16-byte vectors (as in the fused
  // kernel); validate_params has checked the widths and the TP degree.
  SWIFTQK_EXPECTS(!p.deterministic || vec,
                  "launch: deterministic mode needs rows of 16-byte vectors (16-byte aligned "
                  "pointers and strides in whole vectors); these rows allow " +
                      std::to_string(vector_bytes) + "-byte accesses");
  const int64_t cap = st.config.token_capacity;
  // The fallback's own communicator (a group without P2P) checks every call: the check floats
  // ride after the partial sums in the same all-reduce, or all-gather (config_check_value).
  const bool checked = st.h_nccl_abort != nullptr;
  static_assert(kConfigCheckFloats % 2 == 0, "the check floats fill whole float2s");
  const int64_t check_pairs = checked ? kConfigCheckFloats / 2 : 0;
  const int64_t chunk = std::min(cap, p.tokens);
  // Default: sums (chunk + check_pairs). Deterministic also this rank's partials and the
  // gathered partials of every rank, each chunk + check_pairs.
  const int64_t per = chunk + check_pairs;
  const int64_t slots = p.deterministic ? per * (2 + st.world) : per;
  st.allreduce_scratch.reserve(slots * sizeof(float2), stream,
                               "the NCCL all-reduce path (" + to_string(p.method) + ")");
  float2* sums = static_cast<float2*>(st.allreduce_scratch.data());
  float2* partial = sums + per;
  float2* gathered = partial + per;
  const float q_inv_full = 1.f / static_cast<float>(p.q_full_width);
  const float k_inv_full = 1.f / static_cast<float>(p.k_full_width);
  for (int64_t first = 0; first < p.tokens; first += cap) {
    const int64_t tokens = std::min(cap, p.tokens - first);
    const RankArgs ra = rank_args_for(st, p, first);
    // What every rank must give alike for this chunk: full widths, world, eps, order, token
    // count (config_hash, as the fused path's tags carry it), the input dtype and the mode.
    const uint32_t hash = (config_hash(p.q_full_width, p.k_full_width, st.world, p.eps,
                                       static_cast<int>(p.order), tokens) ^
                           (static_cast<uint32_t>(p.in_dtype) * 0x9e3779b9u)) ^
                          (p.deterministic ? kDeterministicHashSalt : 0u);
    float* check = checked ? reinterpret_cast<float*>(sums + tokens) : nullptr;
    const int64_t floats = 2 * (tokens + check_pairs);
    if (p.deterministic) {
      float2* mine = st.world > 1 ? partial : sums;
      launch_canonical_partials(p.in_dtype, ra, tokens, p.q.width, p.k.width,
                                kCanonicalSegments / st.world, mine, stream,
                                checked ? reinterpret_cast<float*>(mine + tokens) : nullptr, hash);
      if (st.world > 1) {
        exchange_sums(st, partial, gathered, true, floats, first, capturing, stream);
        launch_canonical_ranks(gathered, st.world, tokens, tokens + check_pairs, sums, check,
                               stream);
      }
    } else {
      launch_partial_sums(p.in_dtype, ra, tokens, p.q.width, p.k.width, vec, sums, stream, check,
                          hash);
      if (st.world > 1) exchange_sums(st, sums, sums, false, floats, first, capturing, stream);
    }
    launch_apply_scale(p.in_dtype, ra, tokens, p.q.width, p.k.width, vec, p.order, sums, false,
                       q_inv_full, k_inv_full, p.eps, stream, st.d_nccl_abort, check, hash,
                       st.world);
  }
  comm.check_error();
}

}  // namespace swiftqk::detail
