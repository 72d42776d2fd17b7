// Device side of the partial-sum exchange: system-scope slot accesses, the bounded wait's clock,
// and failure recording. Slot layout and the reuse proof are in docs/design.md.
#pragma once

#include <cstdint>

#include "kernels/launch_args.hpp"

namespace swiftqk::detail {

/// L2 policy of every slot access: evict last. Each call streams all its rows through L2, so
/// without the hint a slot line is likely gone by the time it is written or polled again. What
/// was measured on one H200 (docs/logs/2026-11-30_h200_session9.md): a build that only publishes
/// (no collect) wrote 22 MB more to DRAM than one without any exchange, for 4 MB of 16-byte
/// partials (virtual TP 8, OLMoE, 4096 tokens), which fits partial-sector writes of evicted
/// lines. With the hint, graph-replayed virtual TP 2-8 at 4096 tokens were 1-7% faster; two GPUs
/// at TP 2 were level at 1-4096 tokens and 1-2% faster at 16384. The hint changes no value and
/// no ordering; a narrower scope (.gpu instead of .sys) made no difference.
__device__ __forceinline__ uint64_t slot_cache_policy() {
  uint64_t policy;
  asm("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}

// A slot is two 64-bit words {value bits | tag << 32}. Each word is single-copy atomic, so a
// reader that sees the expected tag in a word also sees that word's value; both words are
// checked because the 16-byte vector access as a whole is not atomic.
__device__ __forceinline__ void store_slot_sys(uint64_t* p, uint64_t w0, uint64_t w1) {
  asm volatile("st.relaxed.sys.global.L2::cache_hint.v2.b64 [%0], {%1, %2}, %3;" ::"l"(p), "l"(w0),
               "l"(w1), "l"(slot_cache_policy())
               : "memory");
}

__device__ __forceinline__ void load_slot_sys(const uint64_t* p, uint64_t& w0, uint64_t& w1) {
  asm volatile("ld.relaxed.sys.global.L2::cache_hint.v2.b64 {%0, %1}, [%2], %3;"
               : "=l"(w0), "=l"(w1)
               : "l"(p), "l"(slot_cache_policy())
               : "memory");
}

__device__ __forceinline__ uint64_t pack_word(float value, uint32_t tag) {
  return static_cast<uint64_t>(__float_as_uint(value)) | (static_cast<uint64_t>(tag) << 32);
}
__device__ __forceinline__ uint32_t word_tag(uint64_t w) { return static_cast<uint32_t>(w >> 32); }
__device__ __forceinline__ float word_value(uint64_t w) {
  return __uint_as_float(static_cast<uint32_t>(w));
}

__device__ __forceinline__ uint64_t global_timer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ __forceinline__ uint32_t load_volatile(const uint32_t* p) {
  return *reinterpret_cast<const volatile uint32_t*>(p);
}

/// Records the first failure of this rank in device memory and in the host-mapped mirror.
__device__ inline void record_failure(const RankArgs& ra, uint32_t code, int peer, int64_t token,
                                      uint32_t expected, uint32_t seen) {
  if (atomicCAS(&ra.failure->code, 0u, code) != 0u) return;
  ra.failure->rank = ra.rank;
  ra.failure->peer = peer;
  ra.failure->token = token;
  ra.failure->expected_tag = expected;
  ra.failure->seen_tag = seen;
  volatile FailureRecord* h = ra.host_failure;
  h->rank = ra.rank;
  h->peer = peer;
  h->token = token;
  h->expected_tag = expected;
  h->seen_tag = seen;
  __threadfence_system();  // details before the code the host polls
  h->code = code;
  __threadfence_system();
}

}  // namespace swiftqk::detail
