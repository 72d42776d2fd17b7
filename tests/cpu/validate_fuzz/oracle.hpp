// The validator fuzz test's oracle: an independent, brute-force account of which rules a case
// breaks. It marks every byte each tensor touches in a byte map and decides overlap by exact
// byte intersection, plus the one documented conservative rule of validate.cpp; and it models
// vector_bytes_for's 16-byte vector rules.
#pragma once

#include <bitset>
#include <cstdint>
#include <string>
#include <vector>

#include "cases.hpp"

namespace swiftqk::validate_fuzz {

enum Rule : int {
  kWorld,
  kTokens,
  kEps,
  kOrder,
  kMethod,
  kDType,
  kQFullPositive,
  kQFullDivisible,
  kQWidth,
  kQInStride,
  kQOutStride,
  kQScalePositive,
  kQScaleOne,
  kKFullPositive,
  kKFullDivisible,
  kKWidth,
  kKInStride,
  kKOutStride,
  kKScalePositive,
  kKScaleOne,
  kNull,
  kMisaligned,
  kRstdMisaligned,
  kOutOverlapsOwnInput,    // partial in place
  kOutOverlapsOtherOut,    // q.out and k.out share a byte
  kOutOverlapsOtherInput,  // q.out / k.in or k.out / q.in
  kOutOverlapsWeight,
  kRstdOverlaps,
  kStridesDifferRangesMeet,  // the documented conservative rule (no byte shared), two [T, w]
  kStridesDifferVectorMeet,  // the same rule where one side is a weight or rstd_out
  kNumRules
};

// A rule's name, for reports.
extern const char* const kRuleNames[kNumRules];
// Text the error must contain when the oracle finds exactly this one problem.
extern const char* const kRuleNeedles[kNumRules];

using Verdict = std::bitset<kNumRules>;

// What one tensor touches: `rows` runs of `row_bytes` bytes, `stride_bytes` apart.
struct Region {
  int64_t off, rows, row_bytes, stride_bytes;
  int64_t lo() const { return off; }
  int64_t hi() const { return off + (rows - 1) * stride_bytes + row_bytes; }
};

// One bit per tensor per arena byte. Only the bytes a case marks are visited (and cleared).
class ByteMap {
 public:
  ByteMap() : bits_(kArenaBytes, 0) {}
  template <typename Fn>
  void ForEachByte(const Region& r, Fn&& fn) {
    for (int64_t row = 0; row < r.rows; ++row) {
      const int64_t start = r.off + row * r.stride_bytes;
      for (int64_t b = 0; b < r.row_bytes; ++b) fn(bits_[start + b]);
    }
  }
  void Mark(const Region& r, uint8_t bit) {
    ForEachByte(r, [bit](uint8_t& x) { x |= bit; });
  }
  // OR of the marks on the bytes r touches.
  uint8_t Seen(const Region& r) {
    uint8_t seen = 0;
    ForEachByte(r, [&seen](uint8_t& x) { seen |= x; });
    return seen;
  }
  void Clear(const Region& r) {
    ForEachByte(r, [](uint8_t& x) { x = 0; });
  }

 private:
  std::vector<uint8_t> bits_;
};

// The rules case c breaks; `map` is all clear before and after.
Verdict Oracle(const Case& c, ByteMap& map);

// vector_bytes_for's rules, modelled: 16 when every width and stride is a whole number of
// 16-byte input vectors, inputs are 16-byte aligned and outputs and weights are aligned to
// min(16, the bytes of one vector's worth of outputs); else 8, then (1- and 2-byte types) 4, by
// the same rules for 8- and 4-byte input vectors; else the input element size.
int ModelVectorBytes(const Case& c);

// The names of the rules in v, or "none".
std::string RuleList(const Verdict& v);

}  // namespace swiftqk::validate_fuzz
