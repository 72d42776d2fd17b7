// The benchmark's shape-fuzz mode (--fuzz-shapes N --seed S): random Q and K widths, dtypes,
// norm orders, TP degrees and token counts, each point run at its TP degree and at TP 1 on the
// same problem, so that its TP cost and its TP-1 bandwidth can both be ranked.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "swiftqk/types.hpp"

namespace swiftqk::bench {

struct FuzzPoint {
  int64_t q_width = 0, k_width = 0;  ///< full widths, multiples of 8 x tp, 256..16384 each
  DType dtype = DType::kBF16;
  NormOrder order = NormOrder::kOlmo2;
  int tp = 1;          ///< 2, 4 or 8 (each point also runs at TP 1)
  int64_t tokens = 1;  ///< log-uniform in 1..20000
};

/// n points drawn from `seed` (the same list for the same n and seed, on any machine).
std::vector<FuzzPoint> fuzz_points(int n, uint64_t seed);

/// The token counts of the fuzz points to run (--fuzz-tokens LO:HI, inclusive; all by default).
struct TokenRange {
  int64_t lo = 1, hi = INT64_MAX;
  bool holds(int64_t tokens) const { return tokens >= lo && tokens <= hi; }
};

/// One line describing p: "q 1536 k 256 bf16 olmo2 tp 8 tokens 333".
std::string describe(const FuzzPoint& p);

}  // namespace swiftqk::bench
