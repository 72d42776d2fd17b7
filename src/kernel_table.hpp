// Which fused kernel a launch runs. The instantiations are spread over one translation unit per
// input dtype (kernel_table_<dtype>.cu), so a build compiles them in parallel.
#pragma once

#include "kernels/launch_args.hpp"
#include "protocol.hpp"
#include "swiftqk/types.hpp"

namespace swiftqk::detail {

using KernelFn = void (*)(LaunchArgs);

/// Everything that selects an instantiation of swiftqk_fused_kernel besides the dtype.
struct KernelKey {
  int vec_bytes = 16;  // 16-, 8- or 4-byte vectors; else (1) the scalar path, always streamed
  int vpt = 0;         // vectors a thread stages (0: streamed)
  Method method = Method::kSwiftQK;
  NormOrder order = NormOrder::kOlmo2;
  bool alone = false;  // a group of one rank: no exchange
  SlotLayout slots = SlotLayout::kTokenMajor;
  BlockOrder blocks = BlockOrder::kRankMajor;
  bool deterministic = false;  // the canonical reduction order (QkNormParams::deterministic)
  int det_lanes = 0;           // deterministic mode: canonical lanes a thread holds (KernelShape)
};

KernelFn pick_kernel_f32(const KernelKey& k);
KernelFn pick_kernel_f16(const KernelKey& k);
KernelFn pick_kernel_bf16(const KernelKey& k);
KernelFn pick_kernel_fp8(const KernelKey& k);

inline KernelFn pick_kernel(DType t, const KernelKey& k) {
  switch (t) {
    case DType::kF32:
      return pick_kernel_f32(k);
    case DType::kF16:
      return pick_kernel_f16(k);
    case DType::kBF16:
      return pick_kernel_bf16(k);
    case DType::kF8E4M3:
      return pick_kernel_fp8(k);
  }
  return nullptr;
}

}  // namespace swiftqk::detail
