// The fused QK epilogue kernel: per token, the QK-norm of the rank's Q and K rows (layerwise with
// the plain kernel's exchange of partial sums, or per head), RoPE, and the writes of Q (to q_out,
// optionally fp8), K (to the paged cache and optionally k_out) and V (to the paged cache).
// Persistent, one token per block at a time, walked in increasing order like the plain kernel
// (so every wait is on a token some resident block publishes). Each token's Q, K and V rows and
// its cos/sin row are staged in shared memory `stages` tokens deep: the rotation reads each
// element's partner, which another thread loaded.
#pragma once

#include <cstdint>

#include "kernels/cp_async.cuh"
#include "kernels/device_types.cuh"
#include "kernels/epilogue_args.hpp"
#include "kernels/epilogue_layout.cuh"
#include "kernels/exchange.cuh"
#include "kernels/exchange_lanes.cuh"
#include "kernels/norm_vectors.cuh"
#include "kernels/rank_claim.cuh"
#include "kernels/rope_vectors.cuh"
#include "protocol.hpp"

namespace swiftqk::detail {

/// Writes NaN over Q (and k_out) of token t: a token the kernel could not finish never leaves a
/// plausible-looking output (in place, its input is lost).
template <typename T, typename QOut>
__device__ __forceinline__ void poison_token(const EpilogueArgs& a, const EpilogueRankArgs& er,
                                             int t) {
  const float nan = __int_as_float(0x7fffffff);
  QOut* q = static_cast<QOut*>(er.x.q_out) + static_cast<int64_t>(t) * er.x.q_out_stride;
  const int qw = a.q_heads * a.head_dim, kw = a.kv_heads * a.head_dim;
  QOut q_nan;
  if constexpr (std::is_same_v<QOut, __nv_fp8_e4m3>) {
    q_nan = to_e4m3(nan);
  } else {
    q_nan = from_float<QOut>(nan);
  }
  for (int i = threadIdx.x; i < qw; i += blockDim.x) q[i] = q_nan;
  if (er.x.k_out != nullptr) {
    T* k = static_cast<T*>(er.x.k_out) + static_cast<int64_t>(t) * er.x.k_out_stride;
    for (int i = threadIdx.x; i < kw; i += blockDim.x) k[i] = from_float<T>(nan);
  }
}

/// VEC is the elements per access (16 bytes of the model dtype, or 1 on the unaligned path).
/// kOlmo2 is the norm order. kAlone compiles the exchange out (TP 1 layerwise, and every headwise
/// launch).
/// kDet: the deterministic mode's canonical sums (layerwise only; a template parameter, so the
/// default kernels are unchanged). kSplit: blocks share a token (EpilogueArgs::split_log2; alone,
/// on the vector path, without kDet): a template parameter, since the ranges it works out cost
/// the unsplit launches 0.1 us at 8-64 tokens and up to 3% at 4096 (one H100). kWGlobal: the norm
/// weights are read from global memory (through L1, prefetched at entry) instead of staged in
/// shared memory, which leaves the block's shared memory to the ring (with peers, without kDet):
/// a template parameter, since choosing at run time cost every launch 0.1-0.2 us at one token and
/// up to 12% at 4096 tokens (one H100).
template <typename T, typename QOut, typename CacheT, int VEC, bool kOlmo2, bool kAlone, bool kDet,
          bool kSplit, bool kWGlobal = false>
__global__ void __launch_bounds__(kEpilogueMaxThreads, kEpilogueMinBlocks)
    qk_epilogue_kernel(const __grid_constant__ EpilogueArgs a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");  // as in swiftqk_fused_kernel
  if constexpr (kAlone) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
  extern __shared__ uint4 s_dyn[];
  __shared__ float2 s_part[2][kEpilogueMaxThreads / 32];  // per warp (q, k), by parity
  __shared__ float s_leaf[2][2][kCanonicalSegments];      // deterministic: Q's, K's, by parity
  __shared__ float2 s_rstd;
  __shared__ int s_abort;
  __shared__ uint32_t s_call;
  __shared__ int s_entry;
  __shared__ FailNote s_note;
  // Q's, K's and V's fp8 scales with their reciprocals, read a vector at a time: kept in
  // registers, they pushed kernels at the register cap into spills.
  __shared__ E4m3Scale s_e4m3[3];

  const int slot_rank = blockIdx.x / a.blocks_per_rank;
  const int lblock = blockIdx.x - slot_rank * a.blocks_per_rank;
  const EpilogueRankArgs& er = a.r[slot_rank];
  const RankArgs& ra = er.x;
  const int G = blockDim.x;
  const int tid = threadIdx.x;
  const int warp = tid >> 5, lane = tid & 31, warps = G >> 5;
  const int hd = a.head_dim, rot = a.rotary_dim, half = rot >> 1;
  const int qw = a.q_heads * hd, kw = a.kv_heads * hd;
  const int qk_units = (qw + kw) / VEC, units = (qw + 2 * kw) / VEC;
  const int ntok = static_cast<int>(a.tokens);
  const int S = a.stages;
  // Headwise launches (and so Gemma-3's 1 + w weight) exchange nothing and take no canonical
  // sums: they always run the kAlone kernel without kDet (epilogue_launch.cu), so the others
  // compile their paths out.
  const bool headwise = kAlone && !kDet && a.headwise != 0, neox = a.neox != 0;

  // With peers block 0 claims the rank and every block reads the fault word at once
  // (claim_rank_at_entry): both round trips overlap the first rows' loads. The fault word stays a
  // raw value until the barrier, as in the plain kernel.
  unsigned long long claim_seen = 0;
  uint64_t fault_seen = 0;
  if (!kAlone && tid == 0) {
    s_note.code = 0u;
    if (lblock == 0) claim_seen = atomicOr(claim_word(ra.state), claim_of(0u, grid_owner_id()));
    fault_seen = load_volatile64(fault_word(ra.local_ws, a.world, a.capacity));
  }
  // kSplit: 2^split_log2 blocks share each token (epilogue_token_split; alone and out of place,
  // so no part overwrites a row another still stages): part `part` writes its share of the
  // token's V vectors and rotation items, and each one sums the whole row's squares in the same
  // order, so the outputs keep their bits. Otherwise a block is a token's.
  static_assert(!kSplit || (kAlone && !kDet && VEC > 1), "a split token is alone and vectored");
  const int split_log2 = kSplit ? a.split_log2 : 0;
  const int part = lblock & ((1 << split_log2) - 1);
  const int step = a.blocks_per_rank >> split_log2;
  const int first = lblock >> split_log2;
  // This part's V vectors, [qk_units + v_lo, v_end) of the staged row (unsplit, all of them):
  // every part stages the whole Q and K rows and only its own V.
  const int v_units = kw / VEC;
  const int v_lo = kSplit ? (part * v_units) >> split_log2 : 0;
  const int v_end = kSplit ? qk_units + (((part + 1) * v_units) >> split_log2) : units;
  const int iterations = first < ntok ? (ntok - first + step - 1) / step : 0;
  uint8_t* const peer_ws = !kAlone && lane < a.world && warp == 0 ? ra.peers[lane] : nullptr;
  int world_pow2 = 1;
  while (world_pow2 < a.world) world_pow2 <<= 1;

  const EpilogueStageLayout L =
      epilogue_stage_layout(qw + 2 * kw, sizeof(T), rot, a.cs_f32 ? 4 : sizeof(T));
  uint8_t* const ring = reinterpret_cast<uint8_t*>(s_dyn);
  T* const s_weight = reinterpret_cast<T*>(ring + static_cast<std::size_t>(S) * L.bytes());
  static_assert(!kWGlobal || (!kAlone && !kDet), "global weights: with peers, not deterministic");
  const int weight_elems = kWGlobal ? 0 : headwise ? 2 * hd : qw + kw;
  float* const s_head =
      reinterpret_cast<float*>(reinterpret_cast<uint8_t*>(s_weight) +
                               pad16(static_cast<std::size_t>(weight_elems) * sizeof(T)));
  const uint32_t ring_s = static_cast<uint32_t>(__cvta_generic_to_shared(ring));
  auto stage_row = [&](int s) { return reinterpret_cast<T*>(ring + s * L.bytes()); };
  auto stage_meta = [&](int s) {
    return reinterpret_cast<int64_t*>(ring + s * L.bytes() + L.meta_offset());
  };

  // The weights, once per block (every token uses them), in the oldest copy group.
  {
    const T* qwp = static_cast<const T*>(ra.q_w);
    const T* kwp = static_cast<const T*>(ra.k_w);
    const int half_w = headwise ? hd : qw;  // where K's weights start
    if constexpr (VEC > 1) {
      const uint32_t w_s = static_cast<uint32_t>(__cvta_generic_to_shared(s_weight));
      for (int u = tid; u < weight_elems / VEC; u += G) {
        const int e = u * VEC;
        cp_async_bytes(w_s + static_cast<uint32_t>(e * sizeof(T)),
                       e < half_w ? qwp + e : kwp + (e - half_w), 16);
      }
      cp_async_commit();
    } else {
      for (int e = tid; e < weight_elems; e += G) {
        s_weight[e] = e < half_w ? qwp[e] : kwp[e - half_w];
      }
    }
    if constexpr (kWGlobal) {
      // Every 128-byte line of the rank's weights into this SM's L1 while the first rows load.
      auto prefetch = [&](const T* w, int elems) {
        const uint8_t* b = reinterpret_cast<const uint8_t*>(w);
        const uint8_t* end = b + static_cast<std::size_t>(elems) * sizeof(T);
        for (const uint8_t* l = b + tid * 128; l < end + 127; l += G * 128) {
          asm volatile("prefetch.global.L1 [%0];" ::"l"(l < end ? l : end - 1));
        }
      };
      prefetch(qwp, qw);
      prefetch(kwp, kw);
    }
  }

  // Loads token tn's rows, position, slot and cos/sin row into stage s. The cos/sin row needs the
  // position first: warp 0 keeps the position of the next token it stages in pos_next, loaded
  // one staging ahead, so the copy rarely waits for it. A position outside [0, max_position) is
  // never used as an index (the token is caught when it is processed).
  int tk_next = first;
  int64_t pos_next = 0;
  if (warp == 0 && tk_next < ntok) pos_next = __ldg(er.positions + tk_next);
  auto issue = [&](int s) {
    const int tn = tk_next;
    if (tn < ntok) {
      const T* qr = static_cast<const T*>(ra.q_in) + static_cast<int64_t>(tn) * ra.q_in_stride;
      const T* kr = static_cast<const T*>(ra.k_in) + static_cast<int64_t>(tn) * ra.k_in_stride;
      const T* vr = static_cast<const T*>(er.v_in) + static_cast<int64_t>(tn) * er.v_stride;
      T* row = stage_row(s);
      const uint32_t row_s = ring_s + static_cast<uint32_t>(s * L.bytes());
      for (int u = tid; u < v_end - v_lo; u += G) {
        const int e = (kSplit && u >= qk_units ? u + v_lo : u) * VEC;  // all Q and K, part's V
        const T* src = e < qw ? qr + e : (e < qw + kw ? kr + (e - qw) : vr + (e - qw - kw));
        if constexpr (VEC > 1) {
          cp_async_bytes(row_s + static_cast<uint32_t>(e * sizeof(T)), src, 16);
        } else {
          row[e] = *src;
        }
      }
      if (warp == 0) {
        const int64_t pos = pos_next;
        if (tn + step < ntok) pos_next = __ldg(er.positions + tn + step);
        const uint32_t meta_s = row_s + static_cast<uint32_t>(L.meta_offset());
        if (lane == 0) {
          cp_async_bytes(meta_s, er.positions + tn, 8);
          cp_async_bytes(meta_s + 8, er.slots + tn, 8);
        }
        if (pos >= 0 && pos < a.max_position) {
          const int esz = a.cs_f32 ? 4 : static_cast<int>(sizeof(T));
          const uint8_t* cs =
              static_cast<const uint8_t*>(er.cos_sin) + pos * static_cast<int64_t>(rot) * esz;
          const int unit = a.cs_copy_bytes;
          const uint32_t cs_s = row_s + static_cast<uint32_t>(L.row_bytes);
          for (int b = lane * unit; b < rot * esz; b += 32 * unit) {
            if (unit >= 4) {
              cp_async_bytes(cs_s + b, cs + b, unit);
            } else {
              *reinterpret_cast<uint16_t*>(ring + s * L.bytes() + L.row_bytes + b) =
                  *reinterpret_cast<const uint16_t*>(cs + b);
            }
          }
        }
      }
    }
    cp_async_commit();  // empty groups keep the count uniform
    tk_next += step;
  };
  // With peers, iteration `it` reduces and publishes token it of the block's sequence and collects
  // and writes token it - D (D = a.defer), so a token's exchange overlaps the next D tokens'
  // loads and reductions, as in the plain kernel; D stages hold the tokens awaiting their
  // write, `ahead` the ones loading. Alone, nothing waits: D = 0.
  const int defer = kAlone ? 0 : max(0, min(a.defer, iterations - 1));
  const int ahead = S - 1 - defer;
  for (int s = 0; s < ahead; ++s) issue(s);

  int entry = kEntryRun;
  // Bank 0's slots before the barrier; after it only the bank's offset is added.
  const ExchangeLane xl0 =
      kAlone ? ExchangeLane{} : exchange_lane<SlotLayout::kTokenMajor>(a, ra, 0, lane, peer_ws);
  if constexpr (!kAlone) {
    if (tid == 0) {
      s_entry =
          claim_rank_at_entry(a, ra, lblock, claim_seen, fault_seen != 0ull, &s_note, &s_call);
    }
  }
  __syncthreads();
  uint32_t call = 0;
  if constexpr (!kAlone) {
    entry = s_entry;
    call = s_call;
  }
  const uint32_t tag = tag_for_call(call);
  const uint32_t ktag = tag ^ a.config_hash;
  const int bank = bank_for_call(call);
  const ExchangeLane xl = bank_lane(a, xl0, bank);
  const int token_words = slot_token_words<SlotLayout::kTokenMajor>(a);

  // The fp8 scales are read once, after griddepcontrol.wait (a graph may update them between
  // replays); the token loop's first barrier publishes them.
  if (tid < 3) {
    const bool q8 = std::is_same_v<QOut, __nv_fp8_e4m3>, c8 = std::is_same_v<CacheT, __nv_fp8_e4m3>;
    const float* src = tid == 0 ? (q8 ? er.q_scale : nullptr)
                                : (c8 ? (tid == 1 ? er.k_scale : er.v_scale) : nullptr);
    s_e4m3[tid] = e4m3_scale(src != nullptr ? *src : 1.f);
  }
  const E4m3Scale& q_scale = s_e4m3[0];
  const E4m3Scale& k_scale = s_e4m3[1];
  const E4m3Scale& v_scale = s_e4m3[2];

  int poison_from = entry == kEntryRun ? ntok : first;
  const int last = entry == kEntryRun ? iterations + defer : 0;
  int cur = 0;
  for (int it = 0; it < last; ++it) {
    const int t = first + it * step;  // the token reduced and published
    const int tw = t - defer * step;  // the token collected and written
    const bool active = it < iterations;
    const bool active_write = it >= defer;
    const int wstage = cur - defer < 0 ? cur - defer + S : cur - defer;
    // Stage cur holds token t once this thread's copies are in (at most ahead - 1 younger groups
    // pending) and, after the barrier, everyone's; the barrier also means every thread is done
    // with the stage the last iteration wrote from, which the next copies refill.
    cp_async_wait_pending(ahead - 1);
    __syncthreads();
    issue(cur + ahead >= S ? cur + ahead - S : cur + ahead);
    const T* row = stage_row(cur);
    const int par = it & 1;

    // Phase A: sums of squares of the Q and K units (per head, or per row and partial); thread 0
    // turns the token's slot into its cache offset, once.
    if (active && tid == 0) {
      int64_t* meta = stage_meta(cur);
      const int64_t pos = meta[0], slot = meta[1];
      int64_t off = -1;
      if (pos >= 0 && pos < a.max_position && slot >= 0 && slot < a.cache_slots) {
        const int64_t b = slot / a.block_size;
        off = b * a.block_stride + (slot - b * a.block_size) * a.slot_stride;
      }
      meta[2] = off;
    }
    if (active) {
      if (headwise) {
        // Each head's sum in a fixed order (the same bits for every launch shape), by one
        // thread per head.
        for (int h = tid; h < a.q_heads + a.kv_heads; h += G) {
          float s = 0.f;
          const T* x = row + h * hd;
          for (int d = 0; d < hd; d += VEC) {
            float f[VEC];
            load_floats<T, VEC>(x + d, f);
#pragma unroll
            for (int e = 0; e < VEC; ++e) s = fmaf(f[e], f[e], s);
          }
          s_head[h] = rsqrtf(s * (1.f / static_cast<float>(hd)) + a.eps);
        }
      } else if constexpr (kDet) {
        // The canonical order (docs/design.md, "Deterministic mode"), whatever the TP degree and
        // block: a warp a segment, lane j adding the sums of its 16-byte vectors j, j + 32, ...
        // in order, then the lanes' xor butterfly; the leaves meet after the barrier.
        constexpr int kDV = 16 / static_cast<int>(sizeof(T));
        const int nseg = a.det_segments;
        for (int sg = warp; sg < 2 * nseg; sg += warps) {
          const bool is_q = sg < nseg;
          const int idx = is_q ? sg : sg - nseg;
          const int nv = is_q ? a.det_q_vecs : a.det_k_vecs;
          const Vec<T, kDV>* seg =
              reinterpret_cast<const Vec<T, kDV>*>(row + (is_q ? 0 : qw) + idx * nv * kDV);
          float acc = 0.f;
          for (int v = lane; v < nv; v += 32) acc += vector_sum_sq<T, kDV>(load_vec(seg + v));
#pragma unroll
          for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(kFullMask, acc, off);
          if (lane == 0) s_leaf[par][is_q ? 0 : 1][idx] = acc;
        }
      } else {
        float sq = 0.f, sk = 0.f;
        for (int u = tid; u < qk_units; u += G) {
          float f[VEC];
          load_floats<T, VEC>(row + u * VEC, f);
          float s = 0.f;
#pragma unroll
          for (int e = 0; e < VEC; ++e) s = fmaf(f[e], f[e], s);
          if (u * VEC < qw) {
            sq += s;
          } else {
            sk += s;
          }
        }
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) {
          sq += __shfl_xor_sync(kFullMask, sq, off);
          sk += __shfl_xor_sync(kFullMask, sk, off);
        }
        if (lane == 0) s_part[par][warp] = make_float2(sq, sk);
      }
    }
    __syncthreads();

    // Phase B: with peers, warp 0 publishes token t's partials; every thread writes token t's V
    // into the cache (it does not depend on the exchange); then warp 0 collects token tw.
    // The rank's (q, k) partials, the same bits in every thread. A whole warp calls it.
    auto block_partials = [&] {
      if constexpr (kDet) {
        // The rank's subtree of its leaves in index order: a pairwise tree (xor offsets 1, 2,
        // ...), whose upper levels are the exchange's butterfly over the ranks.
        const int nseg = a.det_segments;
        float q = lane < nseg ? s_leaf[par][0][lane] : 0.f;
        float k = lane < nseg ? s_leaf[par][1][lane] : 0.f;
        for (int off = 1; off < nseg; off <<= 1) {
          q += __shfl_xor_sync(kFullMask, q, off);
          k += __shfl_xor_sync(kFullMask, k, off);
        }
        return make_float2(__shfl_sync(kFullMask, q, 0), __shfl_sync(kFullMask, k, 0));
      }
      float2 p = make_float2(0.f, 0.f);
      for (int w = 0; w < warps; ++w) {  // the same order in every thread: the same bits
        p.x += s_part[par][w].x;
        p.y += s_part[par][w].y;
      }
      return p;
    };
    if (active) {
      if (!headwise && !kAlone && warp == 0) {
        const float2 p = block_partials();
        publish_partials(xl, token_words, t, tag, ktag, p.x, p.y);
      }
      const int64_t off = stage_meta(cur)[2];
      if (off >= 0) {
        CacheT* vc = static_cast<CacheT*>(er.v_cache) + off;
        // Not unrolled: unrolled, the loop kept several vectors in flight and pushed kernels at
        // the register cap into spills.
#pragma unroll 1
        for (int u = qk_units + v_lo + tid; u < v_end; u += G) {
          const int e = u * VEC - qw - kw;
          const int h = div_by(e, a.hd_magic), d = e - h * hd;
          if constexpr (std::is_same_v<CacheT, T>) {
            // A cache of the model dtype takes V as it is: no conversion to fp32 and back (the
            // same values; a NaN keeps its payload).
            copy_vec(reinterpret_cast<Vec<T, VEC>*>(vc + h * a.head_stride + d),
                     reinterpret_cast<const Vec<T, VEC>*>(row + u * VEC));
          } else {
            float f[VEC];
            load_floats<T, VEC>(row + u * VEC, f);
            store_floats<CacheT, VEC>(vc + h * a.head_stride + d, f, v_scale);
          }
        }
      }
    }
    float2 rs = make_float2(0.f, 0.f);
    if (active_write && !headwise) {
      if constexpr (kAlone) {
        const float2 p = block_partials();
        rs = make_float2(inv_rms(p.x, a.q_inv_full, a.eps), inv_rms(p.y, a.k_inv_full, a.eps));
      } else {
        if (warp == 0) {
          float q = 0.f, k = 0.f;
          const bool ok = collect_partials(a, ra, xl, token_words, world_pow2, tw, tag, ktag, q, k,
                                           true, lane, 32, &s_note);
          if (lane == 0) {
            s_abort = ok ? 0 : 1;
            s_rstd = make_float2(inv_rms(q, a.q_inv_full, a.eps), inv_rms(k, a.k_inv_full, a.eps));
          }
        }
        __syncthreads();
        rs = s_rstd;
        if (s_abort != 0) {
          poison_from = tw;
          break;
        }
      }
    }
    cur = cur + 1 == S ? 0 : cur + 1;
    if (!active_write) continue;
    const T* wrow = stage_row(wstage);
    const int64_t pos = stage_meta(wstage)[0];
    const int64_t slot = stage_meta(wstage)[1];
    const bool bad_pos = pos < 0 || pos >= a.max_position;
    const bool bad_slot = slot < -1 || slot >= a.cache_slots;
    const bool write_cache = !bad_pos && !bad_slot && slot >= 0;

    // Phase C: norm, rotation, stores. The work items of a head: a NeoX pair of vectors
    // (d, d + rotary_dim / 2), or on the element path a GPT-J pair (2i, 2i + 1), each rotated by
    // the thread that loads both; then the vectors after the rotary part, and on the vector path
    // every GPT-J vector (its pairs inside it).
    if (bad_pos || bad_slot) {
      if (part == 0) {  // the token's other parts write nothing of it
        if (tid == 0) {
          record_local_failure(ra, bad_pos ? kFailBadPosition : kFailBadSlot, a.first_token + tw,
                               bad_pos ? pos : slot, bad_pos ? a.max_position : a.cache_slots);
        }
        poison_token<T, QOut>(a, er, tw);
      }
    } else {
      const uint8_t* cs = reinterpret_cast<const uint8_t*>(wrow) + L.row_bytes;
      CacheT* kc = static_cast<CacheT*>(er.k_cache) + (write_cache ? stage_meta(wstage)[2] : 0);
      QOut* qo = static_cast<QOut*>(ra.q_out) + static_cast<int64_t>(tw) * ra.q_out_stride;
      T* ko = ra.k_out == nullptr
                  ? nullptr
                  : static_cast<T*>(ra.k_out) + static_cast<int64_t>(tw) * ra.k_out_stride;
      const int pair_items = neox ? half / VEC : (VEC == 1 ? half : 0);
      const int pd = neox ? half : 1;  // the second vector of a pair item
      const int single_from = pair_items > 0 ? rot : 0;
      const int single_items = (hd - single_from) / VEC;
      const int heads = a.q_heads + a.kv_heads;
      // Item j of head hh: a pair (j < pair_items) or a single vector.
      auto process = [&](int hh, int j, auto pair_tag) {
        constexpr bool kPair = decltype(pair_tag)::value;
        const bool is_q = hh < a.q_heads;
        const int h = is_q ? hh : hh - a.q_heads;
        const T* x_head = wrow + (is_q ? 0 : qw) + h * hd;
        const T* w_head;
        if constexpr (kWGlobal) {
          w_head = static_cast<const T*>(is_q ? ra.q_w : ra.k_w) + h * hd;
        } else {
          w_head = headwise ? s_weight + (is_q ? 0 : hd) : s_weight + (is_q ? 0 : qw) + h * hd;
        }
        const float r = headwise ? s_head[hh] : (is_q ? rs.x : rs.y);
        auto store = [&](int d, const float(&y)[VEC]) {
          if (is_q) {
            store_floats<QOut, VEC>(qo + h * hd + d, y, q_scale);
          } else {
            if (write_cache) store_floats<CacheT, VEC>(kc + h * a.head_stride + d, y, k_scale);
            if (ko != nullptr) store_floats<T, VEC>(ko + h * hd + d, y, E4m3Scale{1.f, 1.f});
          }
        };
        if constexpr (kPair) {
          const int d0 = neox ? j * VEC : 2 * j;
          float u[VEC], v[VEC], c[VEC], sn[VEC];
          normalized<T, VEC, kOlmo2>(x_head + d0, w_head + d0, r, kAlone ? a.weight_plus_one : 0,
                                     u);
          normalized<T, VEC, kOlmo2>(x_head + d0 + pd, w_head + d0 + pd, r,
                                     kAlone ? a.weight_plus_one : 0, v);
          cos_sin<T, VEC>(cs, a.cs_f32, neox ? d0 : j, half, c, sn);
#pragma unroll
          for (int e = 0; e < VEC; ++e) {
            const float lo = u[e] * c[e] - v[e] * sn[e], hi = v[e] * c[e] + u[e] * sn[e];
            u[e] = kOlmo2 ? lo * r : lo;  // the scale last: rope(r v) = r rope(v)
            v[e] = kOlmo2 ? hi * r : hi;
          }
          store(d0, u);
          store(d0 + pd, v);
        } else {
          const int d0 = single_from + j * VEC;
          float u[VEC];
          normalized<T, VEC, kOlmo2>(x_head + d0, w_head + d0, r, kAlone ? a.weight_plus_one : 0,
                                     u);
          if constexpr (VEC > 1) {
            if (!neox && d0 < rot) {  // GPT-J pairs inside the vector
              float c[VEC], sn[VEC];
              cos_sin<T, VEC>(cs, a.cs_f32, d0 >> 1, half, c, sn, true);
#pragma unroll
              for (int e = 0; e < VEC; e += 2) {
                const float lo = u[e] * c[e] - u[e + 1] * sn[e];
                const float hi = u[e + 1] * c[e] + u[e] * sn[e];
                u[e] = lo;
                u[e + 1] = hi;
              }
            }
          }
          if constexpr (kOlmo2) {
#pragma unroll
            for (int e = 0; e < VEC; ++e) u[e] *= r;
          }
          store(d0, u);
        }
      };
      // The pairs of every head, then the single vectors of every head: a warp's lanes take
      // items of one kind, so they do not split between the rotated and the unrotated path
      // (with partial rotary, one loop over each head's pairs and singles did). The second
      // loop goes on from the thread after the first loop's last item. A split token's part
      // takes the items [item_bound(part), item_bound(part + 1)) of that order; each loop works
      // out its range where it starts (the singles' range, held across the pairs' loop, spilled).
      const int pair_total = heads * pair_items;
      auto item_bound = [&](int k) {  // the first item of part k
        return (k * (pair_total + heads * single_items)) >> split_log2;
      };
      const bool split = kSplit && split_log2 != 0;
      const int p_hi = split ? min(item_bound(part + 1), pair_total) : pair_total;
      for (int item = (split ? min(item_bound(part), pair_total) : 0) + tid; item < p_hi;
           item += G) {
        const int hh = div_by(item, a.pair_magic);
        process(hh, item - hh * pair_items, std::true_type{});
      }
      int s_lo = 0, s_hi = heads * single_items, shift = a.single_shift;
      if (split) {
        const int lo = item_bound(part), hi = item_bound(part + 1);
        s_lo = max(lo, pair_total) - pair_total;
        s_hi = max(hi, pair_total) - pair_total;
        shift = (min(hi, pair_total) - min(lo, pair_total)) % G;
      }
      int item2 = tid - shift;
      if (item2 < 0) item2 += G;
      for (item2 += s_lo; item2 < s_hi; item2 += G) {
        const int hh = div_by(item2, a.single_magic);
        process(hh, item2 - hh * single_items, std::false_type{});
      }
    }
  }
  cp_async_wait<0>();  // no copy may land after the block exits
  if constexpr (!kAlone) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (a.pdl) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
    for (int t = poison_from; t < ntok; t += step) poison_token<T, QOut>(a, er, t);
    if (is_scrub_call(call) && entry == kEntryRun && poison_from >= ntok) {
      scrub_own_slots<SlotLayout::kTokenMajor>(a, ra, bank, first, step, tid, G);
    }
    __syncthreads();
    if (tid == 0) {
      record_note(s_note, ra, a.world, a.capacity);
      if (entry != kEntryNotOwner && last_block_of_rank(a, ra)) release_rank(ra, next_call(call));
    }
  }
}

}  // namespace swiftqk::detail
