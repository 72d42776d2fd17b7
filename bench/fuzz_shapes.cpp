// fuzz_points: a portable generator (splitmix64 and integer arithmetic only), so a seed names
// the same shapes wherever it runs.
#include "fuzz_shapes.hpp"

#include <cmath>
#include <sstream>

namespace swiftqk::bench {

namespace {

struct SplitMix {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  int64_t in(int64_t lo, int64_t hi) {  // [lo, hi]
    return lo + static_cast<int64_t>(next() % static_cast<uint64_t>(hi - lo + 1));
  }
};

constexpr int64_t kMinWidth = 256, kMaxWidth = 16384, kMaxTokens = 20000;

}  // namespace

std::vector<FuzzPoint> fuzz_points(int n, uint64_t seed) {
  SplitMix r{seed};
  const DType dtypes[] = {DType::kBF16, DType::kF16, DType::kF32, DType::kF8E4M3};
  std::vector<FuzzPoint> out;
  for (int i = 0; i < n; ++i) {
    FuzzPoint p;
    p.tp = 1 << r.in(1, 3);
    const int64_t unit = 8 * p.tp;  // a whole number of 16-byte vectors of fp16 per rank
    p.q_width = unit * r.in((kMinWidth + unit - 1) / unit, kMaxWidth / unit);
    p.k_width = unit * r.in((kMinWidth + unit - 1) / unit, kMaxWidth / unit);
    p.dtype = dtypes[r.in(0, 3)];
    p.order = r.in(0, 1) == 0 ? NormOrder::kOlmo2 : NormOrder::kLlama;
    // Log-uniform: as many points at 1-100 tokens as at 100-10000.
    const double u = static_cast<double>(r.next() >> 11) / static_cast<double>(1ull << 53);
    p.tokens = std::min<int64_t>(
        kMaxTokens, std::max<int64_t>(1, std::llround(std::exp(u * std::log(kMaxTokens)))));
    out.push_back(p);
  }
  return out;
}

std::string describe(const FuzzPoint& p) {
  std::ostringstream s;
  s << "q " << p.q_width << " k " << p.k_width << " " << to_string(p.dtype) << " "
    << to_string(p.order) << " tp " << p.tp << " tokens " << p.tokens;
  return s.str();
}

}  // namespace swiftqk::bench
