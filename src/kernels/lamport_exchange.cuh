// The MiniMax-fused baseline's exchange (the design of vLLM's minimax_allreduce_rms_qk and
// TensorRT-LLM's MiniMaxReduceRMSKernel, written from its description): data is its own flag.
// Empty slot words hold -0.0 (0x80000000); a writer turns a -0.0 value into +0.0 and pushes
// 16 bytes {q, k, 0, 0} into every rank's slot; a reader spins on its local slot until no word
// is -0.0. Three buffers rotate by a device counter; each call clears, in its own workspace,
// the buffer the previous call used (no rank can still write there: see docs/design.md).
#pragma once

#include <cstdint>

#include "kernels/exchange.cuh"
#include "kernels/launch_args.hpp"
#include "protocol.hpp"

namespace swiftqk::detail {

__device__ __forceinline__ uint32_t lamport_word(float v) {
  const uint32_t b = __float_as_uint(v);
  return b == kLamportEmpty ? 0u : b;  // -0.0 would read as "empty"
}

__device__ __forceinline__ void lamport_store(uint32_t* p, uint32_t a, uint32_t b) {
  asm volatile("st.relaxed.sys.global.v4.b32 [%0], {%1, %2, %3, %3};" ::"l"(p), "r"(a), "r"(b),
               "r"(0u)
               : "memory");
}

__device__ __forceinline__ void lamport_load(const uint32_t* p, uint32_t& a, uint32_t& b,
                                             uint32_t& c, uint32_t& d) {
  asm volatile("ld.relaxed.sys.global.v4.b32 {%0, %1, %2, %3}, [%4];"
               : "=r"(a), "=r"(b), "=r"(c), "=r"(d)
               : "l"(p)
               : "memory");
}

/// Publishes (q, k) of token t into every rank's Lamport slot; lane j (of the group's W exchange
/// lanes, as in publish_partials) writes rank j's copy.
__device__ inline void lamport_publish(const LaunchArgs& a, const RankArgs& ra, int64_t t, int buf,
                                       float q, float k, int sl, int W) {
  const std::size_t off = lamport_slot_offset(a.world, a.capacity, buf, t, ra.rank);
  for (int j = sl; j < a.world; j += W) {
    lamport_store(reinterpret_cast<uint32_t*>(ra.peers[j] + off), lamport_word(q), lamport_word(k));
  }
}

/// Waits (bounded) until all ranks' (q, k) of token t are in this rank's slots and sums them in
/// rank order. The slots are not cleared here: the next call clears the whole buffer. Called by a
/// whole warp, with want, sl and W as collect_partials takes them.
__device__ inline bool lamport_collect(const LaunchArgs& a, const RankArgs& ra, int64_t t, int buf,
                                       float& q, float& k, bool want, int sl, int W,
                                       FailNote* note) {
  const int world = a.world;
  const bool watch = want && sl < world;
  const uint32_t* mine = watch
                             ? reinterpret_cast<const uint32_t*>(
                                   ra.local_ws + lamport_slot_offset(world, a.capacity, buf, t, sl))
                             : nullptr;
  uint32_t w0 = 0, w1 = 0, w2 = 0, w3 = 0;
  bool have = !watch;
  const uint64_t start = global_timer_ns();
  for (uint32_t spin = 1;; ++spin) {
    if (!have) {
      lamport_load(mine, w0, w1, w2, w3);
      // Every word is checked: a 16-byte access is not single-copy atomic as a whole.
      have =
          w0 != kLamportEmpty && w1 != kLamportEmpty && w2 != kLamportEmpty && w3 != kLamportEmpty;
    }
    if (__all_sync(0xffffffffu, have)) break;
    if ((spin & 63u) == 0u) {
      const bool expired = global_timer_ns() - start > a.timeout_ns;
      const bool failed_elsewhere = group_failed(ra, world, a.capacity);
      if (__any_sync(0xffffffffu, expired || failed_elsewhere)) {
        const bool missing = expired && !have;
        const bool any_missing = __any_sync(0xffffffffu, missing);  // before the lanes diverge
        if (missing) {
          note_stop(note, ra, world, a.capacity, kFailTimeout, sl, t, 0u, 0u);
        } else if (!any_missing && sl == 0) {
          note_stop(note, ra, world, a.capacity, kFailPeer, -1, t, 0u, 0u);
        }
        return false;
      }
    }
  }
  float tq = 0.f, tk = 0.f;
  for (int j = 0; j < world; ++j) {
    tq += __shfl_sync(0xffffffffu, __uint_as_float(w0), j, W);
    tk += __shfl_sync(0xffffffffu, __uint_as_float(w1), j, W);
  }
  q = tq;
  k = tk;
  return true;
}

/// Refills with -0.0 this rank's slots of Lamport buffer buf for tokens [0, tokens), spread
/// over the rank's blocks.
__device__ inline void lamport_clear(const LaunchArgs& a, const RankArgs& ra, int buf,
                                     uint32_t tokens, int lblock) {
  uint4* p =
      reinterpret_cast<uint4*>(ra.local_ws + lamport_slot_offset(a.world, a.capacity, buf, 0, 0));
  const int64_t n = static_cast<int64_t>(tokens) * a.world;
  const uint4 empty = make_uint4(kLamportEmpty, kLamportEmpty, kLamportEmpty, kLamportEmpty);
  for (int64_t i = static_cast<int64_t>(lblock) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(a.blocks_per_rank) * blockDim.x) {
    p[i] = empty;
  }
}

}  // namespace swiftqk::detail
