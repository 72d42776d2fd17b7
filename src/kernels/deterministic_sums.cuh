// The deterministic (TP-invariant) mode's sums of squares: one thread's part of the canonical
// reduction order (docs/design.md, "Deterministic mode").
#pragma once

#include "kernels/device_types.cuh"
#include "kernels/norm_vectors.cuh"

namespace swiftqk::detail {

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

}  // namespace swiftqk::detail
