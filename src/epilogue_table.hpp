// Which fused QK epilogue kernel a launch runs: one translation unit per model dtype
// (epilogue_table_<dtype>.cu), compiled in parallel.
#pragma once

#include "kernels/epilogue_args.hpp"
#include "swiftqk/types.hpp"

namespace swiftqk::detail {

using EpilogueFn = void (*)(EpilogueArgs);

/// Everything that selects an instantiation of qk_epilogue_kernel besides the model dtype.
struct EpilogueKey {
  bool q_fp8 = false;           // q_out is fp8 e4m3
  bool cache_fp8 = false;       // the KV cache is fp8 e4m3
  bool vector = true;           // 16-byte accesses; else element by element
  bool alone = false;           // no exchange (TP 1 layerwise, or headwise)
  bool olmo2 = true;            // NormOrder::kOlmo2, else kLlama
  bool det = false;             // the deterministic mode's canonical sums (layerwise)
  bool split = false;           // blocks share a token (alone, vector path, not det)
  bool weights_global = false;  // with peers, not det: the norm weights read from global memory
};

EpilogueFn pick_epilogue_kernel_bf16(const EpilogueKey& k);
EpilogueFn pick_epilogue_kernel_f16(const EpilogueKey& k);

inline EpilogueFn pick_epilogue_kernel(DType t, const EpilogueKey& k) {
  if (t == DType::kBF16) return pick_epilogue_kernel_bf16(k);
  if (t == DType::kF16) return pick_epilogue_kernel_f16(k);
  return nullptr;
}

}  // namespace swiftqk::detail
