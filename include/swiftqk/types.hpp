// Element types, norm orders and methods shared by the host API, the kernels and the reference.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace swiftqk {

/// @brief Element type of a tensor. fp8 (e4m3) is an input type only; its output is bf16.
enum class DType : int { kF32 = 0, kF16 = 1, kBF16 = 2, kF8E4M3 = 3 };

/// @brief Where the norm weight is applied and where the result is rounded.
enum class NormOrder : int {
  /// HF Olmo2RMSNorm: y = round(w * (x * rstd)), product in fp32, rounded once.
  kOlmo2 = 0,
  /// HF LlamaRMSNorm / vLLM / MixtralRMSNorm: y = round(w * round(x * rstd)).
  kLlama = 1,
};

/// @brief Size in bytes of one element of t.
constexpr std::size_t dtype_size(DType t) {
  return t == DType::kF32 ? 4 : (t == DType::kF8E4M3 ? 1 : 2);
}

/// @brief Output (and weight) type produced for input type t: fp8 input gives bf16 output.
constexpr DType output_dtype_for(DType in) { return in == DType::kF8E4M3 ? DType::kBF16 : in; }

/// @brief How the (q, k) partial sums travel between ranks.
enum class Method : int {
  /// SwiftQK: slots tagged with the call (read, not cleared; scrub calls zero a bank twice per
  /// 2^28 calls), each token's collect deferred by log2(TP) tokens.
  kSwiftQK = 0,
  /// The MiniMax-fused design (vLLM minimax_allreduce_rms_qk, TRT-LLM MiniMaxReduceRMSKernel),
  /// on SwiftQK's data path: Lamport slots (data is its own flag, -0.0 = empty), three buffers
  /// rotated by a device counter, the previous call's buffer cleared, no deferral of the wait.
  kMiniMaxFused = 1,
  /// vLLM's OLMo2 path: ncclAllGather of the Q and K shards, a full-width RMSNorm, the local
  /// slice kept. Needs a communicator from from_nccl when TP > 1.
  kAllGather = 2,
  /// The all-gather overlapped with the normalisation: tokens in chunks, the next chunk's
  /// all-gathers on a side stream while the current chunk is normalised. Needs NCCL as above.
  kCommOverlap = 3,
  /// vLLM's MiniMax fallback: a kernel writes [T, 2] fp32 partial sums, one ncclAllReduce, a
  /// second kernel applies the scale. Needs NCCL as above.
  kMiniMaxEager = 4,
};

/// @brief True for the methods that move data with NCCL rather than the fused kernel.
constexpr bool uses_nccl(Method m) {
  return m == Method::kAllGather || m == Method::kCommOverlap || m == Method::kMiniMaxEager;
}

std::string to_string(DType t);
std::string to_string(Method m);
/// @brief Parses "swiftqk", "minimax_fused", "all_gather", "comm_overlap" or "minimax_eager".
Method parse_method(const std::string& name);
std::string to_string(NormOrder o);
/// @brief Parses "f32|fp32|float32", "f16|fp16|float16", "bf16|bfloat16", "fp8|f8e4m3|e4m3".
DType parse_dtype(const std::string& name);
/// @brief Parses "olmo2" or "llama".
NormOrder parse_norm_order(const std::string& name);

}  // namespace swiftqk
