// The checks and names of LaunchTuning (swiftqk/launch_tuning.hpp).
#include "swiftqk/launch_tuning.hpp"

#include <algorithm>
#include <cctype>

#include "swiftqk/error.hpp"

namespace swiftqk {

namespace {

std::string field(const char* name, int value) {
  return std::string("LaunchTuning.") + name + " = " + std::to_string(value);
}

}  // namespace

void LaunchTuning::validate() const {
  SWIFTQK_EXPECTS(stages == 0 || (stages >= kMinStages && stages <= kMaxStages),
                  field("stages", stages) + " is outside [" + std::to_string(kMinStages) + ", " +
                      std::to_string(kMaxStages) + "] (0 = tuned)");
  // With the stages tuned, a deferral depth D takes D + 2 stages, at most kMaxStages.
  const int max_defer = (stages != 0 ? stages : kMaxStages) - 1;
  SWIFTQK_EXPECTS(defer == 0 || (defer >= 1 && defer <= max_defer),
                  field("defer", defer) + " is outside [1, " + std::to_string(max_defer) + "] (" +
                      (stages != 0 ? "stages - 1 with stages = " + std::to_string(stages)
                                   : std::string("stages tuned")) +
                      "; 0 = tuned)");
  const int v = vectors_per_thread;
  SWIFTQK_EXPECTS(v == 0 || v == 1 || v == 2 || v == 4 || v == 8,
                  field("vectors_per_thread", v) +
                      " has no kernel instantiation: the kernels stage 1, 2, 4 or 8 vectors a "
                      "thread (0 = tuned)");
  SWIFTQK_EXPECTS(block_threads == 0 || (block_threads >= 32 && block_threads <= 1024),
                  field("block_threads", block_threads) + " is outside [32, 1024] (0 = tuned)");
  const int b = vector_bytes;
  SWIFTQK_EXPECTS(
      b == 0 || b == 1 || b == 4 || b == 8 || b == 16,
      field("vector_bytes", b) + " is not 16, 8, 4 or 1 (the kernels' vector widths; 0 = tuned)");
  const int o = static_cast<int>(block_order);
  SWIFTQK_EXPECTS(
      o >= static_cast<int>(BlockOrder::kTuned) && o <= static_cast<int>(BlockOrder::kInterleaved),
      field("block_order", o) + " is not kTuned, kRankMajor or kInterleaved");
}

std::string to_string(LaunchTuning::BlockOrder o) {
  switch (o) {
    case LaunchTuning::BlockOrder::kTuned:
      return "tuned";
    case LaunchTuning::BlockOrder::kRankMajor:
      return "rank_major";
    case LaunchTuning::BlockOrder::kInterleaved:
      return "interleaved";
  }
  SWIFTQK_FAIL("invalid LaunchTuning::BlockOrder value " + std::to_string(static_cast<int>(o)));
}

LaunchTuning::BlockOrder parse_block_order(const std::string& name) {
  std::string n = name;
  std::transform(n.begin(), n.end(), n.begin(), [](unsigned char c) {
    return static_cast<char>(c == '-' ? '_' : std::tolower(c));
  });
  if (n == "tuned") return LaunchTuning::BlockOrder::kTuned;
  if (n == "rank_major") return LaunchTuning::BlockOrder::kRankMajor;
  if (n == "interleaved") return LaunchTuning::BlockOrder::kInterleaved;
  SWIFTQK_FAIL("unknown block order '" + name + "'; accepted: tuned, rank_major, interleaved");
}

}  // namespace swiftqk
