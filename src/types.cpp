// Names for DType and NormOrder, used by the CLI, benchmarks and error messages.
#include "swiftqk/types.hpp"

#include <algorithm>
#include <cctype>

#include "swiftqk/error.hpp"

namespace swiftqk {
namespace {

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

}  // namespace

std::string to_string(DType t) {
  switch (t) {
    case DType::kF32:
      return "f32";
    case DType::kF16:
      return "f16";
    case DType::kBF16:
      return "bf16";
    case DType::kF8E4M3:
      return "f8e4m3";
  }
  SWIFTQK_FAIL("invalid DType value " + std::to_string(static_cast<int>(t)));
}

std::string to_string(NormOrder o) {
  switch (o) {
    case NormOrder::kOlmo2:
      return "olmo2";
    case NormOrder::kLlama:
      return "llama";
  }
  SWIFTQK_FAIL("invalid NormOrder value " + std::to_string(static_cast<int>(o)));
}

std::string to_string(Method m) {
  switch (m) {
    case Method::kSwiftQK:
      return "swiftqk";
    case Method::kMiniMaxFused:
      return "minimax_fused";
    case Method::kAllGather:
      return "all_gather";
    case Method::kCommOverlap:
      return "comm_overlap";
    case Method::kMiniMaxEager:
      return "minimax_eager";
  }
  SWIFTQK_FAIL("invalid Method value " + std::to_string(static_cast<int>(m)));
}

Method parse_method(const std::string& name) {
  const std::string n = lower(name);
  if (n == "swiftqk") return Method::kSwiftQK;
  if (n == "minimax_fused" || n == "minimax-fused") return Method::kMiniMaxFused;
  if (n == "all_gather" || n == "all-gather" || n == "allgather") return Method::kAllGather;
  if (n == "comm_overlap" || n == "comm-overlap" || n == "overlap") return Method::kCommOverlap;
  if (n == "minimax_eager" || n == "minimax-eager") return Method::kMiniMaxEager;
  SWIFTQK_FAIL("unknown method '" + name +
               "'; accepted: swiftqk, minimax_fused, all_gather, comm_overlap, minimax_eager");
}

DType parse_dtype(const std::string& name) {
  const std::string n = lower(name);
  if (n == "f32" || n == "fp32" || n == "float32" || n == "float") return DType::kF32;
  if (n == "f16" || n == "fp16" || n == "float16" || n == "half") return DType::kF16;
  if (n == "bf16" || n == "bfloat16") return DType::kBF16;
  if (n == "fp8" || n == "f8e4m3" || n == "e4m3" || n == "fp8_e4m3") return DType::kF8E4M3;
  SWIFTQK_FAIL("unknown dtype '" + name +
               "'; accepted: f32|fp32|float32|float, f16|fp16|float16|half, bf16|bfloat16, "
               "fp8|f8e4m3|e4m3|fp8_e4m3");
}

NormOrder parse_norm_order(const std::string& name) {
  const std::string n = lower(name);
  if (n == "olmo2") return NormOrder::kOlmo2;
  if (n == "llama") return NormOrder::kLlama;
  SWIFTQK_FAIL("unknown norm order '" + name + "'; accepted: olmo2, llama");
}

}  // namespace swiftqk
