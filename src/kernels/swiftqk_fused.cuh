// The SwiftQK fused kernel: per token and rank, (A) local sums of squares of the Q and K shard
// rows, (B) the rank's two partials pushed into every peer's slot while the weights load, then
// a bounded wait for all peers' partials, summed in the same tree on every rank, and (C) the
// scaled output.
// Persistent: the grid is bounded by residency (plan_grid), each block walks tokens in
// increasing order, so every wait is on a token some resident block will publish.
#pragma once

#include <cstdint>

#include "kernels/cp_async.cuh"
#include "kernels/deterministic_sums.cuh"
#include "kernels/device_types.cuh"
#include "kernels/exchange.cuh"
#include "kernels/exchange_lanes.cuh"
#include "kernels/lamport_exchange.cuh"
#include "kernels/launch_args.hpp"
#include "kernels/norm_vectors.cuh"
#include "kernels/rank_claim.cuh"
#include "protocol.hpp"

namespace swiftqk::detail {

/// Register caps of the staged kernel. Alone, 48 (no spills) lets 5 blocks of 256 threads share an
/// SM instead of 4; with peers the exchange needs 64 (at 48 it spills and is slower at 4096
/// tokens; CHANGELOG.md, "Tried and dropped"). Eight vectors a thread spill under 48. The
/// deterministic layouts (det_lanes canonical lanes a thread) spill under those caps: alone they
/// take 56, and with peers 72 when a thread holds several lanes; one-lane layouts (a warp a
/// segment, OLMo2-13B's) keep 64 with peers, where 72 left fewer of their 256-thread blocks an SM
/// and was slower than the spill (CHANGELOG.md). Eight vectors a thread in the deterministic mode
/// spilled 56-112 bytes a thread at 64, alone and with peers; ptxas needs 95 for none.
constexpr int kAloneMaxRegs = 48;
constexpr int kMaxRegs = 64;
constexpr int kDetAloneMaxRegs = 56;
constexpr int kDetLanesMaxRegs = 72;
constexpr int kDetEightMaxRegs = 96;
constexpr int max_regs(bool alone, int vpt, int det_lanes) {
  if (det_lanes > 0 && vpt == 8) return kDetEightMaxRegs;
  if (det_lanes > 0 && vpt > 0 && vpt < 8) {
    if (alone) return kDetAloneMaxRegs;
    return det_lanes > 1 ? kDetLanesMaxRegs : kMaxRegs;
  }
  return alone && vpt > 0 && vpt < 8 ? kAloneMaxRegs : kMaxRegs;
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
  // Streamed rows (VPT == 0): vectors a thread loads before it uses the first (phase A; phase C
  // loads weights too), so that several loads are in flight.
  // Alone only, and not for fp8 inputs (whose outputs are twice their bytes): elsewhere the
  // batch does not fit the register caps (ptxas spilled 32-560 bytes). Not on the scalar path
  // (VEC 1), where the batch made bf16 rows 3.6-8.5% slower on one H200.
  constexpr bool kBatchFits = kAlone && sizeof(Tout) <= sizeof(Tin) && VEC > 1;
  constexpr int kStreamBatch = kBatchFits ? (sizeof(InVec) >= 8 ? 4 : 8) : 1;
  constexpr int kStreamBatchC = kBatchFits ? (sizeof(InVec) >= 8 ? 2 : 4) : 1;
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
        // kStreamBatch vectors a thread in flight: their loads first, then their sums in the
        // order of i (the bits of one at a time).
        for (int i0 = gt; i0 < n; i0 += kStreamBatch * G) {
          InVec x[kStreamBatch];
#pragma unroll
          for (int u = 0; u < kStreamBatch; ++u) {
            const int i = i0 + u * G;
            if (i < n) x[u] = load_vec(row_vec<Tin, VEC>(ra, t, i, nq));
          }
#pragma unroll
          for (int u = 0; u < kStreamBatch; ++u) {
            const int i = i0 + u * G;
            if (i < n) accumulate<Tin, VEC>(x[u], i < nq, sq, sk);
          }
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
        // As in phase A: the batch's loads, then its stores (each thread writes only the
        // vectors it read, so in place is safe).
        for (int i0 = gt; i0 < n; i0 += kStreamBatchC * G) {
          InVec x[kStreamBatchC];
          OutVec w[kStreamBatchC];
#pragma unroll
          for (int u = 0; u < kStreamBatchC; ++u) {
            const int i = i0 + u * G;
            if (i < n) {
              x[u] = load_vec(row_vec<Tin, VEC>(ra, tw, i, nq));
              w[u] = load_vec(weight_vec<Tout, VEC>(ra, i, nq));
            }
          }
#pragma unroll
          for (int u = 0; u < kStreamBatchC; ++u) {
            const int i = i0 + u * G;
            if (i < n) write_output<Tin, Tout, VEC, kOlmo2>(ra, tw, i, nq, x[u], w[u], rs);
          }
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
