// The fused QK epilogue kernel: per token, the QK-norm of the rank's Q and K rows (layerwise with
// the plain kernel's exchange of partial sums, or per head), RoPE, and the writes of Q (to q_out,
// optionally fp8), K (to the paged cache and optionally k_out) and V (to the paged cache).
// Persistent, one token per block at a time, walked in increasing order like the plain kernel
// (so every wait is on a token some resident block publishes). Each token's Q, K and V rows and
// its cos/sin row are staged in shared memory `stages` tokens deep: the rotation reads each
// element's partner, which another thread loaded.
#pragma once

#include <cstdint>

#include "kernels/epilogue_args.hpp"
#include "kernels/swiftqk_fused.cuh"

namespace swiftqk::detail {

constexpr int kEpilogueMaxThreads = 512;
constexpr int kEpilogueMaxStages = 4;

/// What the host and the kernel agree on about one stage of the ring: the Q|K|V row, the cos/sin
/// row and the token's position and slot, each part 16-byte aligned.
struct EpilogueStageLayout {
  std::size_t row_bytes;  // (q + 2 kv heads) x head_dim elements of the model dtype, padded
  std::size_t cs_bytes;   // rotary_dim elements of the cos/sin cache's dtype, padded
  __host__ __device__ constexpr std::size_t meta_offset() const { return row_bytes + cs_bytes; }
  __host__ __device__ constexpr std::size_t bytes() const { return row_bytes + cs_bytes + 16; }
};
__host__ __device__ constexpr std::size_t pad16(std::size_t b) { return (b + 15) / 16 * 16; }
__host__ __device__ constexpr EpilogueStageLayout epilogue_stage_layout(int64_t row_elems,
                                                                        std::size_t elem_bytes,
                                                                        int64_t rotary_dim,
                                                                        std::size_t cs_elem_bytes) {
  return {pad16(static_cast<std::size_t>(row_elems) * elem_bytes),
          pad16(static_cast<std::size_t>(rotary_dim) * cs_elem_bytes)};
}
/// Dynamic shared memory of a launch: the stages, then the weights (layerwise: the rank's Q and
/// K slices; headwise: head_dim of each), then one float per Q and K head (headwise sums).
constexpr std::size_t epilogue_smem_bytes(const EpilogueStageLayout& l, int stages,
                                          int64_t weight_elems, std::size_t elem_bytes,
                                          int64_t heads) {
  return static_cast<std::size_t>(stages) * l.bytes() +
         pad16(static_cast<std::size_t>(weight_elems) * elem_bytes) +
         static_cast<std::size_t>(heads) * sizeof(float);
}

__device__ __forceinline__ void cp_async_bytes(uint32_t s, const void* g, int bytes) {
  if (bytes == 16) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(g) : "memory");
  } else if (bytes == 8) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"(s), "l"(g) : "memory");
  } else {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(s), "l"(g) : "memory");
  }
}

/// fp8 e4m3 of value / scale (a correctly rounded division, as vLLM's scaled conversion),
/// saturated to +-448; NaN stays NaN.
__device__ __forceinline__ __nv_fp8_e4m3 to_e4m3(float v, float scale) {
  __nv_fp8_e4m3 r;
  r.__x = __nv_cvt_float_to_fp8(__fdiv_rn(v, scale), __NV_SATFINITE, __NV_E4M3);
  return r;
}

/// v as an element of D: rounded to the model dtype, or quantised with `scale` to fp8.
template <typename D>
__device__ __forceinline__ D store_as(float v, float scale) {
  if constexpr (std::is_same_v<D, __nv_fp8_e4m3>) {
    return to_e4m3(v, scale);
  } else {
    return from_float<D>(v);
  }
}

/// Stores VEC floats as VEC elements of D (one access: 16 bytes of a 2-byte type, 8 of fp8).
template <typename D, int VEC>
__device__ __forceinline__ void store_floats(D* dst, const float (&y)[VEC], float scale) {
  Vec<D, VEC> o;
#pragma unroll
  for (int e = 0; e < VEC; ++e) o.v[e] = store_as<D>(y[e], scale);
  store_vec(reinterpret_cast<Vec<D, VEC>*>(dst), o);
}

/// Records bad data a token carried (first failure of the rank wins) in device memory and in the
/// host-mapped mirror. Unlike a failed wait it marks no fault word: the group stays healthy, and
/// every rank, holding the same positions and slots, finds and records the same.
__device__ inline void record_bad_data(const RankArgs& ra, uint32_t code, int64_t token,
                                       int64_t value, int64_t limit) {
  if (atomicCAS(&ra.failure->code, 0u, code) != 0u) return;
  ra.failure->rank = ra.rank;
  ra.failure->peer = -1;
  ra.failure->token = token;
  ra.failure->value = value;
  ra.failure->limit = limit;
  volatile FailureRecord* h = ra.host_failure;
  h->rank = ra.rank;
  h->peer = -1;
  h->token = token;
  h->expected_tag = 0u;
  h->seen_tag = 0u;
  h->value = value;
  h->limit = limit;
  __threadfence_system();  // details before the code the host polls
  h->code = code;
  __threadfence_system();
}

/// Writes NaN over Q (and k_out) of token t: a token the kernel could not finish never leaves a
/// plausible-looking output (in place, its input is lost).
template <typename T, typename QOut>
__device__ __forceinline__ void poison_token(const EpilogueArgs& a, const EpilogueRankArgs& er,
                                             int t) {
  const float nan = __int_as_float(0x7fffffff);
  QOut* q = static_cast<QOut*>(er.x.q_out) + static_cast<int64_t>(t) * er.x.q_out_stride;
  const int qw = a.q_heads * a.head_dim, kw = a.kv_heads * a.head_dim;
  for (int i = threadIdx.x; i < qw; i += blockDim.x) q[i] = store_as<QOut>(nan, 1.f);
  if (er.x.k_out != nullptr) {
    T* k = static_cast<T*>(er.x.k_out) + static_cast<int64_t>(t) * er.x.k_out_stride;
    for (int i = threadIdx.x; i < kw; i += blockDim.x) k[i] = from_float<T>(nan);
  }
}

/// The normalised value of element x with weight w (rs: the row's or head's 1/rms): in the Olmo2
/// order the fp32 product x * w, to which rs is applied after the rotation (rope is linear); in
/// the Llama order round(round(x * rs) * w), rotated as is.
template <typename T>
__device__ __forceinline__ float pre_rotation(float x, float w, float rs, bool olmo2) {
  return olmo2 ? x * w : round_through<T>(round_through<T>(x * rs) * w);
}

template <typename T, int VEC>
__device__ __forceinline__ void load_floats(const T* p, float (&f)[VEC]) {
  vec_to_floats(load_vec(reinterpret_cast<const Vec<T, VEC>*>(p)), f);
}

/// VEC is the elements per access (16 bytes of the model dtype, or 1 on the unaligned path).
/// kAlone compiles the exchange out (TP 1 layerwise, and every headwise launch).
template <typename T, typename QOut, typename CacheT, int VEC, bool kAlone>
__global__ void __launch_bounds__(kEpilogueMaxThreads)
    qk_epilogue_kernel(const __grid_constant__ EpilogueArgs a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");  // as in swiftqk_fused_kernel
  if constexpr (kAlone) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
  extern __shared__ uint4 s_dyn[];
  __shared__ float2 s_part[2][kEpilogueMaxThreads / 32];  // per warp (q, k), by parity
  __shared__ float2 s_rstd;
  __shared__ int s_abort;
  __shared__ uint32_t s_call;
  __shared__ int s_entry;
  __shared__ FailNote s_note;

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
  const bool olmo2 = a.olmo2 != 0, headwise = a.headwise != 0, neox = a.neox != 0;

  unsigned long long claim_seen = 0;
  if (!kAlone && tid == 0) {
    s_note.code = 0u;
    if (lblock == 0) claim_seen = atomicOr(claim_word(ra.state), claim_of(0u, grid_owner_id()));
  }
  const int step = a.blocks_per_rank;
  const int first = lblock;
  const int iterations = first < ntok ? (ntok - first + step - 1) / step : 0;
  uint8_t* const peer_ws = !kAlone && lane < a.world && warp == 0 ? ra.peers[lane] : nullptr;
  int world_pow2 = 1;
  while (world_pow2 < a.world) world_pow2 <<= 1;

  const EpilogueStageLayout L =
      epilogue_stage_layout(qw + 2 * kw, sizeof(T), rot, a.cs_f32 ? 4 : sizeof(T));
  uint8_t* const ring = reinterpret_cast<uint8_t*>(s_dyn);
  T* const s_weight = reinterpret_cast<T*>(ring + static_cast<std::size_t>(S) * L.bytes());
  const int weight_elems = headwise ? 2 * hd : qw + kw;
  float* const s_head = reinterpret_cast<float*>(reinterpret_cast<uint8_t*>(s_weight) +
                                                 pad16(static_cast<std::size_t>(weight_elems) *
                                                       sizeof(T)));
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
      asm volatile("cp.async.commit_group;");
    } else {
      for (int e = tid; e < weight_elems; e += G) {
        s_weight[e] = e < half_w ? qwp[e] : kwp[e - half_w];
      }
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
      for (int u = tid; u < units; u += G) {
        const int e = u * VEC;
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
    asm volatile("cp.async.commit_group;");  // empty groups keep the count uniform
    tk_next += step;
  };
  const int ahead = S - 1;
  for (int s = 0; s < ahead; ++s) issue(s);

  int entry = kEntryRun;
  if constexpr (!kAlone) {
    if (tid == 0) {
      s_entry = claim_rank_at_entry(a, ra, lblock, claim_seen, &s_note, &s_call);
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
  const ExchangeLane xl =
      kAlone ? ExchangeLane{} : exchange_lane<SlotLayout::kTokenMajor>(a, ra, bank, lane, peer_ws);
  const int token_words = slot_token_words<SlotLayout::kTokenMajor>(a);

  // The fp8 scales are read once, after griddepcontrol.wait (a graph may update them between
  // replays).
  const float q_scale = std::is_same_v<QOut, __nv_fp8_e4m3> ? *er.q_scale : 1.f;
  const float k_scale = std::is_same_v<CacheT, __nv_fp8_e4m3> ? *er.k_scale : 1.f;
  const float v_scale = std::is_same_v<CacheT, __nv_fp8_e4m3> ? *er.v_scale : 1.f;

  int poison_from = entry == kEntryRun ? ntok : first;
  const int last = entry == kEntryRun ? iterations : 0;
  int cur = 0;
  for (int it = 0; it < last; ++it) {
    const int t = first + it * step;
    // Stage cur holds token t once this thread's copies are in (at most ahead - 1 younger groups
    // pending) and, after the barrier, everyone's; the barrier also means every thread is done
    // with the previous token's stage, which the next copies refill.
    cp_async_wait_pending(ahead - 1);
    __syncthreads();
    issue(cur == 0 ? S - 1 : cur - 1);
    const T* row = stage_row(cur);
    const int64_t pos = stage_meta(cur)[0];
    const int64_t slot = stage_meta(cur)[1];
    const bool bad_pos = pos < 0 || pos >= a.max_position;
    const bool bad_slot = slot < -1 || slot >= a.cache_slots;
    const bool write_cache = !bad_pos && !bad_slot && slot >= 0;
    const int par = it & 1;

    // Phase A: sums of squares of the Q and K units (per head, or per row and partial).
    float sq = 0.f, sk = 0.f;
    if (headwise) {
      // Each head's sum in a fixed order (same bits on every launch shape): first this thread's
      // units into the head array, unit by unit (a head's units may span threads), then
      // one thread per head adds them up.
      for (int h = tid; h < a.q_heads + a.kv_heads; h += G) {
        float s = 0.f;
        const T* x = row + h * hd;
        for (int d = 0; d < hd; d += VEC) {
          float f[VEC];
          load_floats<T, VEC>(x + d, f);
#pragma unroll
          for (int e = 0; e < VEC; ++e) s = fmaf(f[e], f[e], s);
        }
        const float inv = 1.f / static_cast<float>(hd);
        s_head[h] = rsqrtf(s * inv + a.eps);
      }
      __syncthreads();
    } else {
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
      __syncthreads();
    }

    // Phase B (layerwise with peers): warp 0 publishes the rank's partials, then every thread
    // writes the token's V into the cache (it does not depend on the exchange), then warp 0
    // collects.
    float2 rs = make_float2(0.f, 0.f);
    auto block_partials = [&] {
      float2 p = make_float2(0.f, 0.f);
      for (int w = 0; w < warps; ++w) {  // the same order in every thread: the same bits
        p.x += s_part[par][w].x;
        p.y += s_part[par][w].y;
      }
      return p;
    };
    if (!headwise && !kAlone && warp == 0) {
      const float2 p = block_partials();
      publish_partials(xl, token_words, t, tag, ktag, p.x, p.y);
    }
    if (write_cache) {
      const int64_t b = slot / a.block_size, o = slot - b * a.block_size;
      CacheT* vc = static_cast<CacheT*>(er.v_cache) + b * a.block_stride + o * a.slot_stride;
      for (int u = qk_units + tid; u < units; u += G) {
        const int e = u * VEC - qw - kw;
        const int h = e / hd, d = e - h * hd;
        float f[VEC];
        load_floats<T, VEC>(row + u * VEC, f);
        store_floats<CacheT, VEC>(vc + h * a.head_stride + d, f, v_scale);
      }
    }
    if (!headwise) {
      if constexpr (kAlone) {
        const float2 p = block_partials();
        rs = make_float2(inv_rms(p.x, a.q_inv_full, a.eps), inv_rms(p.y, a.k_inv_full, a.eps));
      } else {
        if (warp == 0) {
          float q = 0.f, k = 0.f;
          const bool ok = collect_partials(a, ra, xl, token_words, world_pow2, t, tag, ktag, q, k, true, lane,
                                32, &s_note);
          if (lane == 0) {
            s_abort = ok ? 0 : 1;
            s_rstd = make_float2(inv_rms(q, a.q_inv_full, a.eps), inv_rms(k, a.k_inv_full, a.eps));
          }
        }
        __syncthreads();
        rs = s_rstd;
        if (s_abort != 0) {
          poison_from = t;
          break;
        }
      }
    }

    // Phase C: norm, rotation, stores.
    if (bad_pos || bad_slot) {
      if (tid == 0) {
        record_bad_data(ra, bad_pos ? kFailBadPosition : kFailBadSlot, a.first_token + t,
                        bad_pos ? pos : slot, bad_pos ? a.max_position : a.cache_slots);
      }
      poison_token<T, QOut>(a, er, t);
    } else {
      const uint8_t* cs = reinterpret_cast<const uint8_t*>(row) + L.row_bytes;
      auto cos_sin_at = [&](int i, float& c, float& s) {
        if (a.cs_f32) {
          c = reinterpret_cast<const float*>(cs)[i];
          s = reinterpret_cast<const float*>(cs)[half + i];
        } else {
          c = to_float(reinterpret_cast<const T*>(cs)[i]);
          s = to_float(reinterpret_cast<const T*>(cs)[half + i]);
        }
      };
      const int64_t b = write_cache ? slot / a.block_size : 0;
      const int64_t o = write_cache ? slot - b * a.block_size : 0;
      CacheT* kc = static_cast<CacheT*>(er.k_cache) + b * a.block_stride + o * a.slot_stride;
      QOut* qo = static_cast<QOut*>(ra.q_out) + static_cast<int64_t>(t) * ra.q_out_stride;
      T* ko = ra.k_out == nullptr
                  ? nullptr
                  : static_cast<T*>(ra.k_out) + static_cast<int64_t>(t) * ra.k_out_stride;
      for (int u = tid; u < qk_units; u += G) {
        const int e0 = u * VEC;
        const bool is_q = e0 < qw;
        const int re = is_q ? e0 : e0 - qw;  // offset in the Q or K row
        const int h = re / hd, d0 = re - h * hd;
        const float r = headwise ? s_head[is_q ? h : a.q_heads + h] : (is_q ? rs.x : rs.y);
        const T* wbase = headwise ? s_weight + (is_q ? 0 : hd) : s_weight + (is_q ? 0 : qw);
        const int wi = headwise ? d0 : re;  // this unit's weights in wbase
        float x[VEC], w[VEC], y[VEC];
        load_floats<T, VEC>(row + e0, x);
        load_floats<T, VEC>(wbase + wi, w);
        if (a.weight_plus_one) {
#pragma unroll
          for (int e = 0; e < VEC; ++e) w[e] += 1.f;
        }
#pragma unroll
        for (int e = 0; e < VEC; ++e) y[e] = pre_rotation<T>(x[e], w[e], r, olmo2);
        if (d0 < rot) {
          // The partner of element d0 + e: NeoX d0 + e +- rot/2 (the whole vector, as rot/2 is a
          // multiple of VEC), GPT-J d0 + e xor 1 (inside the vector, or the next element).
          float xp[VEC], wp[VEC];
          const bool low = d0 < half;
          if (neox) {
            const int pd = low ? half : -half;
            load_floats<T, VEC>(row + e0 + pd, xp);
            load_floats<T, VEC>(wbase + wi + pd, wp);
          } else if constexpr (VEC > 1) {
#pragma unroll
            for (int e = 0; e < VEC; ++e) {
              xp[e] = x[e ^ 1];
              wp[e] = w[e ^ 1];
            }
          } else {
            const int pd = (d0 & 1) ? -1 : 1;
            xp[0] = to_float(row[e0 + pd]);
            wp[0] = to_float(wbase[wi + pd]);
          }
          if (a.weight_plus_one) {
#pragma unroll
            for (int e = 0; e < VEC; ++e) wp[e] += 1.f;
          }
#pragma unroll
          for (int e = 0; e < VEC; ++e) {
            const int d = d0 + e;
            const int i = neox ? (low ? d : d - half) : d >> 1;
            const bool first_of_pair = neox ? low : (d & 1) == 0;
            float c, s;
            cos_sin_at(i, c, s);
            const float pv = pre_rotation<T>(xp[e], wp[e], r, olmo2);
            y[e] = first_of_pair ? y[e] * c - pv * s : y[e] * c + pv * s;
          }
        }
        if (olmo2) {
#pragma unroll
          for (int e = 0; e < VEC; ++e) y[e] *= r;  // the scale last: rope(r v) = r rope(v)
        }
        if (is_q) {
          store_floats<QOut, VEC>(qo + e0, y, q_scale);
        } else {
          if (write_cache) store_floats<CacheT, VEC>(kc + h * a.head_stride + d0, y, k_scale);
          if (ko != nullptr) store_floats<T, VEC>(ko + re, y, 1.f);
        }
      }
    }
    cur = cur + 1 == S ? 0 : cur + 1;
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
