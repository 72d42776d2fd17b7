// The instantiation table of swiftqk_fused_kernel for one input dtype (included by
// kernel_table_<dtype>.cu only).
#pragma once

#include <type_traits>

#include "kernel_table.hpp"
#include "kernels/swiftqk_fused.cuh"

namespace swiftqk::detail {

template <typename Tin, int VEC, int VPT, bool kLamport, bool kAlone, SlotLayout kSlots,
          BlockOrder kBlocks, int kDetLanes = 0>
KernelFn pick_norm_order(NormOrder o) {
  return o == NormOrder::kOlmo2 ? swiftqk_fused_kernel<Tin, VEC, VPT, true, kLamport, kAlone,
                                                       kSlots, kBlocks, kDetLanes>
                                : swiftqk_fused_kernel<Tin, VEC, VPT, false, kLamport, kAlone,
                                                       kSlots, kBlocks, kDetLanes>;
}

// The deterministic mode's kernels: a thread holds 1 to 8 canonical lanes, at most one a slot
// (a streamed row one), and its slots hold both Q and K, so staged rows take 2 or more.
template <typename Tin, int VEC, int VPT, int kDetLanes>
KernelFn pick_det(const KernelKey& k) {
  if constexpr (VPT == 1 || (VPT == 0 ? kDetLanes != 1 : kDetLanes > VPT)) {
    return nullptr;
  } else {
    constexpr SlotLayout kTM = SlotLayout::kTokenMajor;
    constexpr BlockOrder kRM = BlockOrder::kRankMajor, kIL = BlockOrder::kInterleaved;
    if (k.alone) return pick_norm_order<Tin, VEC, VPT, false, true, kTM, kRM, kDetLanes>(k.order);
    return k.blocks == kIL
               ? pick_norm_order<Tin, VEC, VPT, false, false, kTM, kIL, kDetLanes>(k.order)
               : pick_norm_order<Tin, VEC, VPT, false, false, kTM, kRM, kDetLanes>(k.order);
  }
}

template <typename Tin, int VEC, int VPT, bool kLamport, SlotLayout kSlots>
KernelFn pick_block_order(const KernelKey& k) {
  return k.blocks == BlockOrder::kInterleaved
             ? pick_norm_order<Tin, VEC, VPT, kLamport, false, kSlots, BlockOrder::kInterleaved>(
                   k.order)
             : pick_norm_order<Tin, VEC, VPT, kLamport, false, kSlots, BlockOrder::kRankMajor>(
                   k.order);
}

// Alone (a group of one rank) both methods take the exchange-free instantiation, whose one rank
// makes both block orders the same. With peers, only the SwiftQK exchange has source-major slots;
// both methods have both block orders (so a virtual-rank comparison of the two is like for like).
// The orders are template parameters, so the default ones carry no runtime choice.
template <typename Tin, int VEC, int VPT>
KernelFn pick_method(const KernelKey& k) {
  constexpr SlotLayout kTM = SlotLayout::kTokenMajor;
  // The deterministic mode exists for the SwiftQK exchange on the vector path, in token-major
  // slots and both block orders (the host rejects or replaces every other choice).
  if (k.deterministic) {
    if constexpr (VEC == 1) {
      return nullptr;
    } else {
      if (k.method != Method::kSwiftQK) return nullptr;
      switch (k.det_lanes) {
        case 1:
          return pick_det<Tin, VEC, VPT, 1>(k);
        case 2:
          return pick_det<Tin, VEC, VPT, 2>(k);
        case 4:
          return pick_det<Tin, VEC, VPT, 4>(k);
        case 8:
          return pick_det<Tin, VEC, VPT, 8>(k);
        default:
          return nullptr;
      }
    }
  }
  if (k.alone) {
    return k.method == Method::kMiniMaxFused
               ? pick_norm_order<Tin, VEC, VPT, true, true, kTM, BlockOrder::kRankMajor>(k.order)
               : pick_norm_order<Tin, VEC, VPT, false, true, kTM, BlockOrder::kRankMajor>(k.order);
  }
  if (k.method == Method::kMiniMaxFused) return pick_block_order<Tin, VEC, VPT, true, kTM>(k);
  return k.slots == SlotLayout::kSourceMajor
             ? pick_block_order<Tin, VEC, VPT, false, SlotLayout::kSourceMajor>(k)
             : pick_block_order<Tin, VEC, VPT, false, kTM>(k);
}

// Rows of 8- and 4-byte vectors (widths or pointers that 16-byte ones do not divide) exist for
// the SwiftQK exchange in the default mode: the deterministic mode's canonical order is defined
// on 16-byte vectors, and the MiniMax-fused baseline keeps its 16-byte and scalar paths.
template <typename Tin, int VEC, int VPT>
KernelFn pick_method_narrow(const KernelKey& k) {
  if (k.deterministic || k.method != Method::kSwiftQK) return nullptr;
  constexpr SlotLayout kTM = SlotLayout::kTokenMajor;
  if (k.alone)
    return pick_norm_order<Tin, VEC, VPT, false, true, kTM, BlockOrder::kRankMajor>(k.order);
  return k.slots == SlotLayout::kSourceMajor
             ? pick_block_order<Tin, VEC, VPT, false, SlotLayout::kSourceMajor>(k)
             : pick_block_order<Tin, VEC, VPT, false, kTM>(k);
}

template <typename Tin, int kVecBytes>
KernelFn pick_vpt(const KernelKey& k) {
  constexpr int kVec = kVecBytes / sizeof(Tin);
  static_assert(kVec >= 2, "a vector holds two elements or more (one is the scalar path)");
  auto of = [&k](auto vpt) {
    constexpr int kVpt = decltype(vpt)::value;
    if constexpr (kVecBytes < 16) {
      return pick_method_narrow<Tin, kVec, kVpt>(k);
    } else {
      return pick_method<Tin, kVec, kVpt>(k);
    }
  };
  switch (k.vpt) {
    case 1:
      return of(std::integral_constant<int, 1>{});
    case 2:
      return of(std::integral_constant<int, 2>{});
    case 4:
      return of(std::integral_constant<int, 4>{});
    case 8:
      return of(std::integral_constant<int, 8>{});
    default:
      return of(std::integral_constant<int, 0>{});
  }
}

template <typename Tin>
KernelFn pick_vec(const KernelKey& k) {
  switch (k.vec_bytes) {
    case 16:
      return pick_vpt<Tin, 16>(k);
    case 8:
      return pick_vpt<Tin, 8>(k);
    case 4:
      // 4-byte vectors hold two or four elements of 16-bit or fp8 rows; f32 has none.
      if constexpr (sizeof(Tin) <= 2) {
        return pick_vpt<Tin, 4>(k);
      } else {
        return nullptr;
      }
    default:
      return pick_method<Tin, 1, 0>(k);  // the scalar path always streams
  }
}

}  // namespace swiftqk::detail
