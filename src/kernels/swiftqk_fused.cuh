// The SwiftQK fused kernel: per token and rank, (A) local sums of squares of the Q and K shard
// rows, (B) the rank's two partials pushed into every peer's slot while the weights load, then
// a bounded wait for all peers' partials, summed in the same tree on every rank, and (C) the
// scaled output.
// Persistent: the grid is bounded by residency (plan_grid), each block walks tokens in
// increasing order, so every wait is on a token some resident block will publish.
#pragma once

#include <cstdint>

#include "kernels/device_types.cuh"
#include "kernels/exchange.cuh"
#include "kernels/lamport_exchange.cuh"
#include "kernels/launch_args.hpp"
#include "protocol.hpp"

namespace swiftqk::detail {

constexpr unsigned kFullMask = 0xffffffffu;

/// Register caps of the staged kernel. Alone, 48 (no spills) lets 5 blocks of 256 threads share an
/// SM instead of 4; with peers the exchange needs 64 (at 48 it spills and is slower at 4096
/// tokens; CHANGELOG.md, "Tried and dropped"). Eight vectors a thread spill under 48. The
/// deterministic layouts (det_lanes canonical lanes a thread) spill under those caps: alone they
/// take 56, and with peers 72 when a thread holds several lanes; one-lane layouts (a warp a
/// segment, OLMo2-13B's) keep 64 with peers, where 72 left fewer of their 256-thread blocks an SM
/// and was slower than the spill (CHANGELOG.md).
constexpr int kAloneMaxRegs = 48;
constexpr int kMaxRegs = 64;
constexpr int kDetAloneMaxRegs = 56;
constexpr int kDetLanesMaxRegs = 72;
constexpr int max_regs(bool alone, int vpt, int det_lanes) {
  if (det_lanes > 0 && vpt > 0 && vpt < 8) {
    if (alone) return kDetAloneMaxRegs;
    return det_lanes > 1 ? kDetLanesMaxRegs : kMaxRegs;
  }
  return alone && vpt > 0 && vpt < 8 ? kAloneMaxRegs : kMaxRegs;
}

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

/// Asynchronous 16-byte global-to-shared copy (completes per thread at cp_async_wait) to the
/// shared-window address s (converted once per block, not per copy).
__device__ __forceinline__ void cp_async16(uint32_t s, const void* gmem) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(gmem) : "memory");
}
/// The same for 8 or 4 bytes (rows of 8- or 4-byte vectors); .cg, which skips L1, takes 16
/// bytes only.
template <int kBytes>
__device__ __forceinline__ void cp_async_narrow(uint32_t s, const void* gmem) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], %2;" ::"r"(s), "l"(gmem), "n"(kBytes)
               : "memory");
}
template <int kBytes>
__device__ __forceinline__ void cp_async_vec(uint32_t s, const void* gmem) {
  static_assert(kBytes == 16 || kBytes == 8 || kBytes == 4,
                "rows are staged in 16-, 8- or 4-byte vectors");
  if constexpr (kBytes == 16) {
    cp_async16(s, gmem);
  } else {
    cp_async_narrow<kBytes>(s, gmem);
  }
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

/// Rows staged through shared memory: a group's ring of `stages` rows holds the token being
/// written, the one being reduced (the same one unless deferring) and the rest in flight. The
/// host picks the depth (launch_plan.hpp, kMinStages..kMaxStages): deeper hides more latency,
/// shallower lets more blocks share an SM.

/// The stage ring's bytes: `stages` rows of input vectors of vec_bytes (16, 8 or 4) for each of the
/// block's token groups, rounded up to 16 bytes so that the weights after it stay 16-byte aligned.
constexpr std::size_t staged_ring_bytes(int64_t vectors_per_row, int tokens_per_block, int stages,
                                        int vec_bytes) {
  return (static_cast<std::size_t>(stages) * tokens_per_block * vectors_per_row * vec_bytes + 15) /
         16 * 16;
}

/// Dynamic shared memory of the staged kernel (host and device agree on it): the stage ring,
/// then the block's copy of the weight slice.
constexpr std::size_t staged_smem_bytes(int64_t vectors_per_row, int tokens_per_block,
                                        std::size_t weight_bytes, int stages, int vec_bytes = 16) {
  return staged_ring_bytes(vectors_per_row, tokens_per_block, stages, vec_bytes) + weight_bytes;
}

/// Waits until at most n of this thread's cp.async groups are pending (n is an immediate in PTX).
__device__ __forceinline__ void cp_async_wait_pending(int n) {
  if (n == 1) {  // the default depths (2 alone, 3 with peers and deferral) come here
    cp_async_wait<1>();
  } else if (n == 0) {
    cp_async_wait<0>();
  } else if (n == 2) {
    cp_async_wait<2>();
  } else if (n == 3) {
    cp_async_wait<3>();
  } else {
    cp_async_wait<kMaxStages - 1>();
  }
}

/// Barrier of one token group only (barrier 1 + g, G threads), so a group that has its partial
/// sums goes on without waiting for the block's other groups; barrier 0 stays __syncthreads.
__device__ __forceinline__ void group_barrier(int g, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(1 + g), "r"(threads) : "memory");
}

/// Sum over a token group's warps of their (q, k) partials, the same bits in every lane of every
/// warp: lane l takes warp (l mod p)'s partial (p = warps rounded up to a power of two, missing
/// warps add zero) and a butterfly adds them. Each pairwise add is commutative, so every lane
/// ends with the same value, and no warp waits on another to have summed.
__device__ __forceinline__ float2 group_sum(const float2* parts, int warps, int warps_pow2,
                                            int lane) {
  const int j = lane & (warps_pow2 - 1);
  float2 v = j < warps ? parts[j] : make_float2(0.f, 0.f);
  for (int off = 1; off < warps_pow2; off <<= 1) {
    v.x += __shfl_xor_sync(kFullMask, v.x, off);
    v.y += __shfl_xor_sync(kFullMask, v.y, off);
  }
  return v;
}

/// Writes NaN over every output element (and rstd) of tokens from, from + step, ... < T: what a
/// group leaves for the tokens it could not normalise, so that a failed call never leaves a
/// plausible-looking output (in place, the inputs of those rows are lost). The failure path only.
template <typename Tout>
__device__ __forceinline__ void poison_rows(const LaunchArgs& a, const RankArgs& ra, int from,
                                            int step, int T, int gt, int G) {
  const Tout nan = from_float<Tout>(__int_as_float(0x7fffffff));
  for (int t = from; t < T; t += step) {
    Tout* q = static_cast<Tout*>(ra.q_out) + static_cast<int64_t>(t) * ra.q_out_stride;
    Tout* k = static_cast<Tout*>(ra.k_out) + static_cast<int64_t>(t) * ra.k_out_stride;
    for (int i = gt; i < a.q_width; i += G) q[i] = nan;
    for (int i = gt; i < a.k_width; i += G) k[i] = nan;
    if (gt == 0 && ra.rstd_out != nullptr) {
      ra.rstd_out[2 * static_cast<int64_t>(t)] = __int_as_float(0x7fffffff);
      ra.rstd_out[2 * static_cast<int64_t>(t) + 1] = __int_as_float(0x7fffffff);
    }
  }
}

/// The rank's claim word: CallState's {call, owner} pair as one 64-bit word.
__device__ __forceinline__ unsigned long long* claim_word(CallState* s) {
  return reinterpret_cast<unsigned long long*>(&s->call);
}
__device__ __forceinline__ unsigned long long claim_of(uint32_t call, uint32_t owner) {
  return static_cast<unsigned long long>(call) | (static_cast<unsigned long long>(owner) << 32);
}
/// This kernel's owner id, from the low 16 bits n of %gridid (which differs between launches,
/// graph replays included): {n, ~n}, 16 bits set in every id, so no id's bits contain another's
/// and the OR of two ids is never an id. A second kernel's claim therefore always leaves the
/// owner half unlike either kernel's id (a plain id such as 0x1001 would cover 0x1000).
__device__ __forceinline__ uint32_t grid_owner_id() {
  uint64_t id;
  asm volatile("mov.u64 %0, %%gridid;" : "=l"(id));
  const uint32_t n = static_cast<uint32_t>(id) & 0xffffu;
  return (n << 16) | (n ^ 0xffffu);
}

/// What a block with peers found at entry (BlockEntry in docs/design.md, "Failure semantics").
enum BlockEntry : int {
  kEntryRun = 0,       // this kernel owns the rank and the group is healthy
  kEntryDead = 1,      // owner, but the rank or a peer has failed: poison, account, exit
  kEntryNotOwner = 2,  // another kernel of this communicator is running: poison, exit
};

/// Thread 0 of each block with peers, after the block's first copies are issued: checks the
/// rank's claim (block 0 made it at entry: claim_seen is what its atomicOr returned; the other
/// blocks wait, bounded, to see it) and the fault word read at entry, and returns the block's
/// BlockEntry, with the call number of the claim in *call. A failure is noted in *note.
template <class Args>
__device__ __forceinline__ int claim_rank_at_entry(const Args& a, const RankArgs& ra, int lblock,
                                                   unsigned long long claim_seen,
                                                   bool failed_at_entry, FailNote* note,
                                                   uint32_t* call) {
  // One kernel at a time per communicator. Block 0 claimed the rank: it must have been free.
  // The other blocks take part only once they see the rank owned by this kernel exactly (they
  // wait, bounded, for block 0's claim to land); any other owner is a second kernel running at
  // once. So every block that exchanges does so while this kernel owns the rank, and the owner
  // releases it only after all its blocks have finished: two kernels' exchanges never overlap.
  // A second kernel's claim leaves its bits in the owner half, which the first one then never
  // matches: the rank stays claimed, and every later kernel fails, until reset(). (Every block
  // claiming for itself needs no wait, but a block of a second kernel that starts after the
  // owner's release would then find the rank free and take part although its block 0 failed:
  // the CPU model's AcceptingAFreeOwnerLetsAStraddlingKernelRun.)
  const uint32_t id = grid_owner_id();
  bool foreign = false;
  if (lblock == 0) {
    foreign = static_cast<uint32_t>(claim_seen >> 32) != 0u;
  } else {
    const uint64_t start = global_timer_ns();
    for (;;) {
      claim_seen = *reinterpret_cast<volatile unsigned long long*>(claim_word(ra.state));
      if ((claim_seen >> 32) != 0ull || global_timer_ns() - start > a.timeout_ns) break;
    }
    foreign = static_cast<uint32_t>(claim_seen >> 32) != id;
  }
  int entry = kEntryRun;
  if ((claim_seen >> 32) == 0ull && lblock != 0) {  // block 0 never came: not resident
    note_stop(note, ra, a.world, a.capacity, kFailTimeout, ra.rank, -1, 0u, 0u);
    entry = kEntryNotOwner;
  } else if (foreign) {
    note_stop(note, ra, a.world, a.capacity, kFailConcurrent, -1, -1,
              tag_for_call(static_cast<uint32_t>(claim_seen)), 0u);
    entry = kEntryNotOwner;
  } else if (failed_at_entry) {
    note_stop(note, ra, a.world, a.capacity, kFailPeer, -1, -1,
              tag_for_call(static_cast<uint32_t>(claim_seen)), 0u);
    entry = kEntryDead;
  }
  *call = static_cast<uint32_t>(claim_seen);
  return entry;
}

/// Thread 0, after every thread of the block is done: counts the block as finished and returns
/// true in the rank's last block to finish, which has reset the count and must then release the
/// rank (release_rank).
template <class Args>
__device__ __forceinline__ bool last_block_of_rank(const Args& a, const RankArgs& ra) {
  const uint32_t prev = atomicAdd(&ra.state->blocks_done, 1u);
  if (prev != static_cast<uint32_t>(a.blocks_per_rank) - 1u) return false;
  ra.state->blocks_done = 0u;
  return true;
}

/// Frees the rank for the next kernel and sets its call counter, in one 64-bit store.
__device__ __forceinline__ void release_rank(const RankArgs& ra, uint32_t call_after) {
  *reinterpret_cast<volatile unsigned long long*>(claim_word(ra.state)) = claim_of(call_after, 0u);
}

/// 1 / rms of a row from its full sum of squares (the same instruction on every rank, so every
/// rank's scale is bitwise the same).
__device__ __forceinline__ float inv_rms(float sum_sq, float inv_full, float eps) {
  return rsqrtf(sum_sq * inv_full + eps);
}

/// Deterministic mode, one thread's part of the canonical order for the staged slots of a token
/// (x: the stage, slot_pos(v): slot v's vector there): each vector's sum of squares (a chain from
/// 0), added in order to its canonical lane's total (Q slot v is lane v % L's, K slot VPT - 1 - u
/// lane u % L's, L = kDetLanes), then the thread's L lanes meet in the lanes' xor tree at offsets
/// L/2 ... 1 (canonical offsets 16 ... P). A lane without vectors adds an exact zero.
template <typename Tin, int VEC, int VPT, int kDetLanes, typename SlotPos, typename InRow,
          typename IsQ>
__device__ __forceinline__ void det_thread_sums(const Vec<Tin, VEC>* x, const SlotPos& slot_pos,
                                                const InRow& in_row, const IsQ& is_q, bool active,
                                                float& sq, float& sk) {
  float lq[kDetLanes], lk[kDetLanes];
#pragma unroll
  for (int i = 0; i < kDetLanes; ++i) lq[i] = lk[i] = 0.f;
#pragma unroll
  for (int v = 0; v < VPT; ++v) {  // Q from the first slot up, in each lane's order
    if (active && in_row(v) && is_q(v)) {
      lq[v % kDetLanes] += vector_sum_sq<Tin, VEC>(load_vec(x + slot_pos(v)));
    }
  }
#pragma unroll
  for (int v = VPT - 1; v >= 0; --v) {  // K from the last slot down, likewise
    if (active && in_row(v) && !is_q(v)) {
      lk[(VPT - 1 - v) % kDetLanes] += vector_sum_sq<Tin, VEC>(load_vec(x + slot_pos(v)));
    }
  }
#pragma unroll
  for (int h = kDetLanes >> 1; h > 0; h >>= 1) {
#pragma unroll
    for (int i = 0; i < h; ++i) {
      lq[i] += lq[i + h];
      lk[i] += lk[i + h];
    }
  }
  sq = lq[0];
  sk = lk[0];
}

/// VPT > 0 (vector path): rows are staged through shared memory a.stages tokens deep with
/// cp.async, so every SM keeps loads in flight while a token is reduced, exchanged and written.
/// VPT == 0: rows are streamed twice from global memory (the second read hits L2); used for
/// rows too wide to stage and for the scalar path.
/// kLamport selects the MiniMax-fused baseline's exchange and schedule (lamport_exchange.cuh, no
/// deferral) on the same data path, so a comparison isolates the exchange.
/// kAlone (a group of one rank, TP 1) compiles the exchange out: fewer registers, so more blocks
/// fit an SM where registers are the limit.
/// kSlotOrder is the exchange's slot order (choose_slot_layout); only the SwiftQK exchange with
/// peers is instantiated source-major. kBlockOrder maps blocks to the launch's ranks
/// (choose_block_order); only kernels with peers are instantiated interleaved.
/// Token and vector indices are 32-bit (the host splits launches at kMaxLaunchTokens): the
/// kernel is short of issue slots, and 64-bit index arithmetic was a third of its instructions.
/// kDetLanes > 0 is the deterministic (TP-invariant) mode: every sum of squares follows the
/// canonical order of docs/design.md ("Deterministic mode"), whatever the TP degree and launch
/// shape. A segment of the rank's row then takes P = 32 / kDetLanes threads of the group (the
/// host sets G = P * 16 / world), thread p of it holding the segment's canonical lanes p, p + P,
/// ...; each segment's sum is scaled by the input scale squared before the segments are added.
template <typename Tin, int VEC, int VPT, bool kOlmo2, bool kLamport, bool kAlone,
          SlotLayout kSlotOrder = SlotLayout::kTokenMajor,
          BlockOrder kBlockOrder = BlockOrder::kRankMajor, int kDetLanes = 0>
__global__ void __launch_bounds__(1024) __maxnreg__(max_regs(kAlone, VPT, kDetLanes))
    swiftqk_fused_kernel(const __grid_constant__ LaunchArgs a) {
  constexpr bool kDet = kDetLanes > 0;
  // Deterministic mode: threads a segment takes; a streamed row keeps one warp a segment.
  constexpr int kDetP = kDet ? kCanonicalLanes / kDetLanes : kCanonicalLanes;
  static_assert(!kDet || (kDetLanes <= 8 && (kDetLanes & (kDetLanes - 1)) == 0 &&
                          (VPT == 0 ? kDetLanes == 1 : kDetLanes <= VPT)),
                "a thread holds 1, 2, 4 or 8 canonical lanes, at most one a slot");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // Launched with programmatic dependent launch (QkNormParams::pdl), this grid may start before
  // the previous kernel on the stream has finished: nothing in global memory (inputs, weights,
  // the call counter, the slots) is read before that kernel and its writes are complete. Without
  // PDL the wait returns at once. The next kernel may then be scheduled once every block here
  // has triggered: it waits the same way for this whole grid, call counter included. Alone there
  // is no wait to protect, so the trigger comes at once; with peers it comes after the block's
  // last collect (below), so that the next kernel's blocks, parked at their own wait, never hold
  // SMs that a peer's blocks (another launch on this GPU) still need to publish what this grid
  // waits for.
  asm volatile("griddepcontrol.wait;" ::: "memory");
  if constexpr (kAlone) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
  using Tout = typename OutputOf<Tin>::type;
  using InVec = Vec<Tin, VEC>;
  using OutVec = Vec<Tout, VEC>;
  constexpr int kVecBytes = static_cast<int>(sizeof(InVec));
  static_assert(VPT == 0 || kVecBytes == 16 || kVecBytes == 8 || kVecBytes == 4,
                "staging moves 16-, 8- or 4-byte vectors");
  // Dynamic shared memory: [stages][tokens_per_block][n] input vectors, then the weights.
  extern __shared__ uint4 s_stage[];
  // Per warp (q, k) partial sums, double-buffered by iteration parity: a warp writing the next
  // iteration's partials has passed this iteration's group barrier, which every reader of the
  // same buffer two iterations back had reached after reading it.
  __shared__ float2 s_part[2][32];
  __shared__ float2 s_rstd[32];  // per group: (q, k) 1/rms times the input scale
  __shared__ int s_abort[32];    // per group: a wait failed, stop
  __shared__ uint32_t s_call;    // the call number of the rank's claim
  __shared__ int s_entry;        // BlockEntry
  __shared__ FailNote s_note;    // why the block stopped, if it did (recorded after the loop)

  // Which rank and which of its blocks this block is (block_role, CPU-tested; the rank-major
  // case is written out so that its kernels keep the code they had before the order existed).
  int slot_rank, lblock;
  if constexpr (kBlockOrder == BlockOrder::kRankMajor) {
    slot_rank = blockIdx.x / a.blocks_per_rank;
    lblock = blockIdx.x - slot_rank * a.blocks_per_rank;
  } else {
    const BlockRole role =
        block_role(static_cast<int>(blockIdx.x), static_cast<int>(gridDim.x) / a.blocks_per_rank,
                   a.blocks_per_rank, kBlockOrder);
    slot_rank = role.rank;
    lblock = role.block;
  }
  const RankArgs& ra = a.r[slot_rank];
  const int G = a.group_threads;
  const int g = threadIdx.x / G;
  const int gt = threadIdx.x - g * G;
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  // A group narrower than a warp (G = 8 or 16, rows of few vectors with peers) shares its warp
  // with 32 / G others: W lanes do its exchange (all of its G, else the first warp's 32), sl is
  // this thread's lane among them. Such groups, like one-warp groups, need no barrier.
  const bool warp_or_less = G <= 32;
  const int W = warp_or_less ? G : 32;
  const int sl = gt & (W - 1);
  const int warps_per_group = G >> 5;
  int warps_pow2 = 1;
  while (warps_pow2 < warps_per_group) warps_pow2 <<= 1;
  const int nq = static_cast<int>(a.q_width / VEC);
  const int n = nq + static_cast<int>(a.k_width / VEC);
  const int T = static_cast<int>(a.tokens);
  const int S = a.stages;

  // Alone, nothing is exchanged, so no call number is read or advanced (see the end). With peers,
  // block 0 claims the rank for this kernel now and every block reads the fault word, so both
  // round trips overlap the first rows' loads (their values are needed only at the barrier
  // below; read after the copies are issued, the fault word held the barrier back by a round
  // trip). The other blocks read the claim just before the barrier, once block 0's has most
  // likely landed.
  unsigned long long claim_seen = 0;
  // The fault word's raw value, tested only at the barrier: read through group_failed (a bool),
  // the comparison lands right after the load and thread 0 waits for it before issuing copies.
  uint64_t fault_seen = 0;
  if (!kAlone && threadIdx.x == 0) {
    s_note.code = 0u;
    if (lblock == 0) claim_seen = atomicOr(claim_word(ra.state), claim_of(0u, grid_owner_id()));
    fault_seen = load_volatile64(fault_word(ra.local_ws, a.world, a.capacity));
  }
  const uint32_t lamport_call = kLamport && !kAlone ? load_volatile(&ra.state->lamport_call) : 0u;
  const int step = a.blocks_per_rank * a.tokens_per_block;
  uint8_t* const peer_ws = !kAlone && !kLamport && sl < a.world ? ra.peers[sl] : nullptr;
  const int token_words = slot_token_words<kSlotOrder>(a);
  int world_pow2 = 1;
  while (world_pow2 < a.world) world_pow2 <<= 1;
  const int first = lblock * a.tokens_per_block;
  if (gt == 0 && !warp_or_less) s_abort[g] = 0;  // at most kMaxGroupsPerBlock such groups
  if constexpr (kLamport) {
    // The previous call's buffer: every rank finished writing it (this rank read all of it).
    if (!kAlone) {
      lamport_clear(a, ra, static_cast<int>((lamport_call + kLamportBuffers - 1) % kLamportBuffers),
                    load_volatile(&ra.state->lamport_tokens), lblock);
    }
  }

  // This thread's vector slots are the same for every token: whether slot v lies in the row, in
  // Q or K, and its element offset there. Per token only the two row starts are computed.
  constexpr int kSlots = VPT > 0 ? VPT : 1;
  bool v_in[kSlots], v_q[kSlots];
  [[maybe_unused]] int v_off[kSlots];  // the default mode's
  // Deterministic mode: segment lengths in vectors (the rank's row holds G / P segments of Q
  // and as many of K), this thread's segment and its place p in it. Slot v < det_q_slots holds
  // Q vector p + P v of the thread's segment, slot VPT - 1 - u K vector p + P u: in the row,
  // Q slot v is vector det_q0 + P v and K slot v vector det_k0 - P v (v_idx). Vector p + P u is
  // canonical lane p + P (u % kDetLanes)'s (u / kDetLanes)-th: both are compile-time per slot.
  [[maybe_unused]] const int seg_q = kDet ? nq / (G / kDetP) : 0;
  [[maybe_unused]] const int seg_k = kDet ? (n - nq) / (G / kDetP) : 0;
  [[maybe_unused]] const int det_seg = gt / kDetP, det_p = gt % kDetP;
  [[maybe_unused]] const int det_q0 = det_seg * seg_q + det_p;
  [[maybe_unused]] const int det_k0 = nq + det_seg * seg_k + det_p + kDetP * (kSlots - 1);
  [[maybe_unused]] int v_idx[kSlots];
#pragma unroll
  for (int v = 0; v < kSlots; ++v) {
    if constexpr (kDet) {
      v_q[v] = v < a.det_q_slots;
      const int u = v_q[v] ? v : kSlots - 1 - v;
      v_in[v] = VPT > 0 && det_p + kDetP * u < (v_q[v] ? seg_q : seg_k);
      v_idx[v] = v_q[v] ? det_q0 + kDetP * v : det_k0 - kDetP * v;
    } else {
      const int i = gt + v * G;
      v_in[v] = VPT > 0 && i < n;
      v_q[v] = i < nq;
      v_off[v] = (v_q[v] ? i : i - nq) * VEC;
    }
  }
  // Whether slot v lies in the row and in Q, its vector in the row (deterministic mode) and
  // its element offset in Q or K.
  auto in_row = [&](int v) { return v_in[v]; };
  auto is_q = [&](int v) { return v_q[v]; };
  [[maybe_unused]] auto det_idx = [&](int v) {
    if constexpr (kDet) {
      return v_idx[v];
    } else {
      return 0;
    }
  };
  auto slot_off = [&](int v) {
    if constexpr (kDet) {
      return (is_q(v) ? det_idx(v) : det_idx(v) - nq) * VEC;
    } else {
      return v_off[v];
    }
  };

  // This thread's vector 0 of stage s; its slot v is G vectors further (only the thread that
  // copies a vector ever reads it, so cp_async_wait alone makes it visible: no barrier). In the
  // deterministic mode a slot's vector sits at its place in the row instead.
  InVec* const my_stage0 = reinterpret_cast<InVec*>(s_stage) + g * n + gt;
  auto slot_pos = [&](int v) {
    if constexpr (kDet) {
      return det_idx(v) - gt;
    } else {
      return v * G;
    }
  };
  const int stage_vectors = a.tokens_per_block * n;
  auto stage = [&](int s) { return my_stage0 + s * stage_vectors; };
  const uint32_t my_stage0_s = static_cast<uint32_t>(__cvta_generic_to_shared(my_stage0));
  // The group's tokens go first + g, + step, + 2 step, ...
  int tk_next = first + g;
  auto issue = [&](int s) {  // loads the group's next row into stage s
    if constexpr (VPT > 0) {
      if (tk_next < T) {
        const Tin* q_next =
            static_cast<const Tin*>(ra.q_in) + static_cast<int64_t>(tk_next) * ra.q_in_stride;
        const Tin* k_next =
            static_cast<const Tin*>(ra.k_in) + static_cast<int64_t>(tk_next) * ra.k_in_stride;
        const uint32_t dst = my_stage0_s + static_cast<uint32_t>(s * stage_vectors * kVecBytes);
#pragma unroll
        for (int v = 0; v < VPT; ++v) {
          if (in_row(v)) {
            cp_async_vec<kVecBytes>(dst + static_cast<uint32_t>(slot_pos(v) * kVecBytes),
                                    (is_q(v) ? q_next : k_next) + slot_off(v));
          }
        }
      }
      cp_async_commit();  // empty groups keep the group count uniform
      tk_next += step;
    }
  };
  auto wrap = [S](int s) { return s >= S ? s - S : s; };
  // With peers, iteration `it` reduces and publishes token it (of this group's sequence) and
  // then collects and writes token it-D (D = the deferral depth, a.defer), so a token's exchange
  // overlaps the next D tokens' loads and reductions instead of stalling the block, and a peer
  // up to D tokens behind costs no wait. (Collecting token it-1 before reducing token it,
  // to save the second group barrier, was 10-36% slower at 4096 tokens on virtual ranks: the
  // collect then comes too soon after the peers' publish and its first look misses.) Waiting only
  // on tokens this block published an iteration earlier keeps the persistent grid deadlock-free
  // (docs/design.md). Alone (TP 1), or with a single iteration, nothing is gained by deferring: a
  // token is written at once and the freed stage lets the loads run one token further ahead.
  const int iterations = first < T ? (T - first + step - 1) / step : 0;
  // Block-uniform; the host keeps a.defer <= S - 1. The stages hold the tokens being written
  // (D), the one reduced and `ahead` loading; ahead 0 means no prefetch.
  const int defer = kLamport || kAlone ? 0 : max(0, min(a.defer, iterations - 1));
  const int ahead = S - 1 - defer;
  // Every token uses the same weight slice: it is read from global memory once per block, into
  // shared memory after the stages (re-reading it per token doubled the L2 traffic). The weights
  // and the first rows are all asynchronous copies, so they are in flight together: at a few
  // tokens the kernel is one such latency chain. (Loaded through registers, a loop of several
  // weight vectors a thread goes one memory round trip per vector: the compiler cannot tell
  // the shared store from the next global load.)
  OutVec* s_weight = reinterpret_cast<OutVec*>(
      reinterpret_cast<uint8_t*>(s_stage) + staged_ring_bytes(n, a.tokens_per_block, S, kVecBytes));
  if constexpr (VPT > 0) {
    // In 16-byte units, or in weight vectors narrower than that (16-bit rows of 8- or 4-byte
    // vectors, fp8 rows of 4-byte ones).
    constexpr int kUnit = sizeof(OutVec) >= 16 ? 16 : static_cast<int>(sizeof(OutVec));
    static_assert(sizeof(OutVec) % kUnit == 0 && (kUnit == 16 || kUnit == 8 || kUnit == 4),
                  "weights are copied in 16-, 8- or 4-byte units");
    using Unit = Word<kUnit>;
    constexpr int kUnits = static_cast<int>(sizeof(OutVec) / kUnit);
    const uint32_t w_s = static_cast<uint32_t>(__cvta_generic_to_shared(s_weight));
    const int uq = nq * kUnits;
    for (int i = threadIdx.x; i < n * kUnits; i += blockDim.x) {
      cp_async_vec<kUnit>(w_s + static_cast<uint32_t>(i * kUnit),
                          i < uq ? static_cast<const Unit*>(ra.q_w) + i
                                 : static_cast<const Unit*>(ra.k_w) + (i - uq));
    }
    cp_async_commit();  // the oldest group: the wait below leaves only the rows' pending
  }
  for (int s = 0; s < ahead; ++s) issue(s);
  // The exchange lane's slots in bank 0, before the barrier: after it only the bank's offset
  // is added (bank_lane), so no 64-bit address arithmetic waits on the claim.
  const ExchangeLane xl0 =
      kAlone || kLamport ? ExchangeLane{} : exchange_lane<kSlotOrder>(a, ra, 0, sl, peer_ws);
  if (!kAlone && threadIdx.x == 0) {
    s_entry = claim_rank_at_entry(a, ra, lblock, claim_seen, fault_seen != 0ull, &s_note, &s_call);
  }
  if constexpr (VPT > 0) cp_async_wait_pending(ahead);
  __syncthreads();  // the weights, s_abort and the claim before any group reads them
  const int entry = kAlone ? static_cast<int>(kEntryRun) : s_entry;
  const uint32_t call = kAlone ? 0u : (kLamport ? lamport_call : s_call);
  const uint32_t tag = tag_for_call(call);
  const uint32_t ktag = tag ^ a.config_hash;
  const int bank = bank_for_call(call);
  const ExchangeLane xl = bank_lane(a, xl0, bank);
  const OutVec* const my_weight = s_weight + gt;

  // The stage of the reduced token (cur), of the written one (wstage) and of the next load.
  int cur = 0;
  // The group's first token left unwritten by a failure (T: none); a dead block writes none.
  int poison_from = entry == kEntryRun ? T : first + g;
  const int last = entry == kEntryRun ? iterations + defer : 0;
  for (int it = 0; it < last; ++it) {
    const int t = first + it * step + g;  // the token reduced and published
    const int tw = t - defer * step;      // the token collected and written
    const bool active = it < iterations && t < T;
    const bool active_write = it >= defer && tw < T;
    const int wstage = wrap(cur + S - defer);
    const int par = it & 1;
    float sq = 0.f, sk = 0.f;
    // Phase A: local sums of squares of the current token.
    if constexpr (VPT > 0) {
      issue(wrap(cur + ahead));  // token t + ahead * step
      cp_async_wait_pending(ahead);
      const InVec* x = stage(cur);
      if constexpr (kDet) {
        det_thread_sums<Tin, VEC, VPT, kDetLanes>(x, slot_pos, in_row, is_q, active, sq, sk);
      } else {
#pragma unroll
        for (int v = 0; v < VPT; ++v) {
          if (active && v_in[v]) accumulate<Tin, VEC>(load_vec(x + slot_pos(v)), v_q[v], sq, sk);
        }
      }
    } else if (active) {
      if constexpr (kDet) {  // the canonical order, read from global memory
        const int w0 = gt >> 5;
        for (int j = lane; j < seg_q; j += 32) {
          accumulate<Tin, VEC>(load_vec(row_vec<Tin, VEC>(ra, t, w0 * seg_q + j, nq)), true, sq,
                               sk);
        }
        for (int j = lane; j < seg_k; j += 32) {
          accumulate<Tin, VEC>(load_vec(row_vec<Tin, VEC>(ra, t, nq + w0 * seg_k + j, nq)), false,
                               sq, sk);
        }
      } else {
        for (int i = gt; i < n; i += G) {
          accumulate<Tin, VEC>(load_vec(row_vec<Tin, VEC>(ra, t, i, nq)), i < nq, sq, sk);
        }
      }
    }
    cur = wrap(cur + 1);
    if constexpr (kDet) {
      // The canonical tree inside the warp: a segment's lanes (offsets P/2 ... 1), the scaled
      // leaf, then the segments in index order (offsets P, 2P, ... within the group's warp).
#pragma unroll
      for (int off = kDetP >> 1; off > 0; off >>= 1) {
        sq += __shfl_xor_sync(kFullMask, sq, off);
        sk += __shfl_xor_sync(kFullMask, sk, off);
      }
      sq = sq * ra.q_in_scale * ra.q_in_scale;
      sk = sk * ra.k_in_scale * ra.k_in_scale;
      for (int off = kDetP; off < W; off <<= 1) {
        sq += __shfl_xor_sync(kFullMask, sq, off);
        sk += __shfl_xor_sync(kFullMask, sk, off);
      }
    } else if (W == 32) {
      // Sum over each W-lane segment of the warp (one group's, or one warp's of a wider group).
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) {
        sq += __shfl_xor_sync(kFullMask, sq, off);
        sk += __shfl_xor_sync(kFullMask, sk, off);
      }
    } else {
      for (int off = W >> 1; off > 0; off >>= 1) {
        sq += __shfl_xor_sync(kFullMask, sq, off);
        sk += __shfl_xor_sync(kFullMask, sk, off);
      }
    }
    // A group of a warp or less: every lane already holds the group's sums, no barrier is needed.
    if (!warp_or_less) {
      if (lane == 0) s_part[par][warp] = make_float2(sq, sk);
      group_barrier(g, G);
    }
    auto group_partials = [&] {
      return warp_or_less
                 ? make_float2(sq, sk)
                 : group_sum(&s_part[par][g * warps_per_group], warps_per_group, warps_pow2, lane);
    };

    float2 rs = make_float2(0.f, 0.f);
    if constexpr (kAlone) {
      // Alone, every warp sums its group's partials itself (same bits in every warp): no
      // second barrier and no warp waiting on the first one's square root.
      if (active_write) {
        const float2 p = group_partials();
        const float rq =
            inv_rms(kDet ? p.x : p.x * ra.q_in_scale * ra.q_in_scale, a.q_inv_full, a.eps);
        const float rk =
            inv_rms(kDet ? p.y : p.y * ra.k_in_scale * ra.k_in_scale, a.k_inv_full, a.eps);
        rs = make_float2(rq * ra.q_in_scale, rk * ra.k_in_scale);
        if (gt == 0 && ra.rstd_out != nullptr) {
          ra.rstd_out[2 * static_cast<int64_t>(tw)] = rq;
          ra.rstd_out[2 * static_cast<int64_t>(tw) + 1] = rk;
        }
      }
    } else {
      // Phase B, by the group's first warp (or the whole group, when narrower): publish the
      // current token, then collect the token to write (D tokens back when deferring, so usually
      // already there).
      bool ok = true;
      if (gt < 32) {
        float q = 0.f, k = 0.f;
        if (active) {
          const float2 p = group_partials();
          q = kDet ? p.x : p.x * ra.q_in_scale * ra.q_in_scale;
          k = kDet ? p.y : p.y * ra.k_in_scale * ra.k_in_scale;
          if constexpr (kLamport) {
            lamport_publish(a, ra, t, static_cast<int>(call), q, k, sl, W);
          } else {
            publish_partials(xl, token_words, t, tag, ktag, q, k);
          }
        }
        // The collect is warp-wide: the groups sharing a warp collect together, and one past
        // the last token joins without a token of its own. ok comes out warp-uniform.
        if (__any_sync(kFullMask, active_write)) {
          if constexpr (kLamport) {
            ok = lamport_collect(a, ra, tw, static_cast<int>(call), q, k, active_write, sl, W,
                                 &s_note);
          } else {
            ok = collect_partials(a, ra, xl, token_words, world_pow2, tw, tag, ktag, q, k,
                                  active_write, sl, W, &s_note);
          }
          if (ok && active_write) {
            const float rq = inv_rms(q, a.q_inv_full, a.eps);
            const float rk = inv_rms(k, a.k_inv_full, a.eps);
            rs = make_float2(rq * ra.q_in_scale, rk * ra.k_in_scale);  // in every lane
            if (sl == 0 && ra.rstd_out != nullptr) {
              ra.rstd_out[2 * static_cast<int64_t>(tw)] = rq;
              ra.rstd_out[2 * static_cast<int64_t>(tw) + 1] = rk;
            }
          }
        }
        if (!warp_or_less && lane == 0) {
          if (!ok) s_abort[g] = 1;
          s_rstd[g] = rs;
        }
      }
      if (!warp_or_less) {  // the other warps of the group take the scale from the first
        group_barrier(g, G);
        ok = s_abort[g] == 0;
        rs = s_rstd[g];
      }
      if (!ok) {  // group-uniform, and warp-uniform when groups share a warp
        poison_from = first + g + max(0, it - defer) * step;
        break;
      }
    }

    // Phase C for the written token: scale, weight, round once (Olmo2) or twice (Llama).
    if (active_write) {
      if constexpr (VPT > 0) {
        const InVec* x = stage(wstage);
        Tout* q_dst = static_cast<Tout*>(ra.q_out) + static_cast<int64_t>(tw) * ra.q_out_stride;
        Tout* k_dst = static_cast<Tout*>(ra.k_out) + static_cast<int64_t>(tw) * ra.k_out_stride;
#pragma unroll
        for (int v = 0; v < VPT; ++v) {
          if (in_row(v)) {
            const OutVec* wv;
            if constexpr (kDet) {
              wv = s_weight + det_idx(v);
            } else {
              wv = my_weight + v * G;
            }
            store_vec(reinterpret_cast<OutVec*>((is_q(v) ? q_dst : k_dst) + slot_off(v)),
                      normalize_vec<Tin, Tout, VEC, kOlmo2>(load_vec(x + slot_pos(v)), load_vec(wv),
                                                            is_q(v) ? rs.x : rs.y));
          }
        }
      } else {
        for (int i = gt; i < n; i += G) {
          write_output<Tin, Tout, VEC, kOlmo2>(ra, tw, i, nq,
                                               load_vec(row_vec<Tin, VEC>(ra, tw, i, nq)),
                                               load_vec(weight_vec<Tout, VEC>(ra, i, nq)), rs);
        }
      }
    }
  }
  if constexpr (VPT > 0) cp_async_wait<0>();  // no copy may land after the block exits
  if constexpr (!kAlone) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    // Under PDL, a kernel with peers lets the next one be scheduled only after its last collect
    // (see the top); without PDL the trigger is skipped.
    if (a.pdl) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
    if (poison_from < T) poison_rows<Tout>(a, ra, poison_from, step, T, gt, G);
    if constexpr (!kLamport) {
      if (is_scrub_call(call) && entry == kEntryRun && poison_from >= T) {
        scrub_own_slots<kSlotOrder>(a, ra, bank, first + g, step, gt, G);
      }
    }
    // The last block of this rank's kernel to finish releases the rank and advances its call
    // counter (device-resident, so CUDA-graph replays stay in step). No fence: the next launch
    // on the stream sees the new value at the kernel boundary, and within this launch every
    // block's claim returned before its barriers (its value decided the block's entry), so
    // before its increment, which the last block's stores follow (they depend on the value it
    // returns). A fence here waited for the block's output stores to drain before the increment
    // could even issue: one more memory round trip at the end of every launch. A block of a
    // second kernel neither counts nor releases.
    __syncthreads();  // every group's note and writes before thread 0 records and counts
    if (threadIdx.x == 0) {
      record_note(s_note, ra, a.world, a.capacity);
      if (entry != kEntryNotOwner && last_block_of_rank(a, ra)) {
        // The MiniMax-fused method keeps SwiftQK's call as it found it and rotates its own
        // buffer counter.
        if constexpr (kLamport) {
          ra.state->lamport_tokens = static_cast<uint32_t>(T);
          ra.state->lamport_call = (call + 1) % kLamportBuffers;
        }
        release_rank(ra, kLamport ? s_call : next_call(call));
      }
    }
  }
}

}  // namespace swiftqk::detail
