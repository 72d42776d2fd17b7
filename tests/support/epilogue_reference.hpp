// Host-only reference of the fused QK epilogue (include/swiftqk/qk_epilogue_params.hpp): QK-norm
// then RoPE, in float64 (the gold) and with the kernel's documented rounding points emulated,
// plus the fp8 quantisation of what goes to q_out or the cache and the column shards of a rank.
#pragma once

#include <cstdint>
#include <vector>

#include "swiftqk/qk_epilogue_params.hpp"
#include "swiftqk/types.hpp"

namespace swiftqk {
namespace ref {

/// @brief The full (unsharded, TP 1) problem on the host, every value as a double.
struct EpilogueProblem {
  int64_t tokens = 0, q_heads = 0, kv_heads = 0, head_dim = 0;
  std::vector<double> q, k, v;  ///< [tokens, heads * head_dim] row-major, dense
  /// Layerwise: [q_heads * head_dim] and [kv_heads * head_dim]; headwise: [head_dim] each.
  std::vector<double> q_weight, k_weight;
  bool weight_plus_one = false;  ///< headwise only: the weight is 1 + w
  NormScope scope = NormScope::kLayerwise;
  NormOrder order = NormOrder::kOlmo2;
  double eps = 1e-6;
  DType dtype = DType::kBF16;   ///< the model dtype: bf16 or f16
  std::vector<double> cos_sin;  ///< [max_position, rotary_dim]: the cos half, then the sin half
  int64_t max_position = 0, rotary_dim = 0;
  RopeStyle style = RopeStyle::kNeox;
  std::vector<int64_t> positions;  ///< [tokens]
};

/// @brief Normalised then rotated Q and K, [tokens, heads * head_dim]. A token whose position is
/// outside [0, max_position) holds NaN in both: the kernel writes NaN to its Q output row and
/// nothing of its K (k_out, cache) or V, so its K row has no expected value.
struct EpilogueExpected {
  std::vector<double> q, k;
};

/// @brief The gold: y = w * x / sqrt(mean(x^2) + eps) (w -> 1 + w with weight_plus_one), the
/// mean over the whole row (layerwise) or each head (headwise), then each head rotated, all in
/// float64 with no rounding. Throws on inconsistent shapes.
EpilogueExpected epilogue_fp64(const EpilogueProblem& p);

/// @brief What a correct kernel writes, the rounding points of the header emulated in fp32:
///   - x and w as floats (1 + w formed in fp32); the sum of squares of the float x in double,
///     then rs = 1.0f / sqrtf(float(sum) / float(width) + float(eps));
///   - Olmo2: u = x * w (fp32), rotated in fp32 (a * c - b * s, b * c + a * s, no fused
///     multiply-add) with float cos and sin, out = round(rs * r) (unrotated: round(rs * u));
///   - Llama: y = round(round(x * rs) * w), rotated in fp32 as above, out = round(r);
///   round = to the model dtype (RNE). A kernel that sums its squares in another order or fuses
///   multiply-adds may differ by one rounding flip of the model dtype.
EpilogueExpected epilogue_emulated(const EpilogueProblem& p);

/// @brief The fp8 (e4m3, saturating at +-448) value stored for each x / scale, as a double: what
/// a correct kernel stores into an fp8 q_out or cache for the value x (NaN stays NaN).
std::vector<double> quantize_e4m3(const std::vector<double>& x, double scale);

/// @brief Bound on |stored - gold| for an fp8 value, gold the exact value to be stored (x / scale
/// in float64): one e4m3 ulp at |gold|, plus |gold| - 448 beyond the saturation point.
double e4m3_tolerance(double gold);

/// @brief Columns [rank * width / world, (rank + 1) * width / world) of each row of full
/// [tokens, width]: rank's shard under a column (head-aligned when width / world is a multiple of
/// head_dim) split. Throws unless width % world == 0 and 0 <= rank < world.
std::vector<double> column_shard(const std::vector<double>& full, int64_t tokens, int64_t width,
                                 int world, int rank);

}  // namespace ref
}  // namespace swiftqk
