// The SwiftQK exchange as the kernels run it: the first warp's lane sl serves rank sl, publishing
// this rank's partial sums into rank sl's slot, collecting rank sl's from this rank's, and
// scrubbing the slots in scrub calls. The slot accesses and the failure word are exchange.cuh's.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/device_types.cuh"
#include "kernels/exchange.cuh"
#include "kernels/launch_args.hpp"
#include "protocol.hpp"

namespace swiftqk::detail {

/// The exchange runs on the W = min(group, 32) lanes of the group's first warp (the whole group
/// when it is narrower than a warp); lane sl of them serves rank sl. W >= world always: a group
/// narrower than a warp has at least world lanes (launch_plan.hpp), a wider one 32 >= kMaxWorld.

/// Lane sl's slots of this call's bank at token 0: the one it publishes into (this rank's slot
/// in rank sl's workspace) and the one it watches (rank sl's slot in this rank's workspace).
/// Token t's are t * slot_token_words words further (protocol.hpp's slot_token_stride in 8-byte
/// words, which is CPU-tested against slot_offset). Computed once per block: per token only one
/// multiply.
/// peer_ws is rank sl's workspace (ra.peers[sl], loaded by the caller well before: computing
/// this right after that load and the call counter's put both round trips before the first
/// row load, 0.2-0.3 us at 64 tokens).
struct ExchangeLane {
  uint64_t* publish = nullptr;  // null for lanes sl >= world
  uint64_t* watch = nullptr;
};
constexpr int kSlotWords = static_cast<int>(kSlotBytes / sizeof(uint64_t));

/// The slot order L is a template parameter (one instantiation per order), so the token-major
/// kernel computes these as it did before the order existed.
/// Args is LaunchArgs or EpilogueArgs (the exchange reads world, capacity and timeout_ns).
template <SlotLayout L, class Args>
__device__ __forceinline__ std::size_t slot_base(const Args& a, int bank, int src) {
  return slot_offset(a.world, a.capacity, bank, 0, src, L);
}
template <SlotLayout L, class Args>
__device__ __forceinline__ int slot_token_words(const Args& a) {
  return (L == SlotLayout::kTokenMajor ? a.world : 1) * kSlotWords;
}
template <SlotLayout L, class Args>
__device__ inline ExchangeLane exchange_lane(const Args& a, const RankArgs& ra, int bank, int sl,
                                             uint8_t* peer_ws) {
  ExchangeLane e;
  if (sl < a.world) {
    e.publish = reinterpret_cast<uint64_t*>(peer_ws + slot_base<L>(a, bank, ra.rank));
    e.watch = reinterpret_cast<uint64_t*>(ra.local_ws + slot_base<L>(a, bank, sl));
  }
  return e;
}

/// Lane e of bank 0 moved to bank `bank` (the banks are slot_bank_bytes apart in both slot
/// orders).
template <class Args>
__device__ __forceinline__ ExchangeLane bank_lane(const Args& a, ExchangeLane e, int bank) {
  if (e.publish != nullptr && bank != 0) {
    const std::size_t words = slot_bank_bytes(a.world, a.capacity) / sizeof(uint64_t);
    e.publish += words;
    e.watch += words;
  }
  return e;
}

/// Phase B, first half: push this rank's (q, k) partials of token t into every rank's slot (its
/// own included). Lane j writes rank j's copy.
__device__ __forceinline__ void publish_partials(const ExchangeLane& e, int token_words, int t,
                                                 uint32_t tag, uint32_t ktag, float q, float k) {
  if (e.publish != nullptr) {
    store_slot_sys(e.publish + static_cast<int64_t>(t) * token_words, pack_word(q, tag),
                   pack_word(k, ktag));
  }
}

/// Phase B, second half, called by a whole warp: wait (bounded) until every rank's partials of
/// token t are in this rank's slots, sum them, and mark the slots consumed. The sum is a
/// butterfly over lanes 0..world_pow2-1 (lanes past the world add +0), which leaves bitwise the
/// same total in each of them (each pairwise add is commutative), and every rank adds the same
/// values in the same tree; lane 0's total then goes to the group's other lanes. A warp may hold
/// several groups (W lanes each), one of which may have no token to collect (want false).
/// Returns false, in every lane, if the wait failed (recorded for the host).
template <class Args>
__device__ inline bool collect_partials(const Args& a, const RankArgs& ra, const ExchangeLane& e,
                                        int token_words, int world_pow2, int t, uint32_t tag,
                                        uint32_t ktag, float& q, float& k, bool want, int sl, int W,
                                        FailNote* note) {
  const bool watch = want && e.watch != nullptr;
  const uint64_t* mine = watch ? e.watch + static_cast<int64_t>(t) * token_words : nullptr;
  uint64_t w0 = 0, w1 = 0;
  bool have = !watch;
  uint64_t start = 0;  // the clock starts at the first timeout check, off the fast path
  for (uint32_t spin = 1;; ++spin) {
    if (!have) {
      load_slot_sys(mine, w0, w1);
      have = word_tag(w0) == tag && word_tag(w1) == ktag;
    }
    if (__all_sync(kFullMask, have)) break;
    if ((spin & 63u) == 0u) {
      const uint64_t now = global_timer_ns();
      if (start == 0) start = now;
      const bool expired = now - start > a.timeout_ns;
      const bool failed_elsewhere = group_failed(ra, a.world, a.capacity);
      if (__any_sync(kFullMask, expired || failed_elsewhere)) {
        const bool missing = expired && !have;
        const bool any_missing = __any_sync(kFullMask, missing);  // before the lanes diverge
        if (missing) {
          note_stop(note, ra, a.world, a.capacity, kFailTimeout, sl, t, tag, word_tag(w0));
        } else if (!any_missing && sl == 0) {
          note_stop(note, ra, a.world, a.capacity, kFailPeer, -1, t, tag, 0u);
        }
        return false;
      }
    }
  }
  float tq = word_value(w0), tk = word_value(w1);  // +0 in lanes past the world
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    if (off < world_pow2) {  // off < W: the butterfly stays inside the group's lanes
      tq += __shfl_xor_sync(kFullMask, tq, off);
      tk += __shfl_xor_sync(kFullMask, tk, off);
    }
  }
  if (world_pow2 < W) {  // lanes world_pow2.. summed only part of the slots
    tq = __shfl_sync(kFullMask, tq, 0, W);
    tk = __shfl_sync(kFullMask, tk, 0, W);
  }
  // The slot is not cleared: the next use of this bank has another tag, and a tag can only
  // repeat after kCallPeriod calls, with scrub calls in between (scrub_own_slots).
  q = tq;
  k = tk;
  return true;
}

/// In scrub calls (is_scrub_call), after the group's last collect: zero the slots of every
/// token of the group's sequence (first, + step, ...) up to the workspace's capacity, this rank's
/// bank of this call. No other group of this rank reads them (the sequences partition the
/// tokens), the group has read its own, those past the call's token count are stale, and no peer
/// writes this bank again before this rank has published the next call, after this kernel (the
/// reuse argument in docs/design.md). All G lanes share the stores. Twice per kScrubPeriod calls,
/// so written for brevity, not speed.
template <SlotLayout L, class Args>
__device__ inline void scrub_own_slots(const Args& a, const RankArgs& ra, int bank, int first_token,
                                       int step, int gt, int G) {
  const int64_t tokens =
      first_token < a.capacity ? (a.capacity - first_token + step - 1) / step : 0;
  const int64_t slots = tokens * a.world;
  for (int64_t i = gt; i < slots; i += G) {
    const int64_t k = i / a.world;
    const int src = static_cast<int>(i - k * a.world);
    store_slot_sys(
        reinterpret_cast<uint64_t*>(
            ra.local_ws + slot_offset(a.world, a.capacity, bank, first_token + k * step, src, L)),
        0ull, 0ull);
  }
}

}  // namespace swiftqk::detail
