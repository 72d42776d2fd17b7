// The host arena the validator fuzz test and its regressions lay their tensors over, and a case
// made into QkNormParams pointing into it. Validation never dereferences the pointers.
#pragma once

#include <cstdint>
#include <vector>

#include "cases.hpp"
#include "swiftqk/qk_norm_params.hpp"

namespace swiftqk::validate_fuzz {

class Arena {
 public:
  Arena() : bytes_(kArenaBytes + 256) {
    const uintptr_t raw = reinterpret_cast<uintptr_t>(bytes_.data());
    base_ = bytes_.data() + ((256 - raw % 256) % 256);  // 256-byte aligned, still in the arena
  }
  void* At(const Ptr& p) { return p.null ? nullptr : base_ + p.off; }

 private:
  std::vector<uint8_t> bytes_;
  uint8_t* base_ = nullptr;
};

QkNormParams Materialize(const Case& c, Arena& arena);

}  // namespace swiftqk::validate_fuzz
