// A tensor's element type as SwiftQK's DType, for both ops' bindings; anything else is refused
// with the op's own message (which its fake kernel in Python repeats word for word).
#pragma once

#include <ATen/ATen.h>

#include "swiftqk/types.hpp"

namespace swiftqk_torch {

/// @brief t's DType; otherwise a RuntimeError "<op><name> has dtype <T>; expected <expected>".
inline swiftqk::DType dtype_of(const at::Tensor& t, const char* op, const char* name,
                               const char* expected) {
  switch (t.scalar_type()) {
    case at::kFloat:
      return swiftqk::DType::kF32;
    case at::kHalf:
      return swiftqk::DType::kF16;
    case at::kBFloat16:
      return swiftqk::DType::kBF16;
    case at::kFloat8_e4m3fn:
      return swiftqk::DType::kF8E4M3;
    default:
      TORCH_CHECK(false, op, name, " has dtype ", t.scalar_type(), "; expected ", expected);
  }
}

}  // namespace swiftqk_torch
